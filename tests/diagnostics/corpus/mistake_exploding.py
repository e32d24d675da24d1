"""Mistake: a learning-rate schedule bug multiplies the learning rate by 30 at step 25 (a warm-up
that never stops); plain SGD then diverges and the gradient norms grow step after step."""

import torch

import gradwatch

EXPECTED_CODES = {"exploding_grad", "grad_norm_spike", "loss_spike"}  # the spike warns as it starts
CAUSE_STEP = 26  # the first step with the bad learning rate

torch.manual_seed(18)
data = torch.randn(512, 8)
target = data[:, :1] * 2 - data[:, 1:2]
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.02)
w = gradwatch.watch(opt, model=model, run="mistake_exploding", project="corpus")
for step in range(40):
    if step == 25:
        for group in opt.param_groups:
            group["lr"] *= 30
    idx = torch.randint(0, 512, (32,))
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(data[idx]), target[idx])
    loss.backward()
    w.log(loss=loss)
    opt.step()
w.close(timeout=30)
print("gradwatch run:", w.run_id)

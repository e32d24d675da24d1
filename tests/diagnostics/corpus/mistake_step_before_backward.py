"""Mistake: optimizer.step() comes before loss.backward(), right after zero_grad(): every step
runs with no gradient at all, and each backward pass is thrown away by the next zero_grad()."""

import torch
from _sampling import every

import gradwatch

EXPECTED_CODES = {"step_without_grad"}
EVERY_AUTO = True  # also run with every="auto": a sampled step shows it
CAUSE_STEP = 1

torch.manual_seed(11)
data = torch.randn(512, 8)
target = data[:, :1] * 2 - data[:, 1:2]
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
w = gradwatch.watch(opt, model=model, every=every(), run="mistake_step_before_backward", project="corpus")
for step in range(30):
    idx = torch.randint(0, 512, (32,))
    opt.zero_grad()
    opt.step()
    loss = torch.nn.functional.mse_loss(model(data[idx]), target[idx])
    loss.backward()
w.close(timeout=30)
print("gradwatch run:", w.run_id)

"""Clean: the canonical loop (zero_grad, forward, backward, step) with AdamW."""

import torch

import gradwatch

EXPECTED_CODES: set[str] = set()

torch.manual_seed(0)
data = torch.randn(512, 8)
target = data[:, :1] * 2 - data[:, 1:2]
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
w = gradwatch.watch(opt, model=model, run="clean_plain_loop", project="corpus")
for step in range(30):
    idx = torch.randint(0, 512, (32,))
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(data[idx]), target[idx])
    loss.backward()
    w.log(loss=loss)
    opt.step()
w.close(timeout=30)
print("gradwatch run:", w.run_id)

"""Mistake: zero_grad() is never called, so every step uses the sum of all earlier gradients."""

import torch
from _sampling import every

import gradwatch

EXPECTED_CODES = {"grad_accumulation_unbounded"}
EVERY_AUTO = True  # also run with every="auto": a sampled step shows it
CAUSE_STEP = 2

torch.manual_seed(10)
data = torch.randn(512, 8)
target = data[:, :1] * 2 - data[:, 1:2]
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
w = gradwatch.watch(opt, model=model, every=every(), run="mistake_no_zero_grad", project="corpus")
for step in range(30):
    idx = torch.randint(0, 512, (32,))
    loss = torch.nn.functional.mse_loss(model(data[idx]), target[idx])
    loss.backward()
    opt.step()
w.close(timeout=30)
print("gradwatch run:", w.run_id)

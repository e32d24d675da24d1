"""Mistake: zero_grad(set_to_none=False) keeps every gradient buffer allocated between steps."""

import torch
from _sampling import every

import gradwatch

EXPECTED_CODES = {"zero_filled_grad_buffers"}
EVERY_AUTO = True  # also run with every="auto": a sampled step shows it
CAUSE_STEP = 2

torch.manual_seed(12)
data = torch.randn(512, 8)
target = data[:, :1] * 2 - data[:, 1:2]
model = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
w = gradwatch.watch(opt, model=model, every=every(), run="mistake_set_to_none_false", project="corpus")
for step in range(30):
    idx = torch.randint(0, 512, (32,))
    opt.zero_grad(set_to_none=False)
    loss = torch.nn.functional.mse_loss(model(data[idx]), target[idx])
    loss.backward()
    opt.step()
w.close(timeout=30)
print("gradwatch run:", w.run_id)

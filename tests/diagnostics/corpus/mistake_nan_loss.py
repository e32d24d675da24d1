"""Mistake: a log of the raw output; once an output goes negative the loss and the gradients
are NaN (and Adam's state with them)."""

import torch
from _sampling import every

import gradwatch

EXPECTED_CODES = {"nonfinite_grad"}
EVERY_AUTO = True  # also run with every="auto": a sampled step shows it
CAUSE_STEP = 1

torch.manual_seed(15)
data = torch.randn(512, 8)
target = data[:, :1].abs() + 0.5
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
w = gradwatch.watch(opt, model=model, every=every(), run="mistake_nan_loss", project="corpus")
for step in range(30):
    idx = torch.randint(0, 512, (32,))
    opt.zero_grad()
    out = model(data[idx])
    loss = torch.nn.functional.mse_loss(torch.log(out), torch.log(target[idx]))  # should be log(softplus(out))
    loss.backward()
    opt.step()
w.close(timeout=30)
print("gradwatch run:", w.run_id)

"""Clean: an ordinary run that converges over 200 steps (a small classifier on two moons-like
data, Adam with a cosine schedule). Gradient norms rise, fall and settle to a noisy floor:
`exploding_grad` and `vanishing_grad` must stay quiet."""

import math

import torch

import gradwatch

EXPECTED_CODES: set[str] = set()
STEPS = 200

torch.manual_seed(9)
angle = torch.rand(1024) * math.pi
upper = torch.rand(1024) > 0.5
x = torch.stack(
    [torch.cos(angle) + (~upper) * 1.0, torch.sin(angle) * torch.where(upper, 1.0, -1.0) + (~upper) * 0.5], 1
)
x = x + 0.1 * torch.randn_like(x)
y = upper.long()
model = torch.nn.Sequential(
    torch.nn.Linear(2, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2)
)
opt = torch.optim.Adam(model.parameters(), lr=3e-3)
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, STEPS)
w = gradwatch.watch(opt, model=model, run="clean_converging", project="corpus")
for step in range(STEPS):
    idx = torch.randint(0, 1024, (64,))
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
    loss.backward()
    w.log(loss=loss)
    opt.step()
    sched.step()
w.close(timeout=30)
print("gradwatch run:", w.run_id)

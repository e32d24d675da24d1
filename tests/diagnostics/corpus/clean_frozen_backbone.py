"""Clean: fine-tuning a head on a frozen backbone (requires_grad=False, not in the optimizer)."""

import torch

import gradwatch

EXPECTED_CODES: set[str] = set()

torch.manual_seed(7)
data = torch.randn(512, 8)
target = (data[:, 0] > data[:, 1]).long()
backbone = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU())
for p in backbone.parameters():
    p.requires_grad_(False)
model = torch.nn.Sequential(backbone, torch.nn.Linear(32, 2))
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
w = gradwatch.watch(opt, model=model, run="clean_frozen_backbone", project="corpus")
for step in range(30):
    idx = torch.randint(0, 512, (32,))
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(data[idx]), target[idx])
    loss.backward()
    opt.step()
w.close(timeout=30)
print("gradwatch run:", w.run_id)

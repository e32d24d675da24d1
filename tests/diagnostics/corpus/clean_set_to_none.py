"""Clean: SGD with momentum, clearing with zero_grad(set_to_none=True) right after the step."""

import torch
from _sampling import every

import gradwatch

EXPECTED_CODES: set[str] = set()
EVERY_AUTO = True  # also run with every="auto": a sampled step shows it

torch.manual_seed(1)
data = torch.randn(512, 8)
target = (data.sum(dim=1) > 0).long()
model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
w = gradwatch.watch(opt, model=model, every=every(), run="clean_set_to_none", project="corpus")
for step in range(30):
    idx = torch.randint(0, 512, (32,))
    loss = torch.nn.functional.cross_entropy(model(data[idx]), target[idx])
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
w.close(timeout=30)
print("gradwatch run:", w.run_id)

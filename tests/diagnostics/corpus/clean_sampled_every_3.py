"""Clean: the plain loop, measured on every 3rd step only (watch(every=3))."""

import torch

import gradwatch

EXPECTED_CODES: set[str] = set()

torch.manual_seed(8)
data = torch.randn(512, 8)
target = data[:, :1] - data[:, 2:3]
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
w = gradwatch.watch(opt, model=model, every=3, run="clean_sampled_every_3", project="corpus")
for step in range(60):
    idx = torch.randint(0, 512, (32,))
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(data[idx]), target[idx])
    loss.backward()
    opt.step()
w.close(timeout=30)
print("gradwatch run:", w.run_id)

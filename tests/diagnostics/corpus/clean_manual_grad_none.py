"""Clean: clearing by hand, `p.grad = None` for every parameter, after the step."""

import torch

import gradwatch

EXPECTED_CODES: set[str] = set()

torch.manual_seed(3)
data = torch.randn(512, 8)
target = data[:, 2:3] - data[:, 3:4]
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.RMSprop(model.parameters(), lr=1e-3)
w = gradwatch.watch(opt, model=model, run="clean_manual_grad_none", project="corpus")
for step in range(30):
    idx = torch.randint(0, 512, (32,))
    loss = torch.nn.functional.mse_loss(model(data[idx]), target[idx])
    loss.backward()
    opt.step()
    for p in model.parameters():
        p.grad = None
w.close(timeout=30)
print("gradwatch run:", w.run_id)

"""Clean: clearing through the model (model.zero_grad()) rather than the optimizer."""

import torch

import gradwatch

EXPECTED_CODES: set[str] = set()

torch.manual_seed(2)
data = torch.randn(512, 8)
target = data[:, :1] * data[:, 1:2]
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
opt = torch.optim.Adam(model.parameters(), lr=5e-3)
w = gradwatch.watch(opt, model=model, run="clean_model_zero_grad", project="corpus")
for step in range(30):
    idx = torch.randint(0, 512, (32,))
    model.zero_grad()
    loss = torch.nn.functional.mse_loss(model(data[idx]), target[idx])
    loss.backward()
    opt.step()
w.close(timeout=30)
print("gradwatch run:", w.run_id)

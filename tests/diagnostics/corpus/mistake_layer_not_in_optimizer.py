"""Mistake: a head added to the model after the optimizer was built: it gets gradients, but the
optimizer never updates it."""

import torch
from _sampling import every

import gradwatch

EXPECTED_CODES = {"param_not_in_optimizer"}
EVERY_AUTO = True  # also run with every="auto": a sampled step shows it
CAUSE_STEP = None  # known from the start (watch() sees it)


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU())
        self.head = torch.nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


torch.manual_seed(13)
data = torch.randn(512, 8)
target = data[:, :1] * 2 - data[:, 1:2]
model = Net()
opt = torch.optim.AdamW(model.body.parameters(), lr=1e-2)  # model.head forgotten
w = gradwatch.watch(opt, model=model, every=every(), run="mistake_layer_not_in_optimizer", project="corpus")
for step in range(30):
    idx = torch.randint(0, 512, (32,))
    opt.zero_grad()
    model.head.zero_grad()
    loss = torch.nn.functional.mse_loss(model(data[idx]), target[idx])
    loss.backward()
    opt.step()
w.close(timeout=30)
print("gradwatch run:", w.run_id)

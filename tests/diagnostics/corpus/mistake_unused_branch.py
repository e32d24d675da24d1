"""Mistake: an auxiliary branch that forward() computes but never uses in the output, so the
loss does not depend on it and its parameters never get a gradient."""

import torch

import gradwatch

EXPECTED_CODES = {"param_never_gets_grad"}
CAUSE_STEP = 1


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU())
        self.aux = torch.nn.Linear(16, 16)
        self.head = torch.nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(x)
        _features = self.aux(h).detach()  # meant to be added to h; detached and dropped
        return self.head(h)


torch.manual_seed(14)
data = torch.randn(512, 8)
target = data[:, :1] * 2 - data[:, 1:2]
model = Net()
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
w = gradwatch.watch(opt, model=model, run="mistake_unused_branch", project="corpus")
for step in range(30):
    idx = torch.randint(0, 512, (32,))
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(data[idx]), target[idx])
    loss.backward()
    opt.step()
w.close(timeout=30)
print("gradwatch run:", w.run_id)

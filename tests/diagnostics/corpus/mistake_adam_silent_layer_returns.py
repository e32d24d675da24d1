"""Mistake: a side input (a second copy of the features, from a loader that only fills it in
later) is all zeros for the first 600 steps, then arrives. Its zero-initialised layer got exactly
zero gradients meanwhile, so Adam's second moment for it stayed at zero while the step count
grew past the bias correction: when the gradient arrives, Adam divides it by almost nothing, the
layer's updates are many times the others', and the loss spikes a few steps later. Adam's
epsilon regime is what tells it in advance: the layer has been in it since the first step."""

import math

import torch
from _tiny import every

import gradwatch

EXPECTED_CODES = {"adam_epsilon_regime", "loss_spike"}
CAUSE_STEP = 2  # the layer is in Adam's epsilon regime from the start (judged from step 2)
WITHIN = 620  # and the loss spikes a few steps after the side input arrives at step 601
UNSTABLE = True

torch.manual_seed(3)
torch.set_num_threads(1)
D = 32
teacher = torch.randn(D, 1) / math.sqrt(D)


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.main = torch.nn.Linear(D, 256)
        self.side = torch.nn.Linear(D, 256, bias=False)
        torch.nn.init.zeros_(self.side.weight)  # a new branch starts as a no-op
        self.out = torch.nn.Linear(256, 1)

    def forward(self, x: torch.Tensor, side: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.main(x) + self.side(side)))


model = Net()
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
# optimizer_signals: Adam's epsilon-regime share per layer (off by default: it reads the state)
w = gradwatch.watch(
    opt,
    model=model,
    every=every(),
    flight_recorder=True,
    optimizer_signals=True,
    run="mistake_adam_silent_layer_returns",
    project="corpus",
)
for step in range(1, 641):
    x = torch.randn(64, D)
    y = torch.tanh(2 * x @ teacher) + 0.1 * torch.randn(64, 1)
    side = x if step > 600 else torch.zeros_like(x)  # the bug: the loader fills it in late
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x, side), y)
    loss.backward()
    w.log(loss=loss)
    opt.step()
w.close(timeout=30)
print("gradwatch run:", w.run_id)

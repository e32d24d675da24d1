"""Mistake: from step 25 a broken augmentation (a brightness factor of 0) blanks every batch.
The loss still moves (the biases learn the mean), but the first layer's weight gradient, which
is proportional to its input, is exactly zero from then on: that layer has stopped learning."""

import torch

import gradwatch

EXPECTED_CODES = {"vanishing_grad"}
CAUSE_STEP = 26  # the first blank batch

torch.manual_seed(19)
data = torch.randn(512, 8)
target = data[:, :1] * 2 - data[:, 1:2]
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
w = gradwatch.watch(opt, model=model, run="mistake_blank_batches", project="corpus")
for step in range(40):
    idx = torch.randint(0, 512, (32,))
    brightness = 0.0 if step >= 25 else 1.0  # the bug: should stay 1.0
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(data[idx] * brightness), target[idx])
    loss.backward()
    w.log(loss=loss)
    opt.step()
w.close(timeout=30)
print("gradwatch run:", w.run_id)

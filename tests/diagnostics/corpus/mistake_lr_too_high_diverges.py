"""Mistake: a learning-rate schedule whose warm-up never stops: from step 100 it multiplies the
rate of a small GPT's AdamW by 1.06 at every step, so that within 80 steps it is 100 times what
the model trains at; the gradient norms start to jump, then the loss spikes and never comes back."""

import torch
from _tiny import Stream, TinyGPT, every, lm_loss

import gradwatch

EXPECTED_CODES = {"grad_norm_spike", "loss_spike", "exploding_grad"}
CAUSE_STEP = 100  # the first step past the intended peak
WITHIN = 100  # the rate grows for steps before the model breaks
UNSTABLE = True

torch.manual_seed(1)
stream = Stream(seed=2)
model = TinyGPT()
opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
w = gradwatch.watch(
    opt, model=model, every=every(), flight_recorder=True, run="mistake_lr_too_high_diverges", project="corpus"
)
for step in range(1, 201):
    if step >= 100:  # the bug: the warm-up's factor keeps applying
        for group in opt.param_groups:
            group["lr"] *= 1.06
    inputs, targets = stream.batch()
    opt.zero_grad()
    loss = lm_loss(model, inputs, targets)
    loss.backward()
    w.log(loss=loss)
    opt.step()
w.close(timeout=30)
print("gradwatch run:", w.run_id)

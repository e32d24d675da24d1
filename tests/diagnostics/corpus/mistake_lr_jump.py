"""Mistake: a run resumed from a checkpoint with its learning rate in the wrong units: at step 150
a small GPT's AdamW rate jumps 100-fold. The update of every layer is suddenly a large part of the
layer itself (`watch(updates=True)` measures it), and the loss spikes at the next step."""

import torch
from _tiny import Stream, TinyGPT, every, lm_loss

import gradwatch

EXPECTED_CODES = {"large_update", "grad_norm_spike", "loss_spike", "exploding_grad"}
CAUSE_STEP = 150  # the first step at the wrong rate
WITHIN = 10
UNSTABLE = True

torch.manual_seed(1)
stream = Stream(seed=2)
model = TinyGPT()
opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
# updates=True: the size of each step's update against its parameter (holds a copy of the weights)
w = gradwatch.watch(
    opt, model=model, every=every(), flight_recorder=True, updates=True, run="mistake_lr_jump", project="corpus"
)
for step in range(1, 171):
    if step == 150:  # the bug: the resumed rate was meant to be divided by 100
        for group in opt.param_groups:
            group["lr"] *= 100
    inputs, targets = stream.batch()
    opt.zero_grad()
    loss = lm_loss(model, inputs, targets)
    loss.backward()
    w.log(loss=loss)
    opt.step()
w.close(timeout=30)
print("gradwatch run:", w.run_id)

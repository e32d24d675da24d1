"""Clean: a small GPT with the usual schedule, a linear warm-up over 30 steps to a high peak, then
a cosine decay over 130 steps; the gradient norms climb and fall with the rate. Nothing to warn of."""

import math

import torch
from _tiny import Stream, TinyGPT, every, lm_loss

import gradwatch

EXPECTED_CODES: set[str] = set()
STABLE_CONTROL = True
STEPS, WARMUP = 160, 30

torch.manual_seed(4)
stream = Stream(seed=5)
model = TinyGPT()
opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
sched = torch.optim.lr_scheduler.LambdaLR(
    opt, lambda s: (s + 1) / WARMUP if s < WARMUP else 0.5 * (1 + math.cos(math.pi * (s - WARMUP) / (STEPS - WARMUP)))
)
w = gradwatch.watch(opt, model=model, every=every(), flight_recorder=True, run="clean_cosine_warmup", project="corpus")
for step in range(STEPS):
    inputs, targets = stream.batch()
    opt.zero_grad()
    loss = lm_loss(model, inputs, targets)
    loss.backward()
    w.log(loss=loss)
    opt.step()
    sched.step()
w.close(timeout=30)
print("gradwatch run:", w.run_id)

"""Clean: a small GPT trained with 4 micro-batches accumulated per step and the total gradient
norm clipped to 1 (`clip_grad_norm_`): the usual
large-model loop. Only the intended accumulation is reported (info)."""

import torch
from _tiny import Stream, TinyGPT, every, lm_loss

import gradwatch

EXPECTED_CODES = {"grad_accumulation"}
STABLE_CONTROL = True
MICRO = 4

torch.manual_seed(6)
stream = Stream(seed=7)
model = TinyGPT()
opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
w = gradwatch.watch(
    opt, model=model, every=every(), flight_recorder=True, run="clean_accumulation_clipping", project="corpus"
)
for step in range(100):
    opt.zero_grad()
    total = 0.0
    for _ in range(MICRO):
        inputs, targets = stream.batch(4)
        loss = lm_loss(model, inputs, targets) / MICRO
        loss.backward()
        total += loss.item()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    w.log(loss=total)
    opt.step()
w.close(timeout=30)
print("gradwatch run:", w.run_id)

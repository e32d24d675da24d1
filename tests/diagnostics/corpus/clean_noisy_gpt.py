"""Clean: a small GPT trained for 200 steps with AdamW on a noisy token stream: the loss falls
fast, then settles into batch-to-batch noise, and the gradient norms wander with it. No
instability warning may fire on it (grad_norm_spike, loss_spike, exploding_grad...)."""

import torch
from _tiny import Stream, TinyGPT, every, lm_loss

import gradwatch

EXPECTED_CODES: set[str] = set()
STABLE_CONTROL = True  # test_corpus.py: run with both sampling settings, never a warning

torch.manual_seed(1)
stream = Stream(seed=2)
model = TinyGPT()
opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
w = gradwatch.watch(opt, model=model, every=every(), flight_recorder=True, run="clean_noisy_gpt", project="corpus")
for step in range(1, 201):
    inputs, targets = stream.batch()
    opt.zero_grad()
    loss = lm_loss(model, inputs, targets)
    loss.backward()
    w.log(loss=loss)
    opt.step()
w.close(timeout=30)
print("gradwatch run:", w.run_id)

"""Mistake: two batches of garbage (a shard whose labels were shuffled) reach a small GPT at
steps 120 and 121; the loss jumps several times over for those steps, then recovers. One step like
that is enough to knock a large run off course: it must be warned at the step it happens."""

import torch
from _tiny import VOCAB, Stream, TinyGPT, every, lm_loss

import gradwatch

EXPECTED_CODES = {"grad_norm_spike", "loss_spike"}
CAUSE_STEP = 120  # the first corrupted batch
UNSTABLE = True  # test_corpus.py: a warning at or before the loss's first 3x spike

torch.manual_seed(1)
stream = Stream(seed=2)
model = TinyGPT()
opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
w = gradwatch.watch(
    opt, model=model, every=every(), flight_recorder=True, run="mistake_corrupted_batch", project="corpus"
)
for step in range(1, 141):
    inputs, targets = stream.batch()
    if 120 <= step <= 121:  # the bug: labels shuffled in one shard
        targets = torch.randint(0, VOCAB, targets.shape)
    opt.zero_grad()
    loss = lm_loss(model, inputs, targets)
    loss.backward()
    w.log(loss=loss)
    opt.step()
w.close(timeout=30)
print("gradwatch run:", w.run_id)

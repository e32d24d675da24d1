"""Clean: gradient accumulation on purpose, 4 micro-batches per step, each loss divided by 4.

gradwatch reports it as `grad_accumulation` (info, K = 4), never as an error.
"""

import torch
from _sampling import every

import gradwatch

EXPECTED_CODES = {"grad_accumulation"}
EVERY_AUTO = True  # also run with every="auto": a sampled step shows it
CAUSE_STEP = 2
ACCUMULATE = 4

torch.manual_seed(4)
data = torch.randn(512, 8)
target = data[:, :1] * 2 - data[:, 1:2]
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
w = gradwatch.watch(opt, model=model, every=every(), run="clean_accumulation", project="corpus")
for i in range(30 * ACCUMULATE):
    idx = torch.randint(0, 512, (8,))
    loss = torch.nn.functional.mse_loss(model(data[idx]), target[idx]) / ACCUMULATE
    loss.backward()
    if (i + 1) % ACCUMULATE == 0:
        opt.step()
        opt.zero_grad()
w.close(timeout=30)
print("gradwatch run:", w.run_id)

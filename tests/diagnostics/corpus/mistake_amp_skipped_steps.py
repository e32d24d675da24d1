"""AMP with a GradScaler on the CPU where a few steps overflow (an Inf injected into a gradient,
as a float16 overflow would make one): the scaler skips those steps and halves its scale.
A few skips are normal: `amp_skipped_steps` is info, not an error."""

import torch
from _sampling import every

import gradwatch

EXPECTED_CODES = {"amp_skipped_steps"}
EVERY_AUTO = True  # also run with every="auto": a sampled step shows it
EXPECTED_SEVERITY = {"amp_skipped_steps": "info"}
CAUSE_STEP = 1  # float16 overflows at the initial scale on step 1 already
OVERFLOW_AT = {5, 12, 20}

torch.manual_seed(16)
data = torch.randn(512, 8)
target = data[:, :1] * 2 - data[:, 1:2]
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
scaler = torch.amp.GradScaler("cpu")
w = gradwatch.watch(opt, model=model, scaler=scaler, every=every(), run="mistake_amp_skipped_steps", project="corpus")
for i in range(30):
    idx = torch.randint(0, 512, (32,))
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16):
        loss = torch.nn.functional.mse_loss(model(data[idx]).float(), target[idx])
    scaler.scale(loss).backward()
    if i in OVERFLOW_AT:
        model[0].weight.grad[0, 0] = float("inf")
    scaler.step(opt)
    scaler.update()
w.close(timeout=30)
print("gradwatch run:", w.run_id)

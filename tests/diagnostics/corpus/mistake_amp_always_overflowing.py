"""Mistake: AMP where the gradients overflow on most steps (here an Inf every other step, as a
loss that keeps overflowing float16 would give): GradScaler skips half the training. Many
skips make `amp_skipped_steps` a warning."""

import torch

import gradwatch

EXPECTED_CODES = {"amp_skipped_steps"}
EXPECTED_SEVERITY = {"amp_skipped_steps": "warning"}
CAUSE_STEP = 1  # float16 overflows at the initial scale on step 1 already

torch.manual_seed(17)
data = torch.randn(512, 8)
target = data[:, :1] * 2 - data[:, 1:2]
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
scaler = torch.amp.GradScaler("cpu")
w = gradwatch.watch(opt, model=model, scaler=scaler, run="mistake_amp_always_overflowing", project="corpus")
for i in range(40):
    idx = torch.randint(0, 512, (32,))
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16):
        loss = torch.nn.functional.mse_loss(model(data[idx]).float(), target[idx])
    scaler.scale(loss).backward()
    if i % 2 == 1:
        model[2].bias.grad.fill_(float("inf"))
    scaler.step(opt)
    scaler.update()
w.close(timeout=30)
print("gradwatch run:", w.run_id)

"""Clean: mixed precision on the CPU, bfloat16 autocast with a GradScaler, the documented recipe."""

import torch
from _sampling import every

import gradwatch

EXPECTED_CODES: set[str] = set()
EVERY_AUTO = True  # also run with every="auto": a sampled step shows it

torch.manual_seed(5)
data = torch.randn(512, 8)
target = data[:, :1] * 2 - data[:, 1:2]
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
scaler = torch.amp.GradScaler("cpu")
w = gradwatch.watch(opt, model=model, scaler=scaler, every=every(), run="clean_amp_gradscaler", project="corpus")
for step in range(30):
    idx = torch.randint(0, 512, (32,))
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = torch.nn.functional.mse_loss(model(data[idx]).float(), target[idx])
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
w.close(timeout=30)
print("gradwatch run:", w.run_id)

"""Mistake: a GAN whose discriminator is never cleared: each D step uses D's gradients summed over
every round, G's passes through D included."""

import torch
from _sampling import every

import gradwatch

EXPECTED_CODES = {"grad_accumulation_unbounded"}
EVERY_AUTO = True  # also run with every="auto": a sampled step shows it
CAUSE_STEP = 2

torch.manual_seed(14)
gen = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 8))
disc = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LeakyReLU(0.2), torch.nn.Linear(16, 1))
opt_d = torch.optim.Adam(disc.parameters(), lr=2e-4, betas=(0.5, 0.999))
opt_g = torch.optim.Adam(gen.parameters(), lr=2e-4, betas=(0.5, 0.999))
bce = torch.nn.BCEWithLogitsLoss()
w = gradwatch.watch(opt_d, model=disc, every=every(), run="mistake_gan_no_zero_grad_d", project="corpus")
for step in range(30):
    real = torch.randn(32, 8) * 0.5 + 1.0
    fake = gen(torch.randn(32, 4))
    (bce(disc(real), torch.ones(32, 1)) + bce(disc(fake.detach()), torch.zeros(32, 1))).backward()
    opt_d.step()
    opt_g.zero_grad()
    bce(disc(fake), torch.ones(32, 1)).backward()
    opt_g.step()
w.close(timeout=30)
print("gradwatch run:", w.run_id)

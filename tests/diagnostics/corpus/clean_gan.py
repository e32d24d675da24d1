"""Clean: a GAN, D then G each round; G's loss backpropagates through D and fills D's .grad after
D's step, and D's zero_grad() clears it before D's own backward. Two runs: one watcher on D alone,
and watch([opt_d, opt_g]) on a twin. No finding: the pass that lands before a clear counts toward
no step (it is not accumulation)."""

import torch
from _sampling import every

import gradwatch

EXPECTED_CODES: set[str] = set()
EVERY_AUTO = True  # also run with every="auto": a sampled step shows it


def train(watch_both: bool) -> gradwatch.Watcher:
    torch.manual_seed(13)
    gen = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 8))
    disc = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LeakyReLU(0.2), torch.nn.Linear(16, 1))
    opt_d = torch.optim.Adam(disc.parameters(), lr=2e-4, betas=(0.5, 0.999))
    opt_g = torch.optim.Adam(gen.parameters(), lr=2e-4, betas=(0.5, 0.999))
    bce = torch.nn.BCEWithLogitsLoss()
    if watch_both:
        w = gradwatch.watch(
            [opt_d, opt_g],
            model=torch.nn.ModuleDict({"gen": gen, "disc": disc}),
            every=every(),
            run="clean_gan-both",
            project="corpus",
        )
    else:
        w = gradwatch.watch(opt_d, model=disc, every=every(), run="clean_gan-d", project="corpus")
    for step in range(30):
        real = torch.randn(32, 8) * 0.5 + 1.0
        fake = gen(torch.randn(32, 4))
        opt_d.zero_grad()
        d_loss = bce(disc(real), torch.ones(32, 1)) + bce(disc(fake.detach()), torch.zeros(32, 1))
        d_loss.backward()
        opt_d.step()
        opt_g.zero_grad()
        g_loss = bce(disc(fake), torch.ones(32, 1))
        g_loss.backward()
        opt_g.step()
        w.log(d_loss=d_loss, g_loss=g_loss)
    w.close(timeout=30)
    return w


for both in (False, True):
    print("gradwatch run:", train(both).run_id)

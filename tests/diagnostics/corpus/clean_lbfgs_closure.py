"""Clean: LBFGS, which steps with a closure that zeroes, backpropagates and clips; the closure is
evaluated several times per step. No finding: every step has this step's gradients (none is a
`step_without_grad`), one backward pass each (LBFGS' re-evaluations are no accumulation)."""

import torch

import gradwatch

EXPECTED_CODES: set[str] = set()

torch.manual_seed(12)
data = torch.randn(256, 8)
target = data[:, :1] * 2 - data[:, 1:2]
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=5)
w = gradwatch.watch(opt, model=model, run="clean_lbfgs_closure", project="corpus")


def closure() -> torch.Tensor:
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(data), target)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    return loss


for step in range(20):
    w.log(loss=opt.step(closure))
w.close(timeout=30)
print("gradwatch run:", w.run_id)

"""Curve fitting with LBFGS, which steps with a closure, streaming to gradwatch (CPU, seconds).

    python examples/lbfgs.py --server http://127.0.0.1:8765 --steps 30

gradwatch measures the gradients of the closure's first evaluation at each step (the gradient at
the parameters the step starts from) and counts the closure's evaluations (`closure_calls`).
"""

from __future__ import annotations

import argparse
import math

import torch
from torch import nn

import gradwatch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--server", default=None, help="gradwatch server URL (default: $GRADWATCH_SERVER or http://127.0.0.1:8765)"
    )
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--run", default="lbfgs-sine")
    ap.add_argument("--project", default="examples")
    args = ap.parse_args()

    torch.manual_seed(0)
    x = torch.linspace(-math.pi, math.pi, 256).unsqueeze(1)
    y = torch.sin(2 * x) + 0.05 * torch.randn_like(x)
    model = nn.Sequential(nn.Linear(1, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1))
    optimizer = torch.optim.LBFGS(
        model.parameters(), lr=0.5, max_iter=10, history_size=10, line_search_fn="strong_wolfe"
    )

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    with gradwatch.watch(optimizer, model=model, run=args.run, project=args.project, server=args.server) as w:
        print(f"gradwatch run id: {w.run_id}", flush=True)
        for step in range(args.steps):
            loss = optimizer.step(closure)
            w.log(loss=loss)
            if step % 5 == 0 or step == args.steps - 1:
                print(f"step {step + 1:4d}  loss {loss.item():.5f}", flush=True)
        print(f"done; waiting for the server to acknowledge {w.pending} messages", flush=True)


if __name__ == "__main__":
    main()

"""Data-parallel training (DDP) on CPU with gloo, watched on every rank: one gradwatch run.

    torchrun --nproc-per-node 2 examples/ddp.py --server http://127.0.0.1:8765

Every rank calls `gradwatch.watch(...)` the same way; the ranks agree on one run id through
torch.distributed's store at `watch()` (never on a step) and each streams its own rank's
measurements. The server adds them into the job's run: with DDP every rank holds the same
gradients after the all-reduce, so rank 0's copy counts and the others' are the per-rank view.

Each rank trains on its own half of every batch; DDP averages the gradients, so the run's values
equal those of one process training on the whole batch. `--accumulate K` accumulates K
micro-batches under `no_sync()` (the run says `grad_accumulation`, K). `--oracle FILE` makes
rank 0 write, per step, the norms computed here from its own tensors (JSON lines: the gradients
as the step uses them, the parameters and Adam's state after it), which the run's values equal.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import gradwatch

FEATURES, CLASSES = 32, 10


def build_model() -> nn.Module:
    """The same weights on every rank (DDP also broadcasts rank 0's at wrapping)."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(FEATURES, 128), nn.GELU(), nn.Linear(128, 128), nn.GELU(), nn.LayerNorm(128), nn.Linear(128, CLASSES)
    )


def batches(steps: int, accumulate: int, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every rank's data, the same on each: `x[s, m]` is micro-batch m of step s, `batch` rows in all."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(steps, accumulate, batch, FEATURES, generator=g)
    y = torch.randint(0, CLASSES, (steps, accumulate, batch), generator=g)
    return x, y


def oracle(step: int, model: nn.Module, opt: torch.optim.Optimizer, grads: dict[str, float]) -> dict[str, Any]:
    """This rank's norms by hand: gradients (read before the step), parameters and state (after)."""
    norms: dict[str, Any] = {
        "step": step,
        "grad_norm": grads,
        "param_norm": {},
        "exp_avg_norm": {},
        "exp_avg_sq_norm": {},
    }
    for name, p in model.module.named_parameters():
        norms["param_norm"][name] = torch.linalg.vector_norm(p).item()
        for key in ("exp_avg", "exp_avg_sq"):
            norms[f"{key}_norm"][name] = torch.linalg.vector_norm(opt.state[p][key]).item()
    return norms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--server", default=None, help="gradwatch server URL (default: $GRADWATCH_SERVER or http://127.0.0.1:8765)"
    )
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--accumulate", type=int, default=1, help="micro-batches per step (no_sync() on all but the last)")
    ap.add_argument("--batch", type=int, default=64, help="rows per micro-batch, over all ranks")
    ap.add_argument(
        "--name", default="ddp-mlp", help="the run's name (not --run: torchrun would take it for its --run-path)"
    )
    ap.add_argument("--project", default="examples")
    ap.add_argument("--oracle", type=Path, default=None, help="rank 0 writes its own norms per step here")
    args = ap.parse_args()
    if args.steps < 1 or args.accumulate < 1:
        ap.error("--steps and --accumulate must be 1 or more")

    dist.init_process_group("gloo")  # torchrun's environment: RANK, WORLD_SIZE, MASTER_ADDR...
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.batch % world:
        ap.error(f"--batch must be a multiple of the world size ({world})")
    model = DistributedDataParallel(build_model())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = batches(args.steps, args.accumulate, args.batch)
    mine = slice(rank * args.batch // world, (rank + 1) * args.batch // world)  # this rank's rows
    records = []

    with gradwatch.watch(opt, model=model, run=args.name, project=args.project, server=args.server) as w:
        if rank == 0:
            print(f"gradwatch run id: {w.run_id}", flush=True)
        for step in range(args.steps):
            opt.zero_grad(set_to_none=True)
            for m in range(args.accumulate):
                last = m == args.accumulate - 1
                with contextlib.nullcontext() if last else model.no_sync():  # all-reduce on the last only
                    loss = nn.functional.cross_entropy(model(x[step, m, mine]), y[step, m, mine]) / args.accumulate
                    loss.backward()
            w.log(loss=loss.detach() * args.accumulate)
            if args.oracle is not None and rank == 0:
                grads = {n: torch.linalg.vector_norm(p.grad).item() for n, p in model.module.named_parameters()}
            opt.step()
            if args.oracle is not None and rank == 0:
                records.append(oracle(step + 1, model, opt, grads))
            if rank == 0 and (step % 10 == 0 or step == args.steps - 1):
                print(f"step {step + 1:4d}  loss {loss.item() * args.accumulate:.4f}", flush=True)
        if rank == 0:
            print(f"done; waiting for the server to acknowledge {w.pending} messages", flush=True)
    if args.oracle is not None and rank == 0:
        args.oracle.write_text("".join(json.dumps(r) + "\n" for r in records))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""DDP on 2 gloo ranks, knowing nothing of gradwatch (run by test_launch.py under `gradwatch-run
-- torchrun`). `--oracle FILE`: rank 0 writes its own norms per step (gradients before the step,
parameters and Adam's state after it), which the job's run equals. `--zero`: the optimizer is a
ZeroRedundancyOptimizer; every rank writes the state of the parameters it owns to FILE.rank."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--oracle", type=Path)
    ap.add_argument("--zero", action="store_true")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Linear(16, 4)))
    if args.zero:
        opt: torch.optim.Optimizer = ZeroRedundancyOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-2)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randn(args.steps, 2, 16, 8, generator=torch.Generator().manual_seed(1))
    records = []
    for step in range(args.steps):
        opt.zero_grad()
        model(x[step, rank]).pow(2).mean().backward()
        record: dict[str, dict[str, float]] = {"grad_norm": {}, "param_norm": {}}
        for name, p in model.module.named_parameters():
            record["grad_norm"][name] = torch.linalg.vector_norm(p.grad).item()
        opt.step()
        state = opt.optim.state if args.zero else opt.state  # ZeRO: this rank's own parameters only
        for name, p in model.module.named_parameters():
            record["param_norm"][name] = torch.linalg.vector_norm(p).item()
            for key in ("exp_avg", "exp_avg_sq"):
                if p in state:
                    record.setdefault(f"{key}_norm", {})[name] = torch.linalg.vector_norm(state[p][key]).item()
        records.append({"step": step + 1, **record})
    if args.oracle is not None and (rank == 0 or args.zero):
        path = args.oracle if not args.zero else args.oracle.with_suffix(f".{rank}")
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    if rank == 0:
        print("trained", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

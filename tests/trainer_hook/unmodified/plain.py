"""A training script that knows nothing of gradwatch: tests/trainer_hook/test_launch.py runs it
under `gradwatch-run`. `--oracle FILE` writes, per step, the norms computed here (JSON lines: the
gradients as the step uses them, the parameters and the state after it); `--gan` trains two models
with two optimizers (one set, one run); `--exit N` ends with status N after training."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from torch import nn


def norms(named: list[tuple[str, nn.Parameter]], opt: torch.optim.Optimizer, into: dict[str, dict[str, float]]) -> None:
    for name, p in named:
        into.setdefault("param_norm", {})[name] = torch.linalg.vector_norm(p).item()
        for key, value in opt.state[p].items():
            if isinstance(value, torch.Tensor) and value.shape == p.shape:
                into.setdefault(f"{key}_norm", {})[name] = torch.linalg.vector_norm(value).item()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--oracle", type=Path)
    ap.add_argument("--gan", action="store_true")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (names: _orig_mod. left out)")
    ap.add_argument("--exit", type=int, default=0)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    models = {"model": model}
    opts = {"model": torch.optim.AdamW(model.parameters(), lr=1e-2)}
    if args.gan:
        critic = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
        models["critic"] = critic
        opts["critic"] = torch.optim.SGD(critic.parameters(), lr=1e-2, momentum=0.9)
    forward = torch.compile(model, backend="eager") if args.compile else model
    x = torch.randn(args.steps, 32, 8, generator=torch.Generator().manual_seed(1))
    records = []
    for step in range(args.steps):
        record: dict[str, dict[str, float]] = {}
        for key, opt in opts.items():
            opt.zero_grad()
            out = forward(x[step])
            loss = out.pow(2).mean() if key == "model" else models["critic"](out.detach()).mean()
            loss.backward()
            prefix = "" if not args.gan else type(models[key]).__name__ + ("." if key == "model" else "2.")
            named = [(prefix + n, p) for n, p in models[key].named_parameters()]
            for name, p in named:
                record.setdefault("grad_norm", {})[name] = torch.linalg.vector_norm(p.grad).item()
            opt.step()
            norms(named, opt, record)
        records.append({"step": step + 1, **record})
        print(f"step {step + 1} loss {loss.item():.6f}", flush=True)
        print(f"stderr line {step + 1}", file=sys.stderr, flush=True)
    if args.oracle is not None:
        args.oracle.write_text("".join(json.dumps(r) + "\n" for r in records))
    print("argv " + json.dumps(sys.argv[1:]), flush=True)
    sys.exit(args.exit)


if __name__ == "__main__":
    main()

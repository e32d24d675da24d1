"""What the instability signals cost a training step, measured side by side.

On the GPT and MLP of benchmarks/overhead.py, with AdamW, one process: each cycle runs, in a
shuffled order, a plain step and the same step plus one piece of the hook's work, on the same
model (the extra work reads the gradients and state the step left; it changes nothing):
  recorder     the flight recorder's work at an unmeasured step (every=N > 1, "auto"): the fused
               norms of every gradient written into the ring buffer on the device
  signals      optimizer_signals=True at a measured step: eps_share, v_decoupling, momentum_cosine
  clip wrapper clip_grad_norm_ through gradwatch's wrapper against the original (a loop that clips)
A piece's figure is the median over cycles of (its step / the mean of the plain steps around it) - 1.

    python benchmarks/instability.py [--models gpt,mlp] [--cycles N]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

import torch
from overhead import gpt_task, mlp_task

from gradwatch.clipping import ClipNorms
from gradwatch.recorder import FlightRecorder
from gradwatch.signals import optimizer_signals


def bench(name: str, cycles: int) -> None:
    """Print each piece's median overhead on model `name`."""
    model, loss_fn = {"gpt": gpt_task, "mlp": mlp_task}[name]()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    params = list(model.parameters())
    recorder = FlightRecorder(params, [True] * len(params), lambda d: None)
    clip = ClipNorms()

    def step(extra: Callable[[], None] | None = None, clipped: bool = False) -> float:
        started = time.perf_counter()
        opt.zero_grad()
        loss_fn(model).backward()
        if clipped:
            torch.nn.utils.clip_grad_norm_(params, 1.0)
        if extra is not None:
            extra()
        opt.step()
        return time.perf_counter() - started

    def signals() -> None:
        states = [opt.state[p] for p in params]
        groups = [next(g for g in opt.param_groups if any(q is p for q in g["params"])) for p in params]
        for _, _, values in optimizer_signals(params, range(len(params)), states, groups):
            torch.stack(values).sum()

    def with_wrapper() -> float:
        clip.open()
        try:
            return step(clipped=True)
        finally:
            clip.close()

    pieces: dict[str, Callable[[], float]] = {
        "recorder": lambda: step(lambda: recorder.record(1)),
        "signals": lambda: step(signals),
        "clip wrapper": with_wrapper,
    }
    plain: dict[str, Callable[[], float]] = {
        "recorder": step,
        "signals": step,
        "clip wrapper": lambda: step(clipped=True),
    }
    for _ in range(3):
        step()
    ratios: dict[str, list[float]] = {k: [] for k in pieces}
    for _ in range(cycles):
        for key in random.sample(list(pieces), len(pieces)):
            before = plain[key]()
            took = pieces[key]()
            after = plain[key]()
            ratios[key].append(took / ((before + after) / 2) - 1)
    base = statistics.median(step() for _ in range(5))
    print(f"{name}: plain step {base * 1e3:.1f} ms")
    for key, values in ratios.items():
        print(f"  {key:<13} {statistics.median(values) * 100:+.2f}%  (n={len(values)})")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="gpt,mlp")
    parser.add_argument("--cycles", type=int, default=30)
    args = parser.parse_args()
    torch.set_flush_denormal(True)
    torch.manual_seed(0)
    for name in args.models.split(","):
        bench(name, args.cycles)


if __name__ == "__main__":
    main()

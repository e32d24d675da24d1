"""What the instability signals cost a training step, measured side by side.

On the GPT and MLP of benchmarks/overhead.py, with AdamW, one process: each cycle runs, in a
shuffled order, a plain step and the same step plus one piece of the hook's work, on the same
model (the extra work reads the gradients and state the step left; it changes nothing):
  recorder     the flight recorder's work at an unmeasured step (every=N > 1, "auto"): the fused
               norms of every gradient written into the ring buffer on the device
  signals      optimizer_signals=True at a measured step: eps_share, v_decoupling, momentum_cosine
  updates      updates=True at a measured step: a copy of the parameters before the update, then
               the norms of the copy and of the update (update_norm, update_ratio)
  clip wrapper clip_grad_norm_ through gradwatch's wrapper against the original (a loop that clips)
A piece's figure is the median over cycles of (its step / the mean of the plain steps around it) - 1,
with a 90% bootstrap interval. Run it with OMP_NUM_THREADS=1 on a shared machine.

    python benchmarks/instability.py [--models gpt,mlp] [--cycles N] [--clock wall|cpu]
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
from gradwatch.measure import fused_norms
from gradwatch.recorder import FlightRecorder
from gradwatch.signals import optimizer_signals

#: a step's time: wall (time.perf_counter), or with --clock cpu this thread's CPU time (all of a
#: step's work with OMP_NUM_THREADS=1; on a loaded machine wall time also counts waiting for a core)
CLOCK: list[Callable[[], float]] = [time.perf_counter]


def bench(name: str, cycles: int) -> None:
    """Print each piece's median overhead on model `name`."""
    model, loss_fn = {"gpt": gpt_task, "mlp": mlp_task}[name]()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    params = list(model.parameters())
    recorder = FlightRecorder(params, [True] * len(params), lambda d: None)
    clip = ClipNorms()

    def step(
        extra: Callable[[], None] | None = None, clipped: bool = False, after: Callable[[], None] | None = None
    ) -> float:
        started = CLOCK[0]()
        opt.zero_grad()
        loss_fn(model).backward()
        if clipped:
            torch.nn.utils.clip_grad_norm_(params, 1.0)
        if extra is not None:
            extra()
        opt.step()
        if after is not None:
            after()
        return CLOCK[0]() - started

    def signals() -> None:
        states = [opt.state[p] for p in params]
        groups = [next(g for g in opt.param_groups if any(q is p for q in g["params"])) for p in params]
        for _, _, values in optimizer_signals(params, range(len(params)), states, groups):
            torch.stack(values).sum()

    held: list[torch.Tensor] = []

    def copy_params() -> None:  # what Probe.read_grads keeps with updates=True
        held[:] = [p.detach().clone() for p in params]

    def update_norms() -> None:  # what Probe._updates reads after the step
        before = torch.stack(fused_norms(held))
        torch._foreach_sub_(held, [p.detach() for p in params])
        update = torch.stack(fused_norms(held))
        torch.stack([update, update / before]).sum()
        held.clear()

    def with_wrapper() -> float:
        clip.open()
        try:
            return step(clipped=True)
        finally:
            clip.close()

    pieces: dict[str, Callable[[], float]] = {
        "recorder": lambda: step(lambda: recorder.record(1)),
        "signals": lambda: step(signals),
        "updates": lambda: step(copy_params, after=update_norms),
        "clip wrapper": with_wrapper,
    }
    plain: dict[str, Callable[[], float]] = {
        "recorder": step,
        "signals": step,
        "updates": step,
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
        low, high = interval(values)
        print(f"  {key:<13} {statistics.median(values):+.2%} ({low:+.2%} to {high:+.2%})  (n={len(values)})")


def interval(values: list[float], resamples: int = 1000) -> tuple[float, float]:
    """90% bootstrap interval of the median of `values`."""
    rng = random.Random(0)
    got = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(resamples))
    return got[int(0.05 * resamples)], got[int(0.95 * resamples) - 1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="gpt,mlp")
    parser.add_argument("--cycles", type=int, default=30)
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    args = parser.parse_args()
    CLOCK[0] = time.thread_time if args.clock == "cpu" else time.perf_counter
    torch.set_flush_denormal(True)
    torch.manual_seed(0)
    for name in args.models.split(","):
        bench(name, args.cycles)


if __name__ == "__main__":
    main()

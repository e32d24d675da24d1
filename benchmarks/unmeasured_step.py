"""What a step gradwatch does not measure costs the training thread, by parameter-tensor count.

This is the floor of `every="auto"`, which measures few steps and pays this on every other one.
Target (issue 27): at most 20 us plus 0.5 us per parameter tensor.

For each tensor count, an MLP of tiny `Linear(--width, --width)` layers (two tensors each), SGD,
one torch thread, watched with `every=10**9` (only step 1 is measured) against an unwatched twin
with the same weights and batch in the same process. The steps are interleaved: twin, watched,
twin; a watched step's extra time is its time minus the mean of the two twin steps beside it (a
step and its neighbours share the machine's conditions). The figure is the median over `--steps`
such triples, with a 90% bootstrap interval of that median. By default the watcher streams to a
real `gradwatch serve` on this machine (its own process, SQLite in a temporary folder); with
`--server none` nothing listens and the sender spools.

    python benchmarks/unmeasured_step.py [--tensors 80,400,1600] [--steps 300] [--server local|none]
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

import gradwatch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead import start_server, stop_server  # noqa: E402  (a sibling script, not a package)

NOWHERE = "http://127.0.0.1:9"  # nothing listens: the hook spools
WARMUP = 20  # untimed steps of each twin: the first (measured) step, the allocator


def target_us(tensors: int) -> float:
    """The issue's bound on an unmeasured step's extra time."""
    return 20.0 + 0.5 * tensors


def model(tensors: int, width: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    net = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(tensors // 2)])
    return net, torch.optim.SGD(net.parameters(), lr=1e-4)


def step(net: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> None:
    opt.zero_grad(set_to_none=True)
    net(x).square().mean().backward()
    opt.step()


def median_interval(values: list[float], resamples: int = 1000, seed: int = 0) -> tuple[float, float]:
    """90% bootstrap interval of the median of `values`."""
    rng = random.Random(seed)
    n = len(values)
    got = sorted(statistics.median(rng.choices(values, k=n)) for _ in range(resamples))
    return got[int(0.05 * resamples)], got[int(0.95 * resamples) - 1]


def measure(tensors: int, width: int, steps: int, server: str) -> dict[str, float]:
    x = torch.randn(16, width)
    twin, twin_opt = model(tensors, width)
    watched, watched_opt = model(tensors, width)
    w = gradwatch.watch(watched_opt, model=watched, server=server, every=10**9, warn=False)
    for _ in range(WARMUP):
        step(twin, twin_opt, x)
        step(watched, watched_opt, x)
    extra, base = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        step(twin, twin_opt, x)
        t1 = time.perf_counter()
        step(watched, watched_opt, x)
        t2 = time.perf_counter()
        step(twin, twin_opt, x)
        t3 = time.perf_counter()
        around = ((t1 - t0) + (t3 - t2)) / 2
        extra.append(t2 - t1 - around)
        base.append(around)
    measured = w.measured_steps
    w.close(timeout=10 if server != NOWHERE else 0.5)
    if measured != 1:
        raise SystemExit(f"{measured} steps were measured, expected only step 1")
    lo, hi = median_interval(extra)
    return {"extra": statistics.median(extra), "lo": lo, "hi": hi, "step": statistics.median(base)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tensors", default="80,400,1600", help="parameter tensor counts (even; default 80,400,1600)")
    ap.add_argument("--steps", type=int, default=300, help="interleaved triples timed per count (default 300)")
    ap.add_argument("--width", type=int, default=8, help="in and out features of each Linear (default 8)")
    ap.add_argument("--server", choices=("local", "none"), default="local", help="a real local server, or none")
    args = ap.parse_args(argv)
    try:
        counts = [int(c) for c in args.tensors.split(",")]
    except ValueError:
        ap.error("--tensors is a comma-separated list of whole numbers")
    if args.steps < 2 or args.width < 1 or any(c < 2 or c % 2 for c in counts):
        ap.error("--steps must be 2 or more, --width 1 or more, and each tensor count even and 2 or more")
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    logging.getLogger("gradwatch").setLevel(logging.ERROR)  # not "kept in the spool": it is deleted
    with tempfile.TemporaryDirectory(prefix="gradwatch-bench-") as tmp:
        os.environ["GRADWATCH_SPOOL"] = tmp
        proc, url = start_server(Path(tmp)) if args.server == "local" else (None, NOWHERE)
        try:
            print(
                f"torch {torch.__version__}, 1 thread, SGD, Linear({args.width}, {args.width}) layers, "
                f"{'a local server' if proc else 'no server (spooling)'}; {args.steps} interleaved triples each"
            )
            print("tensors | step ms | unmeasured step extra us (90% interval) | us/tensor | target us | met")
            met = True
            for n in counts:
                r = measure(n, args.width, args.steps, url)
                ok = r["hi"] * 1e6 <= target_us(n)
                met &= ok
                print(
                    f"{n:7d} | {r['step'] * 1e3:7.2f} | {r['extra'] * 1e6:+8.1f} ({r['lo'] * 1e6:+.1f} to "
                    f"{r['hi'] * 1e6:+.1f}) | {r['extra'] * 1e6 / n:+9.2f} | {target_us(n):9.0f} | "
                    f"{'yes' if ok else 'no'}"
                )
            print("target met at every count" if met else "target NOT met at some count (upper bound above it)")
        finally:
            if proc is not None:
                stop_server(proc)
    return 0


if __name__ == "__main__":
    sys.exit(main())

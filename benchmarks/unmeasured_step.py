"""What an unmeasured step costs the training thread: the floor of `every="auto"`, which measures
almost no step and pays this on every other one (the gradient hooks that tell None, zero and
filled buffers apart, and the step's timing).

An MLP of `--layers` Linear(256) layers (two tensors each) watched with `every=10**6` (no step
after the first is measured) and no server (the spool takes the cheap facts), against an
unwatched twin with the same weights and batch in the same process. The steps are interleaved:
twin, watched, twin; a watched step's overhead is its time minus the mean of the two twin steps
beside it. The figure is the median over `--steps` such triples, in microseconds and as a share
of the twin's step.

    python benchmarks/unmeasured_step.py [--steps 300] [--layers 40]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time

import torch

import gradwatch

NOWHERE = "http://127.0.0.1:9"  # nothing listens: the hook spools


def model(layers: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    net = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(layers)])
    return net, torch.optim.AdamW(net.parameters(), lr=1e-4)


def step(net: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> None:
    opt.zero_grad(set_to_none=True)
    net(x).square().mean().backward()
    opt.step()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=300, help="interleaved triples timed (default 300)")
    ap.add_argument("--layers", type=int, default=40, help="Linear(256) layers of the MLP (default 40)")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.layers < 1:
        ap.error("--steps and --layers must be 1 or more")
    torch.set_flush_denormal(True)
    with tempfile.TemporaryDirectory(prefix="gradwatch-bench-") as spool:
        os.environ["GRADWATCH_SPOOL"] = spool
        logging.getLogger("gradwatch").setLevel(logging.ERROR)  # not "kept in the spool": it is deleted
        return run(args.steps, args.layers)


def run(steps: int, layers: int) -> int:
    x = torch.randn(64, 256)
    twin, twin_opt = model(layers)
    watched, watched_opt = model(layers)
    w = gradwatch.watch(watched_opt, model=watched, server=NOWHERE, every=10**6, warn=False)
    for _ in range(10):  # warm-up: the first (measured) step and the allocator
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
    w.close(timeout=0.5)
    cost, baseline = statistics.median(extra), statistics.median(base)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; {2 * layers} tensors; "
        f"{measured} of {10 + steps} watched steps measured"
    )
    print(f"unmeasured step: {cost * 1e6:+.0f} us ({cost / baseline:+.2%} of a {baseline * 1e3:.1f} ms step)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

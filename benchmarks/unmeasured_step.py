"""What a step gradwatch does not measure costs the training thread, by parameter-tensor count.

This is the floor of `every="auto"`, which measures few steps and pays this on every other one.
The budget it is held to: at most 20 us plus 0.5 us per parameter tensor.

For each tensor count, an MLP of tiny `Linear(--width, --width)` layers (two tensors each), SGD,
one torch thread, watched with `every=10**9` (only step 1 is measured) against an unwatched twin
with the same weights and batch in the same process. The steps alternate strictly: twin,
watched, twin, watched, ..., so that every step follows one of the other model (a twin step
right after a twin step would find its tensors in the CPU caches and bias the pairing:
docs/benchmarks.md); a watched step's extra is its time minus each of the two twin steps beside
it (a step and its neighbours share the machine's conditions), both differences kept: step times
are skewed to the right, so a step less the mean of its two neighbours has a median below zero
even between steps alike, where the difference of two steps alike is symmetric about zero.

Where each copy's tensors lie (their pages, the cache sets they share) moves its steps the same
way for the copies' whole life, by as much as the hook costs at width 256 (docs/benchmarks.md),
and no pairing of steps cancels it. So the two copies cross
over: the first is watched for half the steps, then its watcher is closed (its hooks removed)
and the second is watched against the first for the other half; the k-th extra of one half and
the k-th of the other are averaged, and the placement cancels. The figure is the median of those
averages over `--steps` watched steps, with a 90% bootstrap interval of that median, in wall time
and in the training thread's CPU time (`time.thread_time`, which a loaded machine's descheduling
does not inflate). The column "placement" is half the difference of the halves' CPU medians in
the block where it was largest: how far watching one copy only would have been off. `--aa` also
times unwatched copies the same way: the design's own bias and noise.

The C allocator is held steady (`--malloc steady`, the default): glibc hands tensors of 128 KiB
and more (a Linear(256)'s weight and gradient) to mmap, then, once one is freed, raises that
threshold and serves them from the heap, whose top it gives back to the kernel whenever more than
twice the threshold is free there. `zero_grad(set_to_none=True)` frees a whole model's gradients
each step, so whichever copy's gradients happen to lie at the heap's top page-faults them back
in at its next backward (system time on the training thread), the other copy not: a bias of
either sign, by the heap's history. Held steady (no trimming, no mmap below 32 MiB), a warm loop
faults nothing. The column "faults" prints the training thread's minor page faults per step,
watched slot and twin slot; `--malloc default` keeps glibc's own behaviour. `--blocks K` makes
fresh copies K times per variant, the variants alternating block by block, every other block
watching the copy made second first, and pools their steps; the column "blocks' CPU spread" is
the range of the blocks' medians.
`--model mlp` times overhead.py's MLP instead (40 `Linear(256, 256)`
with ReLUs, its batch of 256, AdamW: 80 tensors whose step evicts the CPU caches; `gpt`, `wide`:
its other models), held to the issue's bound for `every="auto"` there: 0.5% of its step all
told, the training thread's extra (the upper end of its CPU interval) with the CPU of the hook's
other threads and of the server.
By default the watcher streams to a real `gradwatch serve` on this machine (its own process,
SQLite in a temporary folder); with `--server none` nothing listens and the sender spools.
`--keep-loss` keeps each step's loss until the copy's next forward, as a loop that assigns
`loss = ...` does: the parameters' gradient accumulator nodes then live from one step to the next.
`--flight-recorder` watches with the flight recorder on (as on a GPU by default; off on CPU): its
norm pass on the training thread, and its incident test on the sender thread. The column "other
threads" is the process's CPU time less the training thread's per step, "server" the local
server process's, both read over up to 100 steps of the watched copy alone after the timed ones
of each half (its sender's and server's work on the steps before done first, on these after): at
the training's own pace, since between twin steps what they do by the second (a wake, a spool
write) would fall on half as many steps. `--ballast` keeps every core busy at the lowest priority
(SCHED_IDLE) meanwhile: a VM that charges a thread waking on an idle vCPU for the vCPU's sleep
(this project's machine does) then charges the ballast, and those two columns are the threads'
work.

    python benchmarks/unmeasured_step.py [--tensors 80,400,1600] [--steps 300] [--width 8] [--server local|none]
        [--aa] [--blocks 1] [--flight-recorder] [--malloc steady|default] [--model tiny|mlp|gpt|wide] [--ballast]
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import gradwatch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead import TASKS, Ballast, acked, process_cpu, start_server, steady_malloc, stop_server, wake_line  # noqa: E402  (a sibling script, not a package)

NOWHERE = "http://127.0.0.1:9"  # nothing listens: the hook spools
WARMUP = 20  # untimed steps of each twin: the first (measured) step, the allocator
ALONE = 200  # at most this many steps of the watched copy alone, for its background's CPU (a block)


def thread_faults() -> int:
    """The calling thread's minor page faults so far."""
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt


#: the issue's bound on `every="auto"` on overhead.py's models, all told: the training thread's
#: extra (the CPU interval's upper end), the hook's other threads and the local server, per step
MODEL_TARGET = 0.005


def target_us(tensors: int) -> float:
    """The issue's bound on an unmeasured step's extra time."""
    return 20.0 + 0.5 * tensors


Loss = Callable[[torch.nn.Module], torch.Tensor]


def model(tensors: int, width: int, task: str | None = None) -> tuple[torch.nn.Module, torch.optim.Optimizer, Loss]:
    """`tensors` / 2 `Linear(width, width)` layers, SGD and a batch of 16; or overhead.py's model
    `task` (its batch, its loss) and AdamW. The same weights and batch at every call."""
    torch.manual_seed(0)
    if task is not None:
        net, loss = TASKS[task]()
        return net, torch.optim.AdamW(net.parameters(), lr=1e-4), loss
    net = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(tensors // 2)])
    x = torch.randn(16, width)
    return net, torch.optim.SGD(net.parameters(), lr=1e-4), lambda m: m(x).square().mean()


#: `--keep-loss`: each copy's last loss, held until its next step's forward has run
KEPT: dict[int, torch.Tensor] | None = None


def train_step(net: torch.nn.Module, opt: torch.optim.Optimizer, loss: Loss) -> None:
    opt.zero_grad(set_to_none=True)
    value = loss(net)
    value.backward()
    opt.step()
    if KEPT is not None:  # its graph, and the gradient accumulator nodes, live until the next forward
        KEPT[id(net)] = value


def background_cpu(
    w: gradwatch.Watcher,
    run_step: Callable[[], Any],
    steps: int,
    server_pid: int | None,
    settle: bool = True,
    ballast: Ballast | None = None,
) -> tuple[float, float]:
    """CPU seconds a step of this process's threads but the calling one (the hook's) and of the
    server process `server_pid` (0 without one), over `steps` steps of the watched copy alone, at
    the training's own pace (between twin steps what they do by the second, a wake and a spool
    write, would fall on half as many steps); `settle`: the server's acks waited for first (its
    work on the steps before done) and after (on these). `ballast`: run meanwhile, so that no
    core idles (overhead.Ballast: what is read is then the threads' work, not a VM's charge for
    their sleep)."""
    if ballast is not None:
        ballast.on()
    try:
        if settle:
            acked(w)
        serving, process = process_cpu(server_pid) if server_pid else 0.0, time.process_time()
        thread = time.thread_time()
        for _ in range(steps):
            run_step()
        if settle:
            acked(w)
        serving = (process_cpu(server_pid) - serving) / steps if server_pid else 0.0
        return ((time.process_time() - process) - (time.thread_time() - thread)) / steps, serving
    finally:
        if ballast is not None:
            ballast.off()


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


def phase(
    copy: tuple[torch.nn.Module, torch.optim.Optimizer],
    twin: tuple[torch.nn.Module, torch.optim.Optimizer],
    loss: Loss,
    steps: int,
    server: str | None,
    recorder: bool,
    server_pid: int | None,
    ballast: Ballast | None,
) -> dict[str, Any]:
    """`copy` watched (`server` None: left unwatched) and stepped in turn with its `twin`,
    `steps` times each: its steps' and its twin's wall and CPU times and page faults (twin,
    copy, twin, ..., twin), and its background's CPU (`background_cpu`); the watcher closed,
    its hooks gone, after."""
    net, opt = copy
    w = (
        None
        if server is None
        else gradwatch.watch(opt, model=net, server=server, every=10**9, warn=False, flight_recorder=recorder)
    )
    for _ in range(WARMUP):
        train_step(*twin, loss)
        train_step(net, opt, loss)
    wall, cpu, faults = [], [], []
    for k in range(2 * steps + 1):
        f, t, c = thread_faults(), time.perf_counter(), time.thread_time()
        if k % 2:
            train_step(net, opt, loss)
        else:
            train_step(*twin, loss)
        wall.append(time.perf_counter() - t)
        cpu.append(time.thread_time() - c)
        faults.append(thread_faults() - f)
    background = serving = 0.0
    if w is not None:
        # (The flight recorder holds its steps until an incident or the close: no acks to wait for.)
        settle = server_pid is not None and not recorder
        background, serving = background_cpu(
            w, lambda: train_step(net, opt, loss), min(steps, ALONE // 2), server_pid, settle, ballast
        )
        measured = w.measured_steps
        w.close(timeout=10 if server != NOWHERE else 0.5)
        if measured != 1:
            raise SystemExit(f"{measured} steps were measured, expected only step 1")
    return {"wall": wall, "cpu": cpu, "faults": faults, "background": background, "server": serving}


def extra(times: list[float]) -> list[float]:
    """Each copy step (odd places) against each twin step beside it: a difference of two steps
    alike is symmetric about zero, where a step less the mean of two is not (step times are
    skewed to the right)."""
    return [times[k] - times[j] for k in range(1, len(times), 2) for j in (k - 1, k + 1)]


def crossed(first: list[float], second: list[float]) -> tuple[list[float], float]:
    """The two halves' step times (twin, copy, twin, ...) of a crossover: the k-th extra of the
    first averaged with the k-th of the second (where each copy lies cancels), and half the
    difference of the halves' median extras (that placement effect)."""
    a, b = extra(first), extra(second)
    return [(x + y) / 2 for x, y in zip(a, b)], (statistics.median(a) - statistics.median(b)) / 2


def measure(
    tensors: int,
    width: int,
    steps: int,
    server: str | None,
    recorder: bool = False,
    copy_first: bool = False,
    task: str | None = None,
    server_pid: int | None = None,
    ballast: Ballast | None = None,
) -> dict[str, list[float]]:
    """A crossover of two copies alike: one watched (`server` None: left unwatched, the A/A)
    against the other for half the `steps`, then the other watched against the first. Returned:
    the watch's extra time per step, wall and CPU, each a pair of the two halves' extras (index
    by index) averaged, so that where each copy's tensors lie cancels; half the difference of the
    halves' CPU medians (`placement`: that effect, the bias of watching one copy only); the CPU of
    the process's other threads and of the server process `server_pid` a watched step; the page
    faults of each step. `copy_first`: the copy watched first is made first; `task`: overhead.py's
    model of that name instead of `tensors` / 2 `Linear(width, width)`; `ballast`: run while the
    background is read (`background_cpu`)."""
    made = [model(tensors, width, task) for _ in range(2)]
    first, second = (made[0], made[1]) if copy_first else (made[1], made[0])
    loss = made[0][2]
    half = -(-steps // 2)
    runs = [
        phase(first[:2], second[:2], loss, half, server, recorder, server_pid, ballast),
        phase(second[:2], first[:2], loss, half, server, recorder, server_pid, ballast),
    ]
    wall, _ = crossed(runs[0]["wall"], runs[1]["wall"])
    cpu, placement = crossed(runs[0]["cpu"], runs[1]["cpu"])
    return {
        "step": [t for r in runs for t in r["wall"][0::2]],
        "step_cpu": [t for r in runs for t in r["cpu"][0::2]],
        "background": [statistics.mean(r["background"] for r in runs)],
        "server": [statistics.mean(r["server"] for r in runs)],
        "faults": [f for r in runs for f in r["faults"][1::2]],
        "twin_faults": [f for r in runs for f in r["faults"][0::2]],
        "placement": [placement],
        "wall": wall,
        "cpu": cpu,
    }


def pooled(blocks: list[dict[str, list[float]]]) -> dict[str, float]:
    """The blocks' steps together: medians of the step and of the extras (with their intervals),
    mean faults and background."""
    got = {k: [v for b in blocks for v in b[k]] for k in blocks[0]}
    out = {
        "step": statistics.median(got["step"]),
        "step_cpu": statistics.median(got["step_cpu"]),
        "background": statistics.mean(got["background"]),
        "server": statistics.mean(got["server"]),
        "faults": statistics.mean(got["faults"]),
        "twin_faults": statistics.mean(got["twin_faults"]),
        "spread": max(statistics.median(b["cpu"]) for b in blocks) - min(statistics.median(b["cpu"]) for b in blocks),
        "placement": max((b["placement"][0] for b in blocks), key=abs),
    }
    for name in ("wall", "cpu"):
        out[name] = statistics.median(got[name])
        out[name + "_lo"], out[name + "_hi"] = median_interval(got[name])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tensors", default="80,400,1600", help="parameter tensor counts (even; default 80,400,1600)")
    ap.add_argument("--steps", type=int, default=300, help="watched steps timed per count (default 300)")
    ap.add_argument(
        "--blocks",
        type=int,
        default=1,
        help="fresh copies this many times per variant, alternating, steps split (default 1)",
    )
    ap.add_argument("--width", type=int, default=8, help="in and out features of each Linear (default 8)")
    ap.add_argument(
        "--model",
        choices=("tiny", "mlp", "gpt", "wide"),
        default="tiny",
        help="tiny Linear layers (--tensors, --width), or one of overhead.py's models with AdamW, "
        "held to 0.5%% of its step all told",
    )
    ap.add_argument("--server", choices=("local", "none"), default="local", help="a real local server, or none")
    ap.add_argument("--aa", action="store_true", help="also time an unwatched copy against its twin (A/A)")
    ap.add_argument(
        "--flight-recorder", action="store_true", help="watch with the flight recorder on (on a GPU's default)"
    )
    ap.add_argument(
        "--ballast",
        action="store_true",
        help="keep every core busy at the lowest priority while the hook's other threads and the server "
        "are read (a VM that charges a waking thread for its idle vCPU: what is left is their work)",
    )
    ap.add_argument(
        "--keep-loss",
        action="store_true",
        help="keep each step's loss until the next step's forward, as a loop that assigns `loss = ...` "
        "does (autograd then reuses the parameters' gradient accumulator nodes: any hook left on them costs)",
    )
    ap.add_argument(
        "--malloc",
        choices=("steady", "default"),
        default="steady",
        help="glibc's malloc held steady (no trimming, no mmap below 32 MiB; the default) or left as it is",
    )
    args = ap.parse_args(argv)
    try:
        counts = [int(c) for c in args.tensors.split(",")]
    except ValueError:
        ap.error("--tensors is a comma-separated list of whole numbers")
    if (
        args.steps < 2
        or args.width < 1
        or args.blocks < 1
        or args.steps < 2 * args.blocks
        or any(c < 2 or c % 2 for c in counts)
    ):
        ap.error(
            "--steps must be 2 or more a block, --width and --blocks 1 or more, and each tensor count even and 2 or more"
        )
    global KEPT
    KEPT = {} if args.keep_loss else None
    task = None if args.model == "tiny" else args.model
    if task is not None:
        counts = [len(list(model(2, 1, task)[0].parameters()))]
    steady = args.malloc == "steady" and steady_malloc()
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    logging.getLogger("gradwatch").setLevel(logging.ERROR)  # not "kept in the spool": it is deleted
    ballast = Ballast() if args.ballast else None
    with tempfile.TemporaryDirectory(prefix="gradwatch-bench-") as tmp:
        os.environ["GRADWATCH_SPOOL"] = tmp
        proc, url = start_server(Path(tmp)) if args.server == "local" else (None, NOWHERE)
        try:
            layers = f"overhead.py's {task}, AdamW" if task else f"SGD, Linear({args.width}, {args.width}) layers"
            print(
                f"torch {torch.__version__}, 1 thread, {layers}, "
                f"{'a local server' if proc else 'no server (spooling)'}; {args.steps} watched steps each, alternating with twin steps"
                + (f", in {args.blocks} blocks of fresh copies" if args.blocks > 1 else "")
                + ("; the flight recorder on" if args.flight_recorder else "")
                + ("; malloc held steady" if steady else "; malloc as it is")
                + ("; each loss kept until the next forward" if KEPT is not None else "")
                + ("; the background read with every core kept busy (--ballast)" if ballast else "")
            )
            print(wake_line())
            print(
                "tensors | variant | step ms | extra us, wall (90% interval) | extra us, CPU (90% interval) "
                "| other threads us | server us | faults, copy / twin | blocks' CPU spread | placement us | "
                + ("all told, % of the twin's CPU step | target %" if task else "target us")
                + " | met"
            )
            met = True
            variants = [("watched", url)] + ([("A/A", None)] if args.aa else [])
            for n in counts:
                got: dict[str, list[dict[str, list[float]]]] = {name: [] for name, _ in variants}
                for b in range(args.blocks):  # the variants alternate by block, each with fresh copies,
                    for name, where in variants:  # made copy first in every other block
                        steps = -(-args.steps // args.blocks)
                        pid = proc.pid if proc is not None and where is not None else None
                        got[name].append(
                            measure(n, args.width, steps, where, args.flight_recorder, b % 2 == 1, task, pid, ballast)
                        )
                for name, where in variants:
                    r = pooled(got[name])
                    told = (r["cpu_hi"] + r["background"] + r["server"]) / r["step_cpu"]  # the interval's top
                    if task:
                        ok = told <= MODEL_TARGET
                        goal = f"{told * 100:+8.2f} of {r['step_cpu'] * 1e3:8.2f} ms | {MODEL_TARGET * 100:8.1f}"
                    else:
                        ok = min(r["wall_hi"], r["cpu_hi"]) * 1e6 <= target_us(n)
                        goal = f"{target_us(n):9.0f}"
                    met &= ok or where is None
                    print(
                        f"{n:7d} | {name:7s} | {r['step'] * 1e3:7.2f} | {r['wall'] * 1e6:+7.1f} ({r['wall_lo'] * 1e6:+.1f} "
                        f"to {r['wall_hi'] * 1e6:+.1f}) | {r['cpu'] * 1e6:+7.1f} ({r['cpu_lo'] * 1e6:+.1f} to "
                        f"{r['cpu_hi'] * 1e6:+.1f}) | {r['background'] * 1e6:16.0f} | {r['server'] * 1e6:9.0f} | "
                        f"{r['faults']:7.1f} / {r['twin_faults']:<7.1f} | {r['spread'] * 1e6:18.0f} | "
                        f"{r['placement'] * 1e6:+12.0f} | {goal} | "
                        f"{'yes' if ok else 'no'}"
                    )
            print(
                (
                    "target met (all told, with the upper bound of the CPU interval)"
                    if task
                    else "target met at every count (the upper bound of the wall or CPU interval)"
                )
                if met
                else "target NOT met at some count"
            )
        finally:
            if proc is not None:
                stop_server(proc)
            if ballast is not None:
                ballast.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

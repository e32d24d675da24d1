"""The server's CPU per stored step of overhead.py's MLP, `every=1` by default (issue 27).

A real `gradwatch serve` on SQLite (overhead.py's: a subprocess of its own, which imports the
code PYTHONPATH names before the installed one), the MLP of overhead.py (40 Linear(256), 80 tensors, AdamW) watched with
`every=1`, one torch thread, at the training's own pace. After `--warmup` steps (acked), each of
`--rounds` rounds runs `--steps` steps, waits until the server has acknowledged all of them, and
reads the server's CPU (its threads' run time from /proc/PID/task/*/schedstat, and its process's
CPU clock as overhead.py reads it) and the hook's threads' CPU before and after: CPU
per stored step, the median of the rounds and each of them. The hook sends every `linger` (5 s
while no browser watches), so a round of N steps holds N / (5 s x steps a second) batches.

    OMP_NUM_THREADS=1 PYTHONPATH=$PWD/trainer_hook:$PWD/backend python benchmarks/server_cpu.py \\
        [--steps 300] [--rounds 3] [--warmup 30] [--every N] [--profile out.txt]

`--every N` watches with `every=N` (`--every 1000000000`: unmeasured steps only, what the server
spends on each step of an `every="auto"` run between its measured ones).

`--profile FILE` samples the server with py-spy (`PYSPY`, default /tmp/pyspy/bin/py-spy; the thread
holding the GIL, 1,000 times a second: where its Python spends CPU) during
the rounds and writes its collapsed stacks to FILE, then prints each function's share of the
samples (own and with its callees) and the CPU per stored step it stands for.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import gradwatch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead import acked, hook_threads_cpu, mlp_task, process_cpu, start_server, stop_server, wake_line  # noqa: E402


def tasks_cpu(pid: int) -> float:
    """CPU seconds so far of the live threads of process `pid`, in nanoseconds of each one's
    run time (/proc/PID/task/*/schedstat: finer than /proc/PID/stat's 10 ms ticks, too coarse for a
    round of a few hundred steps; a thread that ended is left out)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):  # it ended meanwhile
            pass
    return total / 1e9


def summarize(collapsed: Path, per_step: float, top: int = 25) -> None:
    """Print the functions with the largest share of py-spy's samples (own, and with callees)."""
    own: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        frames = [
            f.split(" (")[0] + " (" + f.split(" (")[-1].split(":")[0].rsplit("/", 1)[-1] + ")" for f in stack.split(";")
        ]
        samples += n
        own[frames[-1]] += n
        for f in set(frames):
            total[f] += n
    if not samples:
        print("no samples")
        return
    print(f"\n{samples} samples; a share of them stands for that share of {per_step * 1e3:.3f} ms a stored step")
    print("\nwith callees:")
    for name, n in total.most_common(top):
        print(f"  {n / samples:6.1%} {n / samples * per_step * 1e3:7.3f} ms  {name}")
    print("\nown:")
    for name, n in own.most_common(top):
        print(f"  {n / samples:6.1%} {n / samples * per_step * 1e3:7.3f} ms  {name}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=300, help="steps a round (default 300)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--profile", type=Path, help="py-spy's collapsed stacks of the server go here")
    ap.add_argument("--every", type=int, default=1, help="watch(every=N): 10**9 for unmeasured steps only (default 1)")
    args = ap.parse_args()
    if args.every < 1:
        ap.error("--every must be at least 1")
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        os.environ["GRADWATCH_SPOOL"] = str(tmp / "spool")
        server, url = start_server(tmp)
        try:
            model, loss_fn = mlp_task()
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
            w = gradwatch.watch(
                opt, model=model, run="server-cpu", project="bench", server=url, every=args.every, warn=False
            )

            def step() -> None:
                opt.zero_grad(set_to_none=True)
                loss_fn(model).backward()
                opt.step()

            for _ in range(args.warmup):
                step()
            acked(w, 120)
            spy = None
            if args.profile is not None:
                pyspy = os.environ.get("PYSPY", "/tmp/pyspy/bin/py-spy")
                spy = subprocess.Popen(
                    [
                        pyspy,
                        "record",
                        "--pid",
                        str(server.pid),
                        "--format",
                        "raw",
                        "--output",
                        str(args.profile),
                        "--rate",
                        "1000",
                        "--gil",
                        "--nonblocking",
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                time.sleep(1.0)
            server_ms, ticks_ms, sender_ms = [], [], []
            for _ in range(args.rounds):
                c0, s0, t0 = tasks_cpu(server.pid), process_cpu(server.pid), hook_threads_cpu()
                for _ in range(args.steps):
                    step()
                acked(w, 120)
                n = args.steps  # every step is stored: a measured one, or an unmeasured one's facts
                server_ms.append((tasks_cpu(server.pid) - c0) / n * 1e3)
                ticks_ms.append((process_cpu(server.pid) - s0) / n * 1e3)
                sender_ms.append((hook_threads_cpu() - t0) / n * 1e3)
            w.close(timeout=30)
            if spy is not None:
                spy.send_signal(2)
                spy.wait(timeout=30)
        finally:
            stop_server(server)
    load = os.getloadavg()[0]

    def rounds(figures: list[float]) -> str:
        return f"{statistics.median(figures):.3f} ms ({', '.join(f'{x:.3f}' for x in figures)})"

    print(
        f"server CPU per stored step: {rounds(server_ms)}; by its process clock {rounds(ticks_ms)}; "
        f"the hook's threads {rounds(sender_ms)}; {args.rounds} x {args.steps} steps, every={args.every}; "
        f"load {load:.1f}"
    )
    print(wake_line())
    if args.profile is not None:
        summarize(args.profile, statistics.median(server_ms) / 1e3)


if __name__ == "__main__":
    main()

"""What gradwatch costs a distributed training step: a 2-rank job on CPU (gloo), DDP and FSDP2.

Every rank holds four copies of the model (same weights, its own optimizer), each wrapped alike
(DDP, or FSDP2 `fully_shard` on a 1-D mesh): the baseline, unwatched; an A/A copy, unwatched too
(the method's own bias and noise); `every=1`, watched on every rank and measuring every step;
`every="auto"` (0.4% budget). Each watched copy streams, rank by
rank, to one local `gradwatch serve`, as a job does.

The steps are interleaved as in benchmarks/overhead.py: a cycle visits the watched variants in a
shuffled order (the same on every rank: each step's collectives pair the ranks' copies); for each,
the baseline steps once untimed, then the baseline, the variant and the baseline again, and the
variant's overhead is its step time against the mean of the two baseline steps beside it, on
rank 0 (every step ends in a collective, so the ranks keep step). The figure is the median over
cycles with a 90% bootstrap interval. Every variant first takes WARMUP untimed steps, "auto"
AUTO_WARMUP (it learns its interval).

What this does not charge: the hooks' sender threads and the server run beside the training on
the same cores, as they would, but their CPU is not added to the figure (benchmarks/overhead.py
measures that for one process); and the variants share each rank's process, so the watched
variants' sender threads meet the baseline's steps at the GIL too (a bias against gradwatch).

    python benchmarks/distributed.py [--jobs ddp,fsdp2] [--cycles N]
"""

from __future__ import annotations

import argparse
import copy
import os
import pickle
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead import Figure, free_port, start_server, stop_server  # noqa: E402

import gradwatch  # noqa: E402

WORLD = 2
WARMUP, AUTO_WARMUP = 3, 40
CYCLES = 100
#: Each variant's `every`; None: an unwatched copy against the baseline (A/A: the method's own bias
#: and noise, which should read 0).
VARIANTS: dict[str, int | str | None] = {"aa": None, "every1": 1, "auto": "auto"}
LABELS = {"aa": "A/A (an unwatched copy)", "every1": "gradwatch every=1", "auto": 'gradwatch every="auto"'}
JOBS = ("ddp", "fsdp2")


def build() -> nn.Module:
    """An MLP of 16 x Linear(256, 256): 32 tensors, 1.05M parameters."""
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(256, 256), nn.ReLU()) for _ in range(16)])


def wrap(model: nn.Module, job: str) -> nn.Module:
    if job == "ddp":
        return nn.parallel.DistributedDataParallel(model)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (WORLD,))
    for block in model:
        fully_shard(block, mesh=mesh)
    return fully_shard(model, mesh=mesh)


class Copy:
    """One copy of the model on this rank, with its optimizer and, if watched, its watcher."""

    def __init__(self, model: nn.Module, job: str, x: torch.Tensor) -> None:
        self.model = wrap(copy.deepcopy(model), job)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.x = x
        self.watcher: gradwatch.Watcher | None = None

    def step(self) -> tuple[float, bool]:
        """Seconds of one training step, and whether the hook measured it."""
        measured = self.watcher.measured_steps if self.watcher is not None else 0
        t0 = time.perf_counter()
        self.opt.zero_grad(set_to_none=True)
        self.model(self.x).pow(2).mean().backward()
        self.opt.step()
        took = time.perf_counter() - t0
        return took, self.watcher is not None and self.watcher.measured_steps > measured


def rank_main(rank: int, port: int, url: str, job: str, cycles: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD))
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)  # decayed Adam state turns denormal and slows every copy alike
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    model = build()
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(rank))
    baseline = Copy(model, job, x)
    variants = {name: Copy(model, job, x) for name in VARIANTS}
    for name, every in VARIANTS.items():
        if every is None:
            continue
        v = variants[name]
        v.watcher = gradwatch.watch(
            v.opt, model=v.model, run=f"bench-{job}-{name}", project="bench", server=url, every=every, warn=False
        )
    for name, v in variants.items():
        for _ in range(AUTO_WARMUP if name == "auto" else WARMUP):
            v.step()
    for _ in range(WARMUP):
        baseline.step()
    ratios: dict[str, list[float]] = {name: [] for name in VARIANTS}
    measured: dict[str, list[bool]] = {name: [] for name in VARIANTS}
    base_times: list[float] = []
    for c in range(cycles):
        order = list(VARIANTS)
        random.Random(c).shuffle(order)  # the same order on every rank
        for name in order:
            baseline.step()  # the first step after the previous variant's: untimed
            before = baseline.step()[0]
            took, was_measured = variants[name].step()
            after = baseline.step()[0]
            ratios[name].append(took / ((before + after) / 2) - 1)
            measured[name].append(was_measured)
            base_times.append(after)
    for v in variants.values():
        if v.watcher is not None:
            v.watcher.close(timeout=30)
    dist.destroy_process_group()
    if rank == 0:
        Path(out).write_bytes(pickle.dumps({"ratios": ratios, "measured": measured, "base": base_times}))


def bench(job: str, cycles: int, url: str, tmp: Path) -> dict[str, Any]:
    out = tmp / f"{job}.pickle"
    mp.start_processes(rank_main, args=(free_port(), url, job, cycles, str(out)), nprocs=WORLD, start_method="spawn")
    got = pickle.loads(out.read_bytes())
    figures = {}
    for name in VARIANTS:
        f = Figure()
        f.ratios, f.measured = got["ratios"][name], got["measured"][name]
        figures[name] = f
    return {"job": job, "baseline": statistics.median(got["base"]), "figures": figures}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", default=",".join(JOBS), help=f"comma-separated subset of: {','.join(JOBS)}")
    ap.add_argument("--cycles", type=int, default=CYCLES)
    args = ap.parse_args()
    jobs = [j for j in args.jobs.split(",") if j]
    if not jobs or set(jobs) - set(JOBS):
        ap.error(f"--jobs must name some of: {','.join(JOBS)}")
    if args.cycles < 2:
        ap.error("--cycles must be 2 or more")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["GRADWATCH_SPOOL"] = str(Path(tmp) / "spool")
        server, url = start_server(Path(tmp))
        try:
            for job in jobs:
                rows.append(bench(job, args.cycles, url, Path(tmp)))
                print(f"{job}: done", flush=True)
        finally:
            stop_server(server)
    print()
    print(
        f"torch {torch.__version__}, {WORLD} ranks (gloo, 1 thread each), {os.cpu_count()} cores; steps interleaved "
        "one by one on every rank; rank 0's median overhead vs the neighbouring baseline steps (90% bootstrap "
        "interval); sender threads and server not charged"
    )
    print("| job | baseline step | cycles | " + " | ".join(LABELS[v] for v in VARIANTS) + " | auto: steps measured |")
    print("|---" * (len(VARIANTS) + 4) + "|")
    for r in rows:
        cells = []
        for f in r["figures"].values():
            low, high = f.interval()
            cells.append(f"{f.estimate():+.1%} ({low:+.1%} to {high:+.1%})")
        auto = r["figures"]["auto"].measured
        print(
            f"| {r['job']} | {r['baseline'] * 1e3:.1f} ms | {len(auto)} | "
            + " | ".join(cells)
            + f" | {sum(auto) / len(auto):.0%} |"
        )


if __name__ == "__main__":
    main()

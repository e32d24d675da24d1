"""The dashboard's reads of a big distributed job, through a real `gradwatch serve`: the run page
(`GET /api/runs/JOB`), the ranks endpoint (`GET /api/runs/JOB/ranks`), the Ranks section's
spread over a window (`GET /api/runs/JOB/ranks/spread?metric=...&steps=W`), a parameter's series
(`GET /api/runs/JOB/params/series`) and a scalar's (`GET /api/runs/JOB/series?key=loss`).

benchmarks/ranks.py measures a job as the ranks stream it, which takes minutes to admit 1,024
ranks on a small machine; the reads need only what such a job leaves in the database. So the
job is written here through the store's own write path, in-process, as the assembly leaves it
in its steady state (docs/distributed.md, "What the job keeps of each rank";
tests/support/bigjob.py, shared with the Chromium test of the 1,024-rank run page):
- every rank's hello (`Store.open_rank`: its run and its parameter list, 700 rows a rank);
- every rank's steps (`Store.write_steps`, a rank's run): the step rows of the whole job, with
  the rank's scalars and per-parameter rows for its last `--rank-rows` steps only (the assembly
  keeps 100; fewer here to keep the database small: the reads below never touch them);
- the job's global steps (`Store.write_steps`, the job's run: 4 norms, 2 cheap per-parameter
  series and the status per step, the job's scalars), a summary per rank step
  (`rank_summaries`) with their spread across the ranks per step (`rank_spread`), and, with rank R-1 lost `--lost` steps before the end, those steps partial.
Rank 7 is a straggler (its time before backward is 5x the others'): the spread's outlier.

Then a server is started on the file and each read is timed, the median of `--times` reads (ms).

    python benchmarks/job_reads.py [--ranks 1024] [--tensors 700] [--steps 300] [--window 300]
        [--rank-rows 5] [--lost 30] [--times 7] [--keep PATH]

`--keep PATH` writes the database there (and reuses it when it exists: a second run times the
reads only).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

from ranks import param_list, start_server, stop_server

from gradwatch_server.store import open_store

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # tests/support: the job's fill
from support.bigjob import fill_job  # noqa: E402

JOB = "bigjob"


def fill(path: Path, args: argparse.Namespace) -> None:
    """Write the job into a fresh SQLite file through the store (tests/support/bigjob.py)."""
    store = open_store(f"sqlite:///{path}")
    t0 = time.perf_counter()
    try:
        fill_job(store, JOB, args.ranks, param_list(args.tensors), args.steps, rank_rows=args.rank_rows, lost=args.lost)
    finally:
        store.close()
    print(f"# filled in {time.perf_counter() - t0:.1f} s, {path.stat().st_size / 2**20:.0f} MiB", flush=True)


def read_ms(url: str, times: int) -> tuple[float, int]:
    """The median of `times` reads (ms), after one read not counted, and the answer's bytes."""
    size = 0
    took = []
    for i in range(times + 1):
        t = time.perf_counter()
        with urllib.request.urlopen(url, timeout=120) as r:
            size = len(r.read())
        if i:
            took.append(time.perf_counter() - t)
    return 1000 * statistics.median(took), size


def reads(base: str, args: argparse.Namespace) -> dict[str, tuple[float, int]]:
    name = urllib.parse.quote(param_list(args.tensors)[0][0])
    job = f"{base}/api/runs/{JOB}"
    urls = {
        "run page": job,
        "ranks": f"{job}/ranks",
        **{
            f"spread {m} ({args.window} steps)": f"{job}/ranks/spread?metric={m}&steps={args.window}"
            for m in ("time/step_s", "time/before_backward_s", "memory", "grad_norm_total")
        },
        "param series": f"{job}/params/series?metric=grad_norm&param={name}",
        "scalar series": f"{job}/series?key=loss",
    }
    return {label: read_ms(url, args.times) for label, url in urls.items()}


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--ranks", type=int, default=1024)
    p.add_argument("--tensors", type=int, default=700)
    p.add_argument("--steps", type=int, default=300, help="global steps of the job (default 300)")
    p.add_argument("--window", type=int, default=300, help="the spread's window in steps (default 300)")
    p.add_argument("--rank-rows", type=int, default=5, help="steps whose per-rank rows are kept (default 5)")
    p.add_argument("--lost", type=int, default=30, help="the last rank stops this many steps early (default 30)")
    p.add_argument("--times", type=int, default=7, help="reads per endpoint, the median kept (default 7)")
    p.add_argument("--keep", type=Path, help="the database file (reused when it exists)")
    args = p.parse_args(argv)
    if args.ranks < 2 or args.tensors < 1 or args.steps < 2 or not 0 <= args.lost < args.steps:
        p.error("--ranks 2 or more, --tensors 1 or more, --steps 2 or more, --lost below --steps")
    if not 1 <= args.rank_rows <= args.steps or args.window < 1 or args.times < 1:
        p.error("--rank-rows between 1 and --steps; --window and --times 1 or more")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    print(
        f"# {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; {args.ranks} ranks x {args.tensors} tensors, "
        f"{args.steps} steps, rank {args.ranks - 1} lost for the last {args.lost}",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="gw-job-reads-") as tmp:
        path = args.keep or Path(tmp) / "job.db"
        if not path.exists():
            fill(path, args)
        proc, base = start_server(f"sqlite:///{path}", 1, 30.0)
        try:
            found = reads(base, args)
        finally:
            stop_server(proc)
    print(f"\n| read ({args.ranks} ranks x {args.tensors} tensors) | median ms | bytes |\n|---|---:|---:|")
    for label, (ms, size) in found.items():
        print(f"| {label} | {ms:.0f} | {size:,} |")
    print(f"# load {os.getloadavg()[0]:.1f} at the end", file=sys.stderr)


if __name__ == "__main__":
    main()

"""One commit's share of `benchmarks/compare.py`: run with that commit's interpreter, it measures
that commit's code through its public interfaces only, so that one script measures old and new
code alike: `python -m gradwatch_server` (serve, sync, export), the HTTP endpoints, and
`gradwatch.watch()`. It prints one JSON object (its figures) as its last line.

    python compare_workload.py storage --spool FILE --run ID --steps N --params P --folder DIR
    python compare_workload.py hook --model mlp|gpt --cycles N --folder DIR

storage  a fresh SQLite server; the spool file (the hook's format, built by compare.py) copied
         into an empty spool folder and replayed with `gradwatch sync`: parameter-rows/s from the
         command's start to its exit (what a user waits for; the sync's Python start included)
         and the CPU seconds of the server and the sync command together; then `gradwatch export
         RUN --format csv` of the database (the server idle): seconds and CPU seconds (Python's
         start included); then one parameter's series, the loss, and the grad_norm heatmap over
         HTTP (median of --reads after one warm-up). On a loaded machine the CPU seconds are the
         steadier figures: a wall time there is mostly waiting for a core.
hook     a model and its unwatched twin (same weights, same batch, own AdamW) in this process,
         the model watched with every=1 by a local server of its own; a cycle steps the twin
         once untimed, then the twin, the watched model and the twin again; the cycle's overhead
         is the watched step against the mean of the twin steps beside it. Median over cycles.
         Also the server's CPU per watched step (storing it, its diagnostics), which runs beside
         the training on the same cores and which the paired ratio does not charge.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))  # tests/support: a real server process

from support.server import ServerProcess, server_env, start_server  # noqa: E402


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=300) as response:
        return response.read()


def children_cpu() -> float:
    """User + system CPU seconds of the child processes waited for so far (theirs included)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def cli(*args: str, env: dict[str, str]) -> tuple[float, float]:
    """(seconds, CPU seconds) that `gradwatch ARGS` takes, in a process of its own (and those it
    starts); raises on failure."""
    cpu0, t0 = children_cpu(), time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "gradwatch_server", *args], capture_output=True, text=True, env=env)
    seconds, cpu = time.perf_counter() - t0, children_cpu() - cpu0
    if done.returncode != 0:
        raise RuntimeError(f"gradwatch {' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return seconds, cpu


def stored_steps(server: ServerProcess, run_id: str) -> int:
    return int(json.loads(get(f"{server.url}/api/runs/{run_id}"))["steps"])


def median_read(url: str, reads: int) -> float:
    get(url)
    times = []
    for _ in range(reads):
        t0 = time.perf_counter()
        get(url)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def storage(args: argparse.Namespace) -> dict[str, Any]:
    folder = Path(args.folder)
    spool = folder / "spool"
    spool.mkdir(parents=True)
    shutil.copy(args.spool, spool / Path(args.spool).name)
    db_url = f"sqlite:///{folder / 'bench.db'}"
    env = server_env()
    server = start_server(folder, db_url=db_url)
    try:
        server_cpu0 = cpu_seconds(server.proc.pid)
        sync_s, sync_cpu = cli("sync", "--server", server.url, "--spool", str(spool), env=env)
        server_cpu = cpu_seconds(server.proc.pid) - server_cpu0
        steps = stored_steps(server, args.run)
        if steps != args.steps or list(spool.glob("*.spool")):
            raise RuntimeError(f"the sync stored {steps} of {args.steps} steps (spool: {list(spool.iterdir())})")
        # The export reads the database itself, as `gradwatch export --db` does; the server idles.
        export_s, export_cpu = cli(
            "export", args.run, "--format", "csv", "-o", str(folder / "run.csv"), "--db", db_url, env=env
        )
        with open(folder / "run.csv") as f:
            lines = sum(1 for _ in f)
        if lines != args.steps * args.params + 1:
            raise RuntimeError(f"the export has {lines} lines, not {args.steps * args.params + 1}")
        (folder / "run.csv").unlink()
        base = f"{server.url}/api/runs/{args.run}"
        param = urllib.parse.quote(args.param)
        series_s = median_read(f"{base}/params/series?metric=grad_norm&param={param}&max_points=2000", args.reads)
        loss_s = median_read(f"{base}/series?key=loss&max_points=2000", args.reads)
        heatmap_s = median_read(f"{base}/heatmap?metric=grad_norm&max_steps=1000", args.reads)
    finally:
        server.stop()
    rows = args.steps * args.params
    return {
        "ingest rows/s": rows / sync_s,
        "ingest CPU s (server + sync)": server_cpu + sync_cpu,
        "ingest server CPU s": server_cpu,
        "export csv s": export_s,
        "export csv CPU s": export_cpu,
        "series ms": series_s * 1000,
        "loss series ms": loss_s * 1000,
        "heatmap ms": heatmap_s * 1000,
    }


def hook(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    import gradwatch

    sys.path.insert(0, str(HERE))
    from overhead import gpt_task, mlp_task  # the models of the overhead benchmark

    torch.manual_seed(0)
    torch.set_flush_denormal(True)
    model, loss_fn = (mlp_task if args.model == "mlp" else gpt_task)()
    twin = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    twin_opt = torch.optim.AdamW(twin.parameters(), lr=1e-4)

    def step(m: torch.nn.Module, o: torch.optim.Optimizer) -> float:
        t0 = time.perf_counter()
        o.zero_grad(set_to_none=True)
        loss_fn(m).backward()
        o.step()
        return time.perf_counter() - t0

    folder = Path(args.folder)
    server = start_server(folder)
    try:
        w = gradwatch.watch(
            opt, model=model, server=server.url, every=1, run=f"compare-{args.model}", project="compare"
        )
        for _ in range(args.warmup):
            step(model, opt)
            step(twin, twin_opt)
        ratios, twins = [], []
        server_cpu0 = cpu_seconds(server.proc.pid)
        for _ in range(args.cycles):
            step(twin, twin_opt)  # the first step after the other model's is slower: untimed
            before = step(twin, twin_opt)
            watched = step(model, opt)
            after = step(twin, twin_opt)
            ratios.append(watched / ((before + after) / 2) - 1)
            twins.append((before + after) / 2)
        w.close()  # flushes: the server has stored every step when it returns
        server_cpu = cpu_seconds(server.proc.pid) - server_cpu0
    finally:
        server.stop()
    return {
        f"hook every=1 {args.model} overhead %": statistics.median(ratios) * 100,
        f"hook {args.model} twin step ms": statistics.median(twins) * 1000,
        f"hook {args.model} server CPU ms/step": server_cpu / args.cycles * 1000,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    s = commands.add_parser("storage")
    s.add_argument("--spool", required=True)
    s.add_argument("--run", required=True)
    s.add_argument("--param", required=True, help="the parameter whose series is read")
    s.add_argument("--steps", type=int, required=True)
    s.add_argument("--params", type=int, required=True)
    s.add_argument("--reads", type=int, default=5)
    s.add_argument("--folder", required=True)
    h = commands.add_parser("hook")
    h.add_argument("--model", choices=["mlp", "gpt"], required=True)
    h.add_argument("--cycles", type=int, required=True)
    h.add_argument("--warmup", type=int, default=3)
    h.add_argument("--folder", required=True)
    args = parser.parse_args(argv)
    result = storage(args) if args.command == "storage" else hook(args)
    print(json.dumps(result))


if __name__ == "__main__":
    main()

"""How large a distributed job one `gradwatch serve` takes: N simulated ranks speaking the real
protocol (docs/protocol.md, "Distributed training") to a real server process, at a step period.

Each simulated rank is what a rank's hook puts on the wire and nothing else: its hello (`dist`,
the job's parameter list with its own `local_numel`/`counted`), then one `step` frame per step
on schedule, every rank on the same clock, and a `close`. The frames are built with the hook's
own message builders (`gradwatch.wire`) once per rank, so the simulator costs a string format
per frame: the ranks of a configuration run as asyncio tasks in a few processes (`--procs`).
Step frames go as binary frames (protocol v3, their arrays raw) to a server whose welcome lists
version 3, as the hook sends them, else as JSON (`--frames json`: JSON always).
`--kind ddp`: replicas (the same local norms on every rank, counted on rank 0); `--kind fsdp`:
each rank its own shard of every tensor, all counted. With `--every N`, steps between the
measured ones carry only their cheap facts (no norms, no status), as the hook sends them.

A rank connects as the hook does (open timeout 2 s, welcome within 30 s, else a retry after an
exponential backoff with jitter) and keeps what the server has not acknowledged: after a dropped
connection it resends from the `last_seq` of the new welcome. Its steps start on schedule
whether or not it is connected yet (watch() never waits for the server); a step waits in the
rank until its connection is up.

Printed per (ranks, tensors, period), the steps of the job's run as a browser watching it live
receives them (`/ws/live?run=JOB`, published once stored):
- admit: seconds from the ranks' first connect to the last welcome;
- lag p50/p95/max: seconds from the last rank's frame of a step to the stored global step;
- cpu/rank-step: the server's CPU seconds (its process and workers) from the first scheduled
  step to the last rank's close, per rank and step stored (ms);
- steady: the same over the job's middle third only (stored steps a third to two thirds in),
  once the hellos are done: what a rank-step costs the server (printed with each `# done`);
- rss: the server's largest resident memory seen (MiB);
- bytes/step: growth of the database's used pages per global step (SQLite) over the job's
  second half (the steady state: a rank's per-parameter rows older than the Ranks view's window
  are pruned, docs/distributed.md; the job needs well over twice that window of steps to show
  it: --steps 250 or more, else the whole job is measured), against a one-process run of the same tensors on a server of its own (`1p`), and the
  target 1.5 x 1p + 100 B per rank;
- errors: connects that failed or timed out, and connections dropped;
- partial: the job's partial steps (GET /ranks), and its lost ranks;
- reads: the median of 5 reads each, once the steps are in, of the run page's
  `GET /api/runs/JOB`, `GET /api/runs/JOB/ranks`, one parameter's
  `GET /api/runs/JOB/params/series` and the Ranks section's spread of step times
  `GET /api/runs/JOB/ranks/spread?metric=time/step_s` (ms).

    python benchmarks/ranks.py [--ranks 8,32,64] [--tensors 700] [--period 1] [--steps 60]
        [--kind ddp|fsdp] [--every 1] [--procs N] [--workers N] [--db URL] [--frames binary|json]

The figures are the server's under the load of the simulator on the same machine (a 2-core box
shares its cores between them): the load average is printed with each row.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing as mp
import os
import random
import shlex
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import websockets
from websockets.exceptions import ConnectionClosed, InvalidHandshake

#: The hook's connection limits (gradwatch/connection.py, sender.py): a connect that does not
#: open in OPEN_TIMEOUT_S or whose welcome does not come in WELCOME_TIMEOUT_S is retried after
#: a backoff doubling from BACKOFF_S to BACKOFF_MAX_S, times a jitter in [0.5, 1.5).
OPEN_TIMEOUT_S, WELCOME_TIMEOUT_S = 10.0, 30.0
BACKOFF_S, BACKOFF_MAX_S = 0.1, 5.0
#: The server's answer to a hello whose digest it does not know: send the full list (protocol v2).
CLOSE_NEED_PARAMS = 4002
#: Most that a rank waits, after its last step, for the server to acknowledge everything.
DRAIN_S = 120.0
#: Per-rank bytes allowed beyond 1.5x a one-process run (the per-rank summary of a step).
SUMMARY_BYTES = 100
#: A job of at least this many steps has its bytes measured over its second half: beyond the
#: ranks' per-parameter window (100 steps) and its pruning period (25), twice over. A shorter
#: one is measured whole (the ranks' window is then all kept: the figure is the worst case).
STEADY_STEPS = 250


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- the frames ------------------------------------------------------------------------------


def param_list(tensors: int) -> list[tuple[str, list[int]]]:
    """`tensors` parameters shaped like a transformer's: weights and biases of blocks."""
    out: list[tuple[str, list[int]]] = []
    i = 0
    while len(out) < tensors:
        for name, shape in (
            ("attn.qkv.weight", [3072, 1024]),
            ("attn.qkv.bias", [3072]),
            ("mlp.fc.weight", [4096, 1024]),
            ("mlp.fc.bias", [4096]),
            ("mlp.proj.weight", [1024, 4096]),
            ("ln.weight", [1024]),
            ("ln.bias", [1024]),
        ):
            out.append((f"blocks.{i}.{name}", shape))
        i += 1
    return out[:tensors]


@dataclass(frozen=True)
class Spec:
    ranks: int
    tensors: int
    period: float
    steps: int
    kind: str
    every: int
    job: str
    hello: str = "v2"  # "v2": rank 0 sends the list, the others its digest (wire.rank_hellos); "v1": all send it
    admit_only: bool = False  # each rank closes once welcomed: times the job's start alone
    #: "digest": a DDP replica's measured steps carry its grad_digest, no arrays (the hook on v2);
    #: "arrays": its per-parameter arrays (the hook before it, or on a v1 server)
    replicas: str = "digest"
    #: "binary": step frames as binary (protocol v3) to a server whose welcome lists version 3,
    #: as the hook sends them (JSON to one that does not); "json": JSON text frames always
    frames: str = "binary"


def _hellos(spec: Spec, rank: int) -> list[str]:
    """The hellos the rank tries in turn, as the hook does (gradwatch.wire.rank_hellos): with
    `--hello v2`, its job's list named by digest (rank > 0), in full (rank 0, or when the server
    asks with close code 4002), then v1; with `--hello v1`, v1 only."""
    from gradwatch import wire

    params = []
    for name, shape in param_list(spec.tensors):
        numel = math.prod(shape)
        if spec.kind == "ddp":
            local, counted = numel, rank == 0
        else:  # fsdp: dim 0 split across the ranks, every piece counted
            rows = shape[0]
            share = rows // spec.ranks + (1 if rank < rows % spec.ranks else 0)
            local, counted = share * (numel // rows), True
        params.append(
            {
                "name": name,
                "shape": shape,
                "numel": numel,
                "dtype": "bfloat16",
                "group": 0,
                "optimizer": 0,
                "local_numel": local,
                "counted": counted,
            }
        )
    run = {
        "id": f"{spec.job}.r{rank}",
        "name": spec.job,
        "project": "bench-ranks",
        "started_at": time.time(),
        "hook_version": "0.1.0",
        "optimizer": "AdamW",
        "config": {"every": spec.every},
    }
    groups = [
        {"optimizer": 0, "index": 0, "name": None, "hparams": {"lr": 3e-4, "betas": [0.9, 0.95], "weight_decay": 0.1}}
    ]
    v1 = wire.hello(run, params, groups, {"job": spec.job, "rank": rank, "world_size": spec.ranks})
    return [wire.dumps(h) for h in (wire.rank_hellos(v1) if spec.hello == "v2" else [v1])]


#: A step frame encoded once: a JSON text frame with `%(seq)d`, `%(step)d` and `%(time)r` left to
#: fill, or a binary one (protocol v3) as its header so and its arrays' bytes.
Template = str | tuple[str, bytes]


def _templates(spec: Spec, rank: int) -> tuple[str, str, Template, Template]:
    """The rank's measured and unmeasured step frames, as JSON text, then as binary frames
    (protocol v3): encoded once, formatted per step (`_fill`)."""
    from gradwatch import wire

    n = spec.tensors
    rng = np.random.default_rng(0 if spec.kind == "ddp" else rank)  # DDP replicas agree
    scale = 1.0 if spec.kind == "ddp" else 1.0 / math.sqrt(spec.ranks)
    norms = {
        m: (rng.random(n) * scale).astype(np.float32)
        for m in ("grad_norm", "param_norm", "exp_avg_norm", "exp_avg_sq_norm")
    }
    cheap = {"backward_passes": np.ones(n, np.float32), "grad_clear": np.ones(n, np.float32)}
    timing = {
        "time/step_s": spec.period * 0.98,
        "time/before_backward_s": spec.period * (0.3 + 0.001 * (rank % 7)),
        f"mem/cuda:{rank % 8}/allocated": 4.0e10,
        f"mem/cuda:{rank % 8}/reserved": 5.0e10,
        f"mem/cuda:{rank % 8}/peak": 4.5e10,
        "mem/rss_bytes": 8.0e9,
    }
    cheap_scalars = {
        "loss": 2.5,
        "lr/0": 3e-4,
        "mem/params_bytes": 1.0e9,
        "mem/grads_bytes": 1.0e9,
        "grads/none": 0.0,
        **timing,
    }
    measured_scalars = {
        **cheap_scalars,
        "grad_norm_total": float(np.linalg.norm(norms["grad_norm"])),
        "mem/optimizer_bytes": 2.0e9,
        "hook/train_s": 0.002,
        "hook/sender_cpu_s": 0.001,
    }
    status = np.full(n, 2, np.uint8)

    def template(message: dict[str, Any]) -> str:
        message.update(seq=-111, step=-222, time=-333.5)
        return (
            wire.dumps(message)
            .replace("%", "%%")
            .replace("-111", "%(seq)d", 1)
            .replace("-222", "%(step)d", 1)
            .replace("-333.5", "%(time)r", 1)
        )

    def binary(record: Any) -> Template:
        frame = wire.binary_steps(0, [record])
        size = int.from_bytes(frame[:4], "little")
        return template(json.loads(frame[4 : 4 + size])), frame[4 + size :]

    record = wire.UnsentStep(0, 0.0, measured_scalars, {**norms, **cheap}, status)
    if spec.kind == "ddp" and rank > 0 and spec.replicas == "digest" and spec.hello == "v2":
        record = wire.digested(record)
    cheap_record = wire.UnsentStep(0, 0.0, cheap_scalars, cheap, None)
    measured = template(wire.steps(0, [record]))
    unmeasured = template(wire.steps(0, [cheap_record]))
    return measured, unmeasured, binary(record), binary(cheap_record)


def _fill(template: Template, values: dict[str, Any]) -> str | bytes:
    """A step frame from its template (`_templates`)."""
    from gradwatch import wire

    if isinstance(template, str):
        return template % values
    header, arrays = template
    return wire.binary_payload(header % values, arrays)


# -- a simulated rank ------------------------------------------------------------------------


@dataclass
class RankResult:
    sent: dict[int, float] = field(default_factory=dict)  # step -> when its frame left
    connect_errors: int = 0
    dropped: int = 0
    welcomed: float | None = None  # first welcome
    first_try: float | None = None
    acked: int = 0
    asked: int = 0  # hellos the server answered with "send the full list" (close code 4002)
    binary: bool = False  # its last connection's server read binary step frames (and got them)


async def _rank(
    spec: Spec,
    rank: int,
    url: str,
    t0: float,
    result: RankResult,
    frames: tuple[list[str], str, str, Template, Template],
) -> None:
    from gradwatch import wire

    hellos, measured, unmeasured, measured_binary, unmeasured_binary = frames
    binary = False  # whether this connection's server reads binary step frames (its welcome)
    tried = 0  # which of `hellos` this connection sends
    produced = 0  # steps the "training" has made so far (on schedule from t0)
    backoff = BACKOFF_S
    done = asyncio.Event()

    def frame(step: int) -> str | bytes:
        measuring = spec.every <= 1 or step % spec.every == 1 or step == 1
        if binary:
            template = measured_binary if measuring else unmeasured_binary
        else:
            template = measured if measuring else unmeasured
        return _fill(template, {"seq": step, "step": step, "time": t0 + step * spec.period})

    async def schedule() -> None:
        nonlocal produced
        for step in range(1, spec.steps + 1):
            await asyncio.sleep(max(0.0, t0 + step * spec.period - time.time()))
            produced = step
            wake.set()
        done.set()
        wake.set()

    wake = asyncio.Event()
    clock = asyncio.create_task(schedule())
    result.first_try = time.time()
    try:
        while True:
            try:
                async with asyncio.timeout(OPEN_TIMEOUT_S):
                    ws = await websockets.connect(
                        url, max_size=None, compression=None, open_timeout=None, ping_interval=None
                    )
                try:
                    await ws.send(hellos[tried])
                    async with asyncio.timeout(WELCOME_TIMEOUT_S):
                        welcome = json.loads(await ws.recv())
                except BaseException:
                    await ws.close()
                    raise
                if welcome.get("type") != "welcome":
                    code = await _close_code(ws)
                    if code == CLOSE_NEED_PARAMS and tried + 1 < len(hellos):
                        tried += 1  # the server asks for the list: not a failed connect
                        result.asked += 1
                        continue
                    if "unsupported protocol version" in str(welcome.get("message")):
                        tried = len(hellos) - 1
                    raise ConnectionError(f"rank {rank}: {welcome}")
            except (OSError, TimeoutError, ConnectionClosed, InvalidHandshake, ConnectionError):
                result.connect_errors += 1
                await asyncio.sleep(backoff * (0.5 + random.random()))
                backoff = min(backoff * 2, BACKOFF_MAX_S)
                continue
            backoff = BACKOFF_S
            binary = result.binary = spec.frames == "binary" and wire.reads_binary(welcome)
            if result.welcomed is None:
                result.welcomed = time.time()
            if spec.admit_only:  # the start alone: leave once welcomed (what a close costs is not timed)
                await ws.close()
                return
            next_step = int(welcome["last_seq"]) + 1
            result.acked = max(result.acked, next_step - 1)
            reader = asyncio.create_task(_read_acks(ws, result, spec.steps + 1))
            try:
                while True:
                    while next_step <= produced:
                        await ws.send(frame(next_step))
                        result.sent[next_step] = time.time()
                        next_step += 1
                    if done.is_set() and next_step > spec.steps:
                        await ws.send(
                            json.dumps({"v": 1, "type": "close", "seq": spec.steps + 1, "status": "finished"})
                        )
                        async with asyncio.timeout(DRAIN_S):
                            await reader
                        await ws.close()
                        return
                    wake.clear()
                    waiter = asyncio.create_task(wake.wait())
                    await asyncio.wait([waiter, reader], return_when=asyncio.FIRST_COMPLETED)
                    waiter.cancel()
                    if reader.done():
                        reader.result()  # raises what ended it
                        raise ConnectionError("closed")
            except (OSError, ConnectionClosed, ConnectionError, TimeoutError):
                result.dropped += 1
                reader.cancel()
                await ws.close()
                continue
    finally:
        clock.cancel()


async def _close_code(ws: Any) -> int | None:
    """The close code that follows the server's error frame (None if none comes soon)."""
    try:
        async with asyncio.timeout(2.0):
            await ws.recv()
    except ConnectionClosed as exc:
        return None if exc.rcvd is None else int(exc.rcvd.code)
    except TimeoutError:
        pass
    await ws.close()
    return None


async def _read_acks(ws: Any, result: RankResult, last: int) -> None:
    """Read what the server sends (an unread ack would stall it) until `last` is acknowledged."""
    async for raw in ws:
        message = json.loads(raw)
        if message.get("type") == "ack":
            result.acked = max(result.acked, int(message["seq"]))
            if result.acked >= last:
                return
        elif message.get("type") == "error":
            raise ConnectionError(message.get("message"))
    raise ConnectionError("closed by the server")


def _ranks_process(spec: Spec, ranks: list[int], url: str, t0: float, out: Any) -> None:
    """One simulator process: its ranks as asyncio tasks; their results to `out`."""
    results = {r: RankResult() for r in ranks}

    async def main() -> None:
        # Report what the ranks have before the parent's deadline (it stops this process then):
        # ranks still waiting for their last acks keep what they measured.
        left = t0 + spec.steps * spec.period + DRAIN_S - 10.0 - time.time()
        tasks = [asyncio.create_task(_rank(spec, r, url, t0, results[r], frames[r])) for r in ranks]
        await asyncio.wait(tasks, timeout=max(1.0, left))
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # Every rank's frames before any connects: built inside the ranks' tasks, they held this
    # process's event loop for seconds, and the connects already started timed out meanwhile.
    frames = {r: (_hellos(spec, r), *_templates(spec, r)) for r in ranks}
    time.sleep(max(0.0, t0 - 1.0 - time.time()))  # every process's ranks connect together: a crowd
    asyncio.run(main())
    out.put(
        {
            r: (
                res.sent,
                res.connect_errors,
                res.dropped,
                res.welcomed,
                res.first_try,
                res.acked,
                res.asked,
                res.binary,
            )
            for r, res in results.items()
        }
    )


# -- the server and what is measured ---------------------------------------------------------


def start_server(db: str, workers: int, rank_timeout: float) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    exe = Path(sys.executable).with_name("gradwatch")
    args = [
        str(exe),
        "serve",
        "--db",
        db,
        "--port",
        str(port),
        "--rank-timeout",
        str(rank_timeout),
        "--log-level",
        "warning",
    ]
    if workers > 1:
        args += ["--workers", str(workers)]
    # A profiler to run the server under, e.g. BENCH_RANKS_SERVER_WRAP="python -m cProfile -o out.prof"
    # (the server then runs as `python -m cProfile ... gradwatch serve ...`).
    args = shlex.split(os.environ.get("BENCH_RANKS_SERVER_WRAP", "")) + args
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            urllib.request.urlopen(url + "/api/health", timeout=1)
            return proc, url
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.05)
    proc.kill()
    err = proc.stderr.read().decode() if proc.stderr else ""
    raise SystemExit(f"the gradwatch server did not start: {err[-2000:]}")


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def server_cpu(proc: psutil.Process) -> float:
    """CPU seconds of the server and its worker processes so far."""
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def server_rss(proc: psutil.Process) -> int:
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def used_bytes(path: Path) -> int:
    """The SQLite database's used pages (the WAL's committed ones included), in bytes."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        size = con.execute("pragma page_size").fetchone()[0]
        pages = con.execute("pragma page_count").fetchone()[0]
        free = con.execute("pragma freelist_count").fetchone()[0]
        return int((pages - free) * size)
    finally:
        con.close()


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=60) as r:
        return json.loads(r.read())


def read_ms(url: str, times: int = 5) -> float:
    """The median of `times` reads (ms); NaN where the server has nothing to answer (a 404: no
    global step was stored, so the job has no parameter series yet), so that the table still prints."""
    took = []
    for _ in range(times):
        t = time.perf_counter()
        try:
            with urllib.request.urlopen(url, timeout=60) as r:
                r.read()
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                raise
            return float("nan")
        took.append(time.perf_counter() - t)
    return 1000 * statistics.median(took)


async def _watch_live(base: str, job: str, stored: dict[int, float], stop: asyncio.Event) -> int:
    """Record when each of the job's steps reaches a browser watching it; reconnects (and
    counts) if the server drops it for falling behind."""
    url = base.replace("http", "ws", 1) + "/ws/live?run=" + urllib.parse.quote(job)
    drops = 0
    while not stop.is_set():
        try:
            async with websockets.connect(url, max_size=None, ping_interval=None) as ws:
                while not stop.is_set():
                    try:
                        async with asyncio.timeout(0.5):
                            raw = await ws.recv()
                    except TimeoutError:
                        continue
                    message = json.loads(raw)
                    if message.get("type") == "step" and message.get("run_id") == job:
                        stored.setdefault(int(message["step"]), time.time())
        except (OSError, ConnectionClosed):
            drops += 1
            await asyncio.sleep(0.2)
    return drops


@dataclass
class Row:
    spec: Spec
    admit_s: float
    lags: list[float]
    stored: int
    cpu_ms: float
    rss_mib: float
    bytes_step: float
    one_process_bytes: float
    errors: int
    dropped: int
    partial: int
    lost: int
    reads_ms: dict[str, float]
    load: float
    asked: int = 0  # hellos answered "send the full list"
    welcomed: int = 0  # ranks welcomed
    binary: int = 0  # ranks that sent binary step frames (their server reads protocol v3)
    #: the server's CPU per rank-step over the job's middle third (stored steps a third to two
    #: thirds in): the steady state, the hellos long done (ms; NaN if the job never got there)
    steady_ms: float = float("nan")


def one_process_bytes(spec: Spec, tmp: Path) -> float:
    """Bytes per step of a one-process run of the same tensors (rank 0's frames, no `dist`)."""
    db = tmp / "one.db"
    proc, base = start_server(f"sqlite:///{db}", 1, 30.0)
    try:
        hello = json.loads(_hellos(spec, 0)[-1])  # v1: the list with its pieces
        hello.pop("dist")
        hello["run"]["id"] = spec.job + "-1p"
        for p in hello["params"]:
            p.pop("local_numel")
            p.pop("counted")
        measured, unmeasured, _, _ = _templates(spec, 0)

        async def send() -> None:
            async with websockets.connect(base.replace("http", "ws", 1) + "/ws/ingest", max_size=None) as ws:
                await ws.send(json.dumps(hello))
                await ws.recv()
                for s in range(1, spec.steps + 1):
                    t = measured if spec.every <= 1 or s % spec.every == 1 else unmeasured
                    await ws.send(t % {"seq": s, "step": s, "time": 1.0 * s})
                await ws.send(json.dumps({"v": 1, "type": "close", "seq": spec.steps + 1, "status": "finished"}))
                async for raw in ws:
                    if json.loads(raw).get("seq") == spec.steps + 1:
                        break

        before = used_bytes(db)
        asyncio.run(send())
        return (used_bytes(db) - before) / spec.steps
    finally:
        stop_server(proc)


def run_config(spec: Spec, args: argparse.Namespace, tmp: Path) -> Row:
    db_path = tmp / f"job-{spec.ranks}-{spec.tensors}-{spec.period}.db"
    db = args.db or f"sqlite:///{db_path}"
    proc, base = start_server(db, args.workers, args.rank_timeout)
    ps = psutil.Process(proc.pid)
    try:
        ingest = base.replace("http", "ws", 1) + "/ws/ingest"
        stored: dict[int, float] = {}
        procs = args.procs or max(1, min(4, math.ceil(spec.ranks / 256)))
        slices = [list(range(spec.ranks))[i::procs] for i in range(procs)]
        out: Any = mp.get_context("spawn").Queue()
        before_bytes = used_bytes(db_path) if not args.db else 0
        t0 = time.time() + 3.0 + spec.ranks / 100  # the simulator processes' start and their frames
        workers = [
            mp.get_context("spawn").Process(target=_ranks_process, args=(spec, s, ingest, t0, out)) for s in slices
        ]
        for w in workers:
            w.start()
        rss = 0
        results: dict[int, tuple[Any, ...]] = {}

        cpu0: float | None = None
        half: tuple[int, int] | None = None  # (used bytes, steps stored) at the job's half-way point
        thirds: list[tuple[float, int]] = []  # (server CPU, steps stored) at a third and two thirds

        async def watch() -> int:
            nonlocal rss, cpu0, half
            stop = asyncio.Event()
            live = asyncio.create_task(_watch_live(base, spec.job, stored, stop))
            deadline = t0 + spec.steps * spec.period + DRAIN_S
            while len(results) < spec.ranks and time.time() < deadline:
                if cpu0 is None and time.time() >= t0:  # the stepping starts: the hellos are not counted
                    cpu0 = server_cpu(ps)
                rss = max(rss, server_rss(ps))
                if len(thirds) < 2 and len(stored) >= (len(thirds) + 1) * spec.steps // 3:
                    thirds.append((server_cpu(ps), len(stored)))
                if half is None and not args.db and spec.steps >= STEADY_STEPS and len(stored) >= spec.steps // 2:
                    half = (used_bytes(db_path), len(stored))
                while not out.empty():
                    results.update(out.get())
                await asyncio.sleep(0.5)
            # the last steps reach the live socket after the ranks' acks
            end = time.time() + (0 if spec.admit_only else 10)
            while len(stored) < spec.steps and time.time() < end:
                await asyncio.sleep(0.1)
            stop.set()
            return await live

        asyncio.run(watch())
        for w in workers:
            w.join(timeout=30)
            if w.is_alive():  # its ranks never finished (not admitted by the deadline): not left behind
                w.terminate()
                w.join(timeout=5)
        cpu = server_cpu(ps) - (cpu0 or 0.0)
        sent_by_step: dict[int, float] = {}
        errors = dropped = 0
        welcomed, tries = [], []
        asked = binary = 0
        for sent, errs, drops, welcome, first_try, _acked, asks, took_binary in results.values():
            asked += asks
            binary += took_binary
            errors += errs
            dropped += drops
            if welcome is not None:
                welcomed.append(welcome)
            if first_try is not None:
                tries.append(first_try)
            for s, t in sent.items():
                sent_by_step[s] = max(sent_by_step.get(s, 0.0), t)
        lags = [stored[s] - sent_by_step[s] for s in sorted(stored) if s in sent_by_step]
        ranks_info = get_json(f"{base}/api/runs/{spec.job}/ranks")
        run = get_json(f"{base}/api/runs/{spec.job}")
        name = param_list(spec.tensors)[0][0]
        reads = {
            "run": read_ms(f"{base}/api/runs/{spec.job}"),
            "ranks": read_ms(f"{base}/api/runs/{spec.job}/ranks"),
            "series": read_ms(
                f"{base}/api/runs/{spec.job}/params/series?metric=grad_norm&param={urllib.parse.quote(name)}"
            ),
            # the Ranks section of a big job: one spread per chart (time/step_s is one of four)
            "spread": read_ms(f"{base}/api/runs/{spec.job}/ranks/spread?metric=time/step_s"),
        }
        steps_stored = int(run.get("steps") or 0)
        # steady state: the second half's growth (ranks' rows beyond the recent window are pruned)
        first, at = half if half is not None and half[1] < steps_stored else (before_bytes, 0)
        bytes_step = (used_bytes(db_path) - first) / max(1, steps_stored - at) if not args.db else float("nan")
        return Row(
            spec=spec,
            admit_s=(max(welcomed) - min(tries)) if len(welcomed) == spec.ranks and tries else float("inf"),
            lags=lags,
            stored=steps_stored,
            cpu_ms=1000 * cpu / max(1, spec.ranks * steps_stored),
            rss_mib=rss / 2**20,
            bytes_step=bytes_step,
            one_process_bytes=one_process_bytes(spec, tmp) if not args.db and not spec.admit_only else float("nan"),
            errors=errors,
            dropped=dropped,
            partial=int(ranks_info["partial"]["steps"]),
            lost=sum(1 for r in ranks_info["ranks"] if r["lost"]) + spec.ranks - len(ranks_info["ranks"]),
            reads_ms=reads,
            load=os.getloadavg()[0],
            asked=asked,
            welcomed=len(welcomed),
            binary=binary,
            steady_ms=(
                1000 * (thirds[1][0] - thirds[0][0]) / (spec.ranks * (thirds[1][1] - thirds[0][1]))
                if len(thirds) == 2 and thirds[1][1] > thirds[0][1]
                else float("nan")
            ),
        )
    finally:
        stop_server(proc)


def quantile(values: list[float], q: float) -> float:
    return float(np.quantile(values, q)) if values else float("nan")


def report_admission(rows: list[Row]) -> None:
    """`--admit-only`: the job's start alone (every rank's hello, then its close)."""
    head = ("ranks x tensors", "hello", "welcomed", "admit s", "failed connects", "dropped", "asked for list", "load")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        s = r.spec
        cells = [
            f"{s.ranks} x {s.tensors}",
            s.hello,
            f"{r.welcomed}/{s.ranks}",
            f"{r.admit_s:.1f}",
            str(r.errors),
            str(r.dropped),
            str(r.asked),
            f"{r.load:.1f}",
        ]
        print("| " + " | ".join(cells) + " |")
    print()
    for r in rows:
        ok = r.admit_s <= 10.0 and r.errors == 0 and r.dropped == 0
        print(
            f"{r.spec.ranks} x {r.spec.tensors} ({r.spec.hello}): "
            f"{'met' if ok else 'missed'}: hellos admitted within 10 s, no connection refused or dropped"
        )


def label(s: Spec) -> str:
    """A row's name in the table and its met/missed line: the kind, and for DDP what its
    replicas send (`--replicas`), so that rows of one size tell apart."""
    return f"{s.ranks} x {s.tensors} @ {s.period:g} s ({s.kind}{', replicas ' + s.replicas if s.kind == 'ddp' else ''})"


def report(rows: list[Row]) -> None:
    head = (
        "ranks x tensors @ period",
        "every",
        "stored",
        "admit s",
        "lag p50",
        "p95",
        "max",
        "cpu ms/rank-step",
        "rss MiB",
        "bytes/step",
        "1p bytes/step",
        "bytes target",
        "errors",
        "dropped",
        "partial",
        "lost",
        "run ms",
        "ranks ms",
        "series ms",
        "spread ms",
        "load",
    )
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        s = r.spec
        target = 1.5 * r.one_process_bytes + SUMMARY_BYTES * s.ranks
        cells = [
            label(s),
            str(s.every),
            f"{r.stored}/{s.steps}",
            f"{r.admit_s:.1f}",
            f"{quantile(r.lags, 0.5):.2f}",
            f"{quantile(r.lags, 0.95):.2f}",
            f"{max(r.lags) if r.lags else float('nan'):.2f}",
            f"{r.cpu_ms:.2f}",
            f"{r.rss_mib:.0f}",
            f"{r.bytes_step / 1e3:.0f} kB",
            f"{r.one_process_bytes / 1e3:.0f} kB",
            f"{target / 1e3:.0f} kB",
            str(r.errors),
            str(r.dropped),
            str(r.partial),
            str(r.lost),
            f"{r.reads_ms['run']:.0f}",
            f"{r.reads_ms['ranks']:.0f}",
            f"{r.reads_ms['series']:.0f}",
            f"{r.reads_ms['spread']:.0f}",
            f"{r.load:.1f}",
        ]
        print("| " + " | ".join(cells) + " |")
    print()
    for r in rows:
        s = r.spec
        target = 1.5 * r.one_process_bytes + SUMMARY_BYTES * s.ranks
        checks = {
            "every step stored": r.stored == s.steps,
            "lag p95 <= 2 s": bool(r.lags) and quantile(r.lags, 0.95) <= 2.0,
            "no connection refused or dropped": r.errors == 0 and r.dropped == 0,
            "no partial step": r.partial == 0 and r.lost == 0,
            "cpu <= 0.5 ms per rank-step": r.cpu_ms <= 0.5,
            "bytes <= 1.5x one process + 100 B/rank": r.bytes_step <= target,
            "hellos admitted within 10 s": r.admit_s <= 10.0,
            "reads within 300 ms": all(ms <= 300 for ms in r.reads_ms.values()),  # NaN (no answer): missed
        }
        bytes_measured = not math.isnan(r.bytes_step)  # --db: the database's bytes are not measured
        if not bytes_measured:
            del checks["bytes <= 1.5x one process + 100 B/rank"]
        met = [k for k, ok in checks.items() if ok]
        missed = [k for k, ok in checks.items() if not ok]
        line = f"{label(s)}: met: {', '.join(met) or '-'}; missed: {', '.join(missed) or '-'}"
        print(line if bytes_measured else f"{line}; not measured: bytes (--db)")


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--ranks", default="8,32,64", help="comma-separated world sizes (default 8,32,64)")
    p.add_argument("--tensors", default="700", help="comma-separated parameter counts (default 700)")
    p.add_argument("--period", default="1", help="comma-separated step periods in seconds (default 1)")
    p.add_argument("--steps", type=int, default=60, help="steps per job (default 60)")
    p.add_argument("--kind", choices=("ddp", "fsdp"), default="ddp")
    p.add_argument("--every", type=int, default=1, help="measure every Nth step (default 1)")
    p.add_argument("--procs", type=int, default=0, help="simulator processes (default: one per 256 ranks, at most 4)")
    p.add_argument("--workers", type=int, default=1, help="gradwatch serve --workers (needs --db postgresql://...)")
    p.add_argument(
        "--db", default="", help="a database URL instead of a fresh SQLite file (bytes are then not measured)"
    )
    p.add_argument("--rank-timeout", type=float, default=30.0, help="gradwatch serve --rank-timeout (default 30)")
    p.add_argument(
        "--hello",
        default="v2",
        help="comma-separated: v2 (rank 0 sends the list, the others its digest) and/or v1 (all send it); default v2",
    )
    p.add_argument(
        "--admit-only", action="store_true", help="time the job's start alone: each rank closes once welcomed"
    )
    p.add_argument(
        "--replicas",
        default="digest",
        help="comma-separated, --kind ddp: digest (a replica's measured steps carry its grad_digest, as the hook "
        "sends on v2) and/or arrays (its per-parameter arrays); default digest",
    )
    p.add_argument(
        "--frames",
        default="binary",
        choices=("binary", "json"),
        help="binary: step frames as binary (protocol v3) to a server that reads them, as the hook sends them; "
        "json: JSON text frames always; default binary",
    )
    args = p.parse_args(argv)
    args.hello_list = args.hello.split(",")
    args.replicas_list = args.replicas.split(",")
    if any(r not in ("digest", "arrays") for r in args.replicas_list):
        p.error("--replicas takes digest and/or arrays")
    if any(h not in ("v1", "v2") for h in args.hello_list):
        p.error("--hello takes v1 and/or v2")
    try:
        args.ranks_list = [int(x) for x in args.ranks.split(",")]
        args.tensors_list = [int(x) for x in args.tensors.split(",")]
        args.period_list = [float(x) for x in args.period.split(",")]
    except ValueError:
        p.error("--ranks, --tensors and --period take comma-separated numbers")
    if any(r < 1 or r > 65536 for r in args.ranks_list):
        p.error("--ranks must be between 1 and 65536")
    if any(t < 1 for t in args.tensors_list):
        p.error("--tensors must be 1 or more")
    if any(x <= 0 for x in args.period_list):
        p.error("--period must be above 0")
    if args.steps < 2:
        p.error("--steps must be 2 or more")
    if args.every < 1:
        p.error("--every must be 1 or more")
    if args.workers > 1 and not args.db.startswith("postgresql"):
        p.error("--workers above 1 needs --db postgresql://...")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    rows = []
    print(
        f"# {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f} at the start; {args.kind}, every={args.every}, "
        f"{args.steps} steps, {args.workers} worker(s), db {args.db or 'sqlite (fresh file)'}",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="gw-ranks-") as tmp:
        for tensors in args.tensors_list:
            for period in args.period_list:
                for ranks in args.ranks_list:
                    for hello, replicas in [(h, r) for h in args.hello_list for r in args.replicas_list]:
                        spec = Spec(
                            ranks,
                            tensors,
                            period,
                            args.steps,
                            args.kind,
                            args.every,
                            f"bench{ranks}x{tensors}p{str(period).replace('.', '_')}-{os.urandom(3).hex()}",
                            hello,
                            args.admit_only,
                            replicas,
                            args.frames,
                        )
                        row = run_config(spec, args, Path(tmp))
                        rows.append(row)
                        print(
                            f"# done {ranks} x {tensors} @ {period:g} s ({hello}, replicas {replicas}, "
                            f"--frames {args.frames}: {row.binary} ranks sent binary): admit {row.admit_s:.1f} s, "
                            f"{row.errors} failed connects, lag p95 {quantile(row.lags, 0.95):.2f} s, "
                            f"cpu {row.cpu_ms:.2f} ms/rank-step, steady {row.steady_ms:.2f}, "
                            f"lag p50 {quantile(row.lags, 0.5):.2f} s, load {row.load:.1f}",
                            flush=True,
                        )
    if args.admit_only:
        report_admission(rows)
    else:
        report(rows)


if __name__ == "__main__":
    main()

"""Storage at scale, measured in one run and printed as one table (`make bench`; issue #7).

    python benchmarks/storage.py [--params 1000] [--steps 2000] [--databases sqlite,postgresql]
                                  [--series-steps 1000000] [--mlflow-steps 40] [--parts ...]

Parts (`--parts`, all by default):
  ingest   hook -> stored: a real `gradwatch serve` subprocess on SQLite and on PostgreSQL (a
           throwaway cluster from tests/support/pg.py), fed the hook's own wire messages (gradwatch.wire:
           AdamW's six per-parameter metrics, grad_status and 8 scalars per step), built before
           the clock starts and sent as fast as the server takes them (the server stops reading
           when its queue is full; TCP does the rest). Rate: parameter-rows/s = params x steps /
           seconds from the first send to the ack of the last step. Each repetition is a new
           database; the databases alternate, so both see the same machine load.
  mlflow   the peer: MLflow's tracking server on SQLite (`mlflow server`, from .venv-bench, which
           `make bench` fills from benchmarks/requirements-mlflow.txt), `MlflowClient().log_batch`
           of the same grad_norm values, one metric per parameter, one call per step (MLflow
           takes at most 1000 metrics per call), on the first --mlflow-steps steps. gradwatch
           stores 7 values per parameter-row (6 metrics and grad_status), MLflow 1: the ratio
           flatters MLflow.
  heatmap  params x 1000 step buckets of the ingested run: charts.heatmap in process, and
           GET /api/runs/{id}/heatmap from a server (JSON included).
  export   `gradwatch export` of the ingested run, CSV and Parquet, in a subprocess: values/s
           (7 per row; Python's start included) and the subprocess's peak RSS (its VmHWM).
  disk     SQLite: (db + wal) bytes / stored values (per-parameter values and scalars).
  runs     run management: --runs runs (3 projects, 1 in 7 crashed) written through the store;
           a page of 50 with a project and status filter and with a search, deep in the list;
           then deleting the ingested run (one transaction) and `Store.compact` (VACUUM).
  series   one parameter's series over --series-steps steps of a run of --series-params
           parameters written through Store.write_steps, downsampled to 2000 points:
           charts.param_series in process, and GET .../params/series from a server; also a
           window of a tenth of the run (a zoom), and a scalar (the loss) over the whole run.
           Each answer is checked against numpy on the generated values (min and max exact,
           mean to 1e-9 relative, NaN/Inf per bucket).

Timings are medians of --repeat reads after one warm-up read. The machine may be shared: run
it again rather than trusting one table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "tests"))  # tests/support: start_server, the PostgreSQL cluster

from support import pg  # noqa: E402
from support.jsonfloats import number, same  # noqa: E402
from support.server import find_free_port, server_env, start_server  # noqa: E402

ARRAYS = ("grad_norm", "param_norm", "exp_avg_norm", "exp_avg_sq_norm", "backward_passes", "grad_clear")
VALUES_PER_ROW = len(ARRAYS) + 1  # and grad_status
SCALARS = (
    "loss",
    "lr/0",
    "grad_norm_total",
    "backward_passes",
    "mem/rss_bytes",
    "mem/grads_bytes",
    "mem/params_bytes",
    "mem/zero_grad_bytes",
)
ABSENT_BITS = 0x7FDEAD00
MLFLOW_BIN = REPO / ".venv-bench" / "bin"


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def timed(call: Callable[[], object], repeat: int) -> float:
    """Median seconds of `repeat` calls after one warm-up call."""
    call()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def http_get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=120) as response:
        return response.read()


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


# -- the data ----------------------------------------------------------------------------------


def param_names(count: int) -> list[str]:
    kinds = ("attn.qkv.weight", "attn.qkv.bias", "mlp.fc.weight", "mlp.fc.bias")
    return [f"blocks.{i // len(kinds)}.{kinds[i % len(kinds)]}" for i in range(count)]


def grad_norms(rng: np.random.Generator, steps: int, params: int, first_step: int = 1) -> np.ndarray:
    """steps x params float32 gradient norms: log-normal, a spike now and then, a few NaN/Inf,
    and parameter 0 without a gradient for the first 10 steps (ABSENT)."""
    values = rng.lognormal(-3.0, 1.0, (steps, params)).astype(np.float32)
    spikes = rng.random((steps, params)) < 1e-3
    values[spikes] *= 1000
    values[rng.random((steps, params)) < 1e-5] = np.nan
    values[rng.random((steps, params)) < 1e-5] = np.inf
    early = np.arange(first_step, first_step + steps) <= 10
    values.view(np.uint32)[early, 0] = ABSENT_BITS
    return values


def status_codes(grad: np.ndarray) -> np.ndarray:
    status = np.full(grad.shape, 2, dtype=np.uint8)
    status[grad == 0] = 1
    status[~np.isfinite(grad)] = 3
    status[grad.view(np.uint32) == ABSENT_BITS] = 0
    return status


@dataclass
class Workload:
    run_id: str
    names: list[str]
    hello: str
    frames: list[str]
    grad: np.ndarray  # steps x params, for MLflow

    @property
    def rows(self) -> int:
        return self.grad.size


def build_workload(run_id: str, params: int, steps: int, seed: int = 7) -> Workload:
    """The hook's own wire messages (gradwatch.wire), serialized before any clock starts."""
    from gradwatch import wire

    rng = np.random.default_rng(seed)
    names = param_names(params)
    hello = wire.dumps(
        wire.hello(
            {
                "id": run_id,
                "name": f"bench {run_id}",
                "project": "bench",
                "started_at": time.time(),
                "hook_version": "bench",
                "optimizer": "AdamW",
                "config": {"every": 1},
            },
            [
                {"name": n, "shape": [64, 64], "numel": 4096, "dtype": "float32", "group": 0, "optimizer": 0}
                for n in names
            ],
            [{"optimizer": 0, "index": 0, "name": None, "hparams": {"lr": 3e-4}}],
        )
    )
    grad = grad_norms(rng, steps, params)
    weight = rng.lognormal(1.0, 0.5, params).astype(np.float32)
    frames = []
    for i in range(steps):
        g = grad[i]
        metrics = {
            "grad_norm": g,
            "param_norm": weight * np.float32(1 + 1e-4 * i),
            "exp_avg_norm": (g * rng.uniform(0.5, 1.5, params)).astype(np.float32),
            "exp_avg_sq_norm": (g * g * rng.uniform(0.5, 1.5, params)).astype(np.float32),
            "backward_passes": np.ones(params, np.float32),
            "grad_clear": np.full(params, 1.0, np.float32),
        }
        scalars = {
            "loss": 5.0 / (1 + i),
            "lr/0": 3e-4,
            "grad_norm_total": float(np.nansum(g[np.isfinite(g)])),
            "backward_passes": 1.0,
            "mem/rss_bytes": 2e9,
            "mem/grads_bytes": 1e9,
            "mem/params_bytes": 1e9,
            "mem/zero_grad_bytes": 0.0,
        }
        frames.append(wire.dumps(wire.step(i + 1, i + 1, 1.7e9 + i, scalars, metrics, status_codes(g))))
    return Workload(run_id, names, hello, frames, grad)


# -- ingest ------------------------------------------------------------------------------------


def send_run(ws_url: str, work: Workload) -> float:
    """Stream the workload; seconds from the first step sent to the ack of the last one."""
    from websockets.sync.client import connect

    last = len(work.frames)
    # compression=None, as the hook's sender connects (base64 floats hardly compress)
    with connect(f"{ws_url}/ws/ingest", max_size=None, open_timeout=30, close_timeout=10, compression=None) as ws:
        ws.send(work.hello)
        welcome = json.loads(ws.recv(60))
        assert welcome["type"] == "welcome", welcome

        def pump() -> None:
            for frame in work.frames:
                ws.send(frame)

        sender = threading.Thread(target=pump, daemon=True)
        t0 = time.perf_counter()
        sender.start()
        while True:
            reply = json.loads(ws.recv(300))
            if reply["type"] == "error":
                raise RuntimeError(f"the server refused the benchmark's messages: {reply['message']}")
            if reply["type"] == "ack" and reply["seq"] >= last:
                break
        elapsed = time.perf_counter() - t0
        sender.join()
        ws.send(json.dumps({"v": 1, "type": "close", "seq": last + 1, "status": "finished"}))
        while json.loads(ws.recv(60)).get("type") != "ack":
            pass
    return elapsed


@dataclass
class Database:
    kind: str  # sqlite | postgresql
    url: str
    path: Path | None = None


@dataclass
class IngestResult:
    seconds: list[float] = field(default_factory=list)
    server_cpu_s: list[float] = field(default_factory=list)  # user + system of the server process
    server_rss_mib: list[float] = field(default_factory=list)
    kept: Database | None = None  # the last repetition's database, read by the other parts


class Postgres:
    """The throwaway cluster of tests/support/pg.py, started when first needed."""

    def __init__(self) -> None:
        self.server: pg.Server | None = None

    def new_database(self) -> str:
        if self.server is None:
            log("starting a throwaway PostgreSQL cluster (tests/support/pg.py)")
            self.server = pg.start_server(os.environ.get("GRADWATCH_TEST_POSTGRES_URL"))
        return self.server.create_database()

    def drop(self, url: str) -> None:
        if self.server is not None:
            self.server.drop_database(url)

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()


def new_database(kind: str, tmp: Path, postgres: Postgres, label: str) -> Database:
    if kind == "sqlite":
        path = tmp / f"{label}.db"
        return Database(kind, f"sqlite:///{path}", path)
    return Database(kind, postgres.new_database())


def drop_database(db: Database, postgres: Postgres) -> None:
    if db.kind == "sqlite" and db.path is not None:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{db.path}{suffix}").unlink(missing_ok=True)
    else:
        postgres.drop(db.url)


def run_ingest(kinds: list[str], work: Workload, repeat: int, tmp: Path, postgres: Postgres) -> dict[str, IngestResult]:
    results = {kind: IngestResult() for kind in kinds}
    for rep in range(repeat):
        for kind in kinds:
            result = results[kind]
            db = new_database(kind, tmp, postgres, f"ingest-{rep}")
            server = start_server(tmp, db_url=db.url)
            try:
                cpu0 = cpu_seconds(server.proc.pid)
                seconds = send_run(server.ws_url, work)
                result.server_cpu_s.append(cpu_seconds(server.proc.pid) - cpu0)
                rss = peak_rss_mib(server.proc.pid)
            finally:
                server.stop()
            result.seconds.append(seconds)
            if rss is not None:
                result.server_rss_mib.append(rss)
            log(f"ingest {kind} #{rep + 1}: {seconds:.2f} s, {work.rows / seconds:,.0f} parameter-rows/s")
            if result.kept is not None:
                drop_database(result.kept, postgres)
            result.kept = db
    return results


# -- MLflow, the peer --------------------------------------------------------------------------

MLFLOW_CLIENT = r"""
import json, sys, time
import numpy as np
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

uri, values_path, names_path = sys.argv[1:4]
values = np.load(values_path)
names = json.loads(open(names_path).read())
client = MlflowClient(tracking_uri=uri)
run_id = client.create_run(client.create_experiment("gradwatch-bench")).info.run_id
stamp = int(time.time() * 1000)
t0 = time.perf_counter()
for step in range(values.shape[0]):
    row = values[step].tolist()
    for lo in range(0, len(names), 1000):
        client.log_batch(run_id, metrics=[Metric(names[i], row[i], stamp, step + 1)
                                          for i in range(lo, min(lo + 1000, len(names)))])
seconds = time.perf_counter() - t0
client.set_terminated(run_id)
print(json.dumps({"seconds": seconds, "rows": int(values.size)}))
"""


def run_mlflow(work: Workload, steps: int, tmp: Path) -> float | None:
    """MLflow's rows/s for the first `steps` steps of grad_norm, or None if it is not installed."""
    if not (MLFLOW_BIN / "mlflow").exists():
        log(f"MLflow is not installed in {MLFLOW_BIN.parent} (make bench installs it): skipped")
        return None
    folder = tmp / "mlflow"
    folder.mkdir()
    values = np.ascontiguousarray(work.grad[:steps])
    values.view(np.uint32)[values.view(np.uint32) == ABSENT_BITS] = np.array(np.nan, np.float32).view(np.uint32)
    np.save(folder / "values.npy", values)
    (folder / "names.json").write_text(json.dumps(work.names))
    port = find_free_port()
    with open(folder / "server.log", "wb") as server_log:
        server = subprocess.Popen(
            [
                str(MLFLOW_BIN / "mlflow"),
                "server",
                "--backend-store-uri",
                f"sqlite:///{folder / 'mlflow.db'}",
                "--default-artifact-root",
                str(folder / "artifacts"),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            stdout=server_log,
            stderr=subprocess.STDOUT,
            cwd=folder,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                http_get(f"{url}/health")
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        "mlflow server did not start:\n" + (folder / "server.log").read_text(errors="replace")[-3000:]
                    ) from None
                time.sleep(0.5)
        out = subprocess.run(
            [
                str(MLFLOW_BIN / "python"),
                "-c",
                MLFLOW_CLIENT,
                url,
                str(folder / "values.npy"),
                str(folder / "names.json"),
            ],
            capture_output=True,
            text=True,
            timeout=3600,
        )
        if out.returncode != 0:
            raise RuntimeError(f"the MLflow client failed:\n{out.stderr[-3000:]}")
        result = json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        with_group = os.getpgid(server.pid) if server.poll() is None else None
        if with_group is not None:
            os.killpg(with_group, signal.SIGTERM)
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(with_group, signal.SIGKILL)
                server.wait()
    rate = result["rows"] / result["seconds"]
    log(f"mlflow: {result['rows']:,} rows in {result['seconds']:.1f} s, {rate:,.0f} rows/s")
    return rate


# -- reads -------------------------------------------------------------------------------------


@contextmanager
def opened(url: str) -> Iterator[object]:
    from gradwatch_server.store import open_store

    store = open_store(url)
    try:
        yield store
    finally:
        store.close()


def heatmap_ms(db: Database, run_id: str, buckets: int, repeat: int, tmp: Path) -> tuple[float, float, int]:
    """(in process ms, HTTP ms, cells) of the grad_norm heatmap with `buckets` step buckets."""
    from gradwatch_server import charts

    with opened(db.url) as store:
        params = store.get_params(run_id)  # type: ignore[attr-defined]
        shape = charts.heatmap(store, run_id, params, "grad_norm", None, None, buckets)  # type: ignore[arg-type]
        cells = sum(len(z) for z in shape.z)
        local = timed(
            lambda: charts.heatmap(store, run_id, params, "grad_norm", None, None, buckets),  # type: ignore[arg-type]
            repeat,
        )
    server = start_server(tmp, db_url=db.url)
    try:
        remote = timed(
            lambda: http_get(f"{server.url}/api/runs/{run_id}/heatmap?metric=grad_norm&max_steps={buckets}"), repeat
        )
    finally:
        server.stop()
    return local * 1000, remote * 1000, cells


@dataclass
class ExportResult:
    seconds: float
    values: int
    peak_rss_mib: float
    size_mib: float


#: `gradwatch export ...` that writes its own peak RSS (VmHWM) to argv[1] at exit. Not
#: ru_maxrss from wait4: Linux counts there the parent's RSS at fork, this benchmark's own.
EXPORT_CHILD = r"""
import atexit, sys
from pathlib import Path

def report():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            Path(sys.argv[1]).write_text(line.split()[1])

atexit.register(report)
from gradwatch_server.cli import main
sys.exit(main(sys.argv[2:]))
"""


def export_run(db: Database, run_id: str, fmt: str, values: int, tmp: Path) -> ExportResult:
    """`gradwatch export` in a subprocess: wall time (Python start included) and its peak RSS."""
    out, peak = tmp / f"export.{fmt}", tmp / "export.peak"
    t0 = time.perf_counter()
    with open(tmp / "export.log", "wb") as err:
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                EXPORT_CHILD,
                str(peak),
                "export",
                run_id,
                "--format",
                fmt,
                "-o",
                str(out),
                "--db",
                db.url,
            ],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=server_env(),
        )
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"gradwatch export failed:\n{(tmp / 'export.log').read_text(errors='replace')}")
    size = out.stat().st_size / 2**20
    out.unlink()
    return ExportResult(seconds, values, int(peak.read_text()) / 1024, size)


def sqlite_bytes(path: Path) -> int:
    return sum(Path(f"{path}{s}").stat().st_size for s in ("", "-wal") if Path(f"{path}{s}").exists())


# -- run management ------------------------------------------------------------------------------


def run_management(db: Database, ingested: Database, run_id: str, count: int, repeat: int) -> dict[str, float]:
    """ms: a filtered page and a searched page of `count` runs on `db`; deleting `run_id` from
    `ingested` and compacting that database."""
    from gradwatch_server.protocol import Hello, parse_message

    rng = np.random.default_rng(3)
    found: dict[str, float] = {}
    with opened(db.url) as store:
        for i in range(count):
            message = parse_message(
                json.dumps(
                    {
                        "v": 1,
                        "type": "hello",
                        "run": {
                            "id": f"run{i:05d}",
                            "name": f"lr sweep {i}",
                            "project": ("gpt", "mlp", "vit")[i % 3],
                            "started_at": 1.7e9 + float(rng.integers(0, 10**7)),
                        },
                        "params": [
                            {"name": "w", "shape": [4], "numel": 4, "dtype": "float32", "group": 0, "optimizer": 0}
                        ],
                    }
                )
            )
            assert isinstance(message, Hello)
            store.open_run(message)  # type: ignore[attr-defined]
            if i % 7 == 0:
                store.set_status(f"run{i:05d}", "crashed", None)  # type: ignore[attr-defined]
        lister = store.list_runs  # type: ignore[attr-defined]
        found["deep"] = timed(lambda: lister(limit=50, offset=count * 4 // 5), repeat) * 1000
        found["filtered"] = timed(lambda: lister(project="mlp", status="crashed", limit=50, offset=100), repeat) * 1000
        found["search"] = timed(lambda: lister(q="SWEEP 1", limit=50, offset=950), repeat) * 1000
    with opened(ingested.url) as store:
        t0 = time.perf_counter()
        assert store.delete_run(run_id)  # type: ignore[attr-defined]
        found["delete"] = (time.perf_counter() - t0) * 1000
        t0 = time.perf_counter()
        store.compact()  # type: ignore[attr-defined]
        found["compact"] = (time.perf_counter() - t0) * 1000
    return found


# -- one parameter over a long run -------------------------------------------------------------


@dataclass
class SeriesRun:
    run_id: str
    names: list[str]
    steps: np.ndarray
    grad: np.ndarray  # steps x params
    loss: np.ndarray  # float64 per step, a scalar
    build_s: float


def build_series_run(url: str, steps: int, params: int, seed: int = 11) -> SeriesRun:
    """A long run written through Store.write_steps (grad_norm and grad_status), 2,000 steps a batch."""
    from gradwatch_server.protocol import Hello, parse_message
    from gradwatch_server.store import StepData

    run_id = "series"
    names = [f"p{i}" for i in range(params)]
    hello = {
        "v": 1,
        "type": "hello",
        "run": {"id": run_id, "name": "long run", "project": "bench", "started_at": 1.7e9},
        "params": [
            {"name": n, "shape": [8], "numel": 8, "dtype": "float32", "group": 0, "optimizer": 0} for n in names
        ],
        "groups": [],
    }
    rng = np.random.default_rng(seed)
    grad = grad_norms(rng, steps, params)
    loss = rng.lognormal(0.0, 1.0, steps)
    loss[rng.random(steps) < 1e-5] = np.nan
    loss[rng.random(steps) < 1e-5] = np.inf
    t0 = time.perf_counter()
    with opened(url) as store:
        message = parse_message(json.dumps(hello))
        assert isinstance(message, Hello)
        store.open_run(message)  # type: ignore[attr-defined]
        batch = 2000
        for lo in range(0, steps, batch):
            store.write_steps(
                run_id,
                [  # type: ignore[attr-defined]
                    StepData(
                        seq=i + 1,
                        step=i + 1,
                        time=1.7e9 + i,
                        scalars={"loss": float(loss[i])},
                        arrays={"grad_norm": grad[i].tobytes(), "grad_status": status_codes(grad[i]).tobytes()},
                    )
                    for i in range(lo, min(lo + batch, steps))
                ],
            )
    return SeriesRun(run_id, names, np.arange(1, steps + 1), grad, loss, time.perf_counter() - t0)


def check_series(answer: dict, run: SeriesRun, index: int | None, start: int | None, end: int | None) -> None:
    """Each bucket of the answer against numpy on the generated values (the bucket runs from its
    first step to the next bucket's): min and max exact, mean to 1e-9, NaN and Inf kept. `index`
    is the parameter of a params/series answer, None for the loss (a scalar series answer)."""
    series = answer if index is None else answer["series"][0]
    first = np.array(answer["step"], dtype=np.int64)
    lo = 1 if start is None else start
    hi = int(run.steps[-1]) if end is None else end
    bounds = np.append(first, hi + 1)
    column = run.loss if index is None else run.grad[:, index]
    assert answer["downsampled"], "expected a downsampled answer"
    for j in range(len(first)):
        values = column[bounds[j] - 1 : bounds[j + 1] - 1]
        if values.dtype == np.float32:
            values = values[values.view(np.uint32) != ABSENT_BITS]
        values = values.astype(np.float64)
        finite = values[np.isfinite(values)]
        ordered = values[~np.isnan(values)]
        want_max = math.nan if np.isnan(values).any() or not ordered.size else float(ordered.max())
        want_min = float(ordered.min()) if ordered.size else math.nan
        want_mean = float(finite.mean()) if finite.size else math.nan
        got = [number(series[k][j]) for k in ("min", "max", "value")]
        assert same(got[0], want_min) and same(got[1], want_max), (j, got, want_min, want_max)
        assert same(got[2], want_mean, 1e-9), (j, got[2], want_mean)
    assert first[0] >= lo and first[-1] <= hi


def series_ms(url: str, run: SeriesRun, points: int, repeat: int, tmp: Path) -> dict[str, float]:
    """Median ms of one parameter's downsampled series: whole run and a tenth, in process and HTTP."""
    from gradwatch_server import charts

    index = 3
    name = run.names[index]
    n = len(run.steps)
    window = (int(n * 0.4), int(n * 0.5))
    found: dict[str, float] = {}
    with opened(url) as store:
        params = store.get_params(run.run_id)  # type: ignore[attr-defined]
        for label, (start, end) in (("whole", (None, None)), ("tenth", window)):

            def read(start: int | None = start, end: int | None = end) -> object:
                return charts.param_series(
                    store,
                    run.run_id,
                    params,
                    "grad_norm",
                    [name],
                    5,
                    "desc",  # type: ignore[arg-type]
                    start,
                    end,
                    points,
                )

            answer = json.loads(read().model_dump_json())  # type: ignore[attr-defined]
            check_series(answer, run, index, start, end)
            found[label] = timed(read, repeat) * 1000

        def loss() -> object:
            return charts.scalar_series(store, run.run_id, "loss", None, None, points)  # type: ignore[arg-type]

        check_series(json.loads(loss().model_dump_json()), run, None, None, None)  # type: ignore[attr-defined]
        found["loss"] = timed(loss, repeat) * 1000
    server = start_server(tmp, db_url=url)
    try:
        base = f"{server.url}/api/runs/{run.run_id}/params/series?metric=grad_norm&param={name}&max_points={points}"
        check_series(json.loads(http_get(base)), run, index, None, None)
        found["http"] = timed(lambda: http_get(base), repeat) * 1000
    finally:
        server.stop()
    return found


# -- the table ---------------------------------------------------------------------------------


def fmt_int(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def fmt_ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f} ms" if value >= 10 else f"{value:.1f} ms"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", type=int, default=1000, help="parameter tensors of the ingested run")
    ap.add_argument("--steps", type=int, default=2000, help="steps of the ingested run")
    ap.add_argument("--databases", default="sqlite,postgresql")
    ap.add_argument("--repeat", type=int, default=5, help="timed reads per figure (median)")
    ap.add_argument("--ingest-repeat", type=int, default=3, help="ingests per database (median)")
    ap.add_argument("--mlflow-steps", type=int, default=40, help="steps logged to MLflow (it is slow)")
    ap.add_argument("--heatmap-buckets", type=int, default=1000)
    ap.add_argument("--series-steps", type=int, default=1_000_000)
    ap.add_argument("--series-params", type=int, default=8)
    ap.add_argument("--series-points", type=int, default=2000)
    ap.add_argument(
        "--series-databases",
        default="sqlite",
        help="databases of the series part (writing 10^6 steps to PostgreSQL takes minutes)",
    )
    ap.add_argument("--runs", type=int, default=5000, help="runs of the run-management part")
    ap.add_argument("--parts", default="ingest,mlflow,heatmap,export,disk,series,runs")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    kinds = [k for k in args.databases.split(",") if k]
    unknown = set(kinds) - {"sqlite", "postgresql"}
    if unknown:
        ap.error(f"unknown database {', '.join(sorted(unknown))}: use sqlite, postgresql")
    if parts & {"heatmap", "export", "disk", "runs"}:
        parts.add("ingest")

    rows: list[tuple[str, str, str, str]] = []  # measure, SQLite, PostgreSQL, target

    def by_kind(d: dict[str, str]) -> tuple[str, str]:
        return d.get("sqlite", "-"), d.get("postgresql", "-")

    postgres = Postgres()
    started = time.time()
    try:
        with tempfile.TemporaryDirectory(prefix="gradwatch-bench-") as tmp_name:
            tmp = Path(tmp_name)
            work: Workload | None = None
            ingest: dict[str, IngestResult] = {}
            if parts & {"ingest", "mlflow"}:
                log(f"building {args.steps:,} step messages of {args.params:,} parameters")
                work = build_workload("bench", args.params, args.steps)
            if "ingest" in parts and work is not None:
                ingest = run_ingest(kinds, work, args.ingest_repeat, tmp, postgres)
                rates = {k: work.rows / statistics.median(r.seconds) for k, r in ingest.items()}
                rows.append(
                    (
                        f"ingest, hook -> stored, {args.params:,} params x {args.steps:,} steps "
                        f"(parameter-rows/s, median of {args.ingest_repeat})",
                        *by_kind({k: fmt_int(v) for k, v in rates.items()}),
                        ">= 500,000 / >= 250,000",
                    )
                )
                rows.append(
                    (
                        "  server CPU per step (user + system; the figure the machine's load moves least)",
                        *by_kind(
                            {
                                k: f"{statistics.median(r.server_cpu_s) / args.steps * 1000:.2f} ms"
                                for k, r in ingest.items()
                            }
                        ),
                        "",
                    )
                )
                rows.append(
                    (
                        "  server peak RSS during ingest",
                        *by_kind(
                            {k: f"{max(r.server_rss_mib):,.0f} MiB" for k, r in ingest.items() if r.server_rss_mib}
                        ),
                        "",
                    )
                )
            if "mlflow" in parts and work is not None:
                peer = run_mlflow(work, min(args.mlflow_steps, args.steps), tmp)
                rows.append(
                    (
                        f"MLflow 3.17 server on SQLite, log_batch, {min(args.mlflow_steps, args.steps)} steps (rows/s)",
                        fmt_int(peer),
                        "",
                        "the peer",
                    )
                )
                if peer and ingest:
                    rows.append(
                        (
                            "  gradwatch ingest / MLflow",
                            *by_kind(
                                {
                                    k: f"{work.rows / statistics.median(r.seconds) / peer:,.0f}x"
                                    for k, r in ingest.items()
                                }
                            ),
                            "",
                        )
                    )
            if "heatmap" in parts and work is not None:
                local, remote = {}, {}
                for kind, result in ingest.items():
                    assert result.kept is not None
                    a, b, cells = heatmap_ms(result.kept, work.run_id, args.heatmap_buckets, args.repeat, tmp)
                    local[kind], remote[kind] = fmt_ms(a), fmt_ms(b)
                    log(f"heatmap {kind}: {a:.0f} ms in process, {b:.0f} ms over HTTP ({cells:,} cells)")
                rows.append(
                    (
                        f"heatmap, {args.params:,} params x {args.heatmap_buckets:,} step buckets "
                        f"of {args.steps:,} steps: charts.heatmap",
                        *by_kind(local),
                        "< 300 ms",
                    )
                )
                rows.append(("  the same over HTTP (GET .../heatmap, JSON)", *by_kind(remote), ""))
            if "export" in parts and work is not None:
                values = args.params * args.steps * VALUES_PER_ROW
                for fmt in ("csv", "parquet"):
                    rate, peak = {}, {}
                    for kind, result in ingest.items():
                        assert result.kept is not None
                        done = export_run(result.kept, work.run_id, fmt, values, tmp)
                        rate[kind] = f"{values / done.seconds / 1e6:.2f} M/s"
                        peak[kind] = f"{done.peak_rss_mib:,.0f} MiB"
                        log(
                            f"export {fmt} {kind}: {done.seconds:.1f} s, {done.size_mib:,.0f} MiB file, "
                            f"peak RSS {done.peak_rss_mib:,.0f} MiB"
                        )
                    rows.append(
                        (
                            f"export {fmt.upper()}, {values / 1e6:.0f}M values ({args.params:,} x {args.steps:,}"
                            f" rows x {VALUES_PER_ROW}): values/s",
                            *by_kind(rate),
                            "state it",
                        )
                    )
                    rows.append((f"  `gradwatch export --format {fmt}` peak RSS", *by_kind(peak), "state it"))
            if "disk" in parts and "sqlite" in ingest and work is not None:
                kept = ingest["sqlite"].kept
                assert kept is not None and kept.path is not None
                size = sqlite_bytes(kept.path)
                values = args.params * args.steps * VALUES_PER_ROW + args.steps * len(SCALARS)
                rows.append(
                    (
                        f"disk on SQLite: {size / 2**20:,.1f} MiB for {values / 1e6:.1f}M values (bytes/value)",
                        f"{size / values:.2f}",
                        "",
                        "<= 12",
                    )
                )
            if "runs" in parts and work is not None:
                deep, listing, search, removal, vacuum = {}, {}, {}, {}, {}
                for kind, result in ingest.items():
                    assert result.kept is not None
                    db = new_database(kind, tmp, postgres, "runs")
                    log(f"writing {args.runs:,} runs on {kind}")
                    found = run_management(db, result.kept, work.run_id, args.runs, args.repeat)
                    drop_database(db, postgres)
                    deep[kind], listing[kind], search[kind] = (fmt_ms(found[k]) for k in ("deep", "filtered", "search"))
                    removal[kind], vacuum[kind] = fmt_ms(found["delete"]), fmt_ms(found["compact"])
                    log(f"runs {kind}: {found}")
                rows.append(
                    (
                        f"list runs: 50 from offset {args.runs * 4 // 5:,} of {args.runs:,}, newest first",
                        *by_kind(deep),
                        "quick",
                    )
                )
                rows.append(("  50 with a project + status filter (page 3)", *by_kind(listing), ""))
                rows.append(("  50 with a name search, ?q= (page 20)", *by_kind(search), ""))
                rows.append(
                    (
                        f"delete the ingested run ({args.params * args.steps / 1e6:.0f}M parameter-rows), "
                        "one transaction",
                        *by_kind(removal),
                        "",
                    )
                )
                rows.append(("  then compact (`gradwatch gc`: VACUUM / VACUUM (ANALYZE))", *by_kind(vacuum), ""))
            if "series" in parts:
                timings: dict[str, dict[str, float]] = {}
                for kind in [k for k in args.series_databases.split(",") if k in kinds]:
                    db = new_database(kind, tmp, postgres, "series")
                    log(f"writing a run of {args.series_params} params x {args.series_steps:,} steps on {kind}")
                    run = build_series_run(db.url, args.series_steps, args.series_params)
                    log(f"  written in {run.build_s:.0f} s ({args.series_steps / run.build_s:,.0f} steps/s)")
                    timings[kind] = series_ms(db.url, run, args.series_points, args.repeat, tmp)
                    log(f"series {kind}: {timings[kind]}")
                    drop_database(db, postgres)
                if timings:
                    shown = {
                        k: {kind: fmt_ms(t[k]) for kind, t in timings.items()}
                        for k in ("whole", "tenth", "http", "loss")
                    }
                    rows.append(
                        (
                            f"series, 1 param x {args.series_steps:,} steps -> {args.series_points:,} points"
                            ": charts.param_series",
                            *by_kind(shown["whole"]),
                            "< 100 ms",
                        )
                    )
                    rows.append(("  a tenth of the run (zoom)", *by_kind(shown["tenth"]), ""))
                    rows.append(("  whole run over HTTP (GET .../params/series)", *by_kind(shown["http"]), ""))
                    rows.append(
                        (
                            f"  a scalar (the loss) over {args.series_steps:,} steps -> {args.series_points:,}"
                            " points: charts.scalar_series",
                            *by_kind(shown["loss"]),
                            "",
                        )
                    )
            for result in ingest.values():
                if result.kept is not None:
                    drop_database(result.kept, postgres)
    finally:
        postgres.stop()

    load = os.getloadavg()
    print(
        f"\ngradwatch storage benchmark, {time.strftime('%Y-%m-%d %H:%M')}: {os.cpu_count()} CPUs, "
        f"load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}, {time.time() - started:.0f} s in all\n"
    )
    header = ("measure", "SQLite", "PostgreSQL", "target")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

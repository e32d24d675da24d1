"""How fast the dashboard is, measured in real headless Chromium (issue #5; `make bench-dashboard`).

(a) A finished run of PARAMS parameter tensors x STEPS steps (1,000 x 10,000 by default: grad
    norm, grad status, param norm and both Adam moments per parameter, nine scalars per step) is
    written into an SQLite file through the server's own Store (open_store, open_run, write_steps:
    what ingest calls), then a real `gradwatch serve` serves it to Chromium (Playwright):
      interactive   navigation start -> every chart drawn (the page's `gradwatch:ready` mark,
                    set with body[data-ready]); also when Plotly was compiled (`gradwatch:plotly`)
      heatmap       the gradient-norm heatmap fetched and drawn on the loaded page, nothing else
                    drawing (its view's load(): request -> Plotly's draw completed); on the first
                    load its data is asked for with every chart's at the start and it draws in its
                    turn, so that figure is given from navigation (`gradwatch:drawn:grad-norm-heatmap`)
      zoom          a zoom of the loss chart to a window of steps -> every chart in view drawn with
                    that window fetched at full resolution (the page's `gradwatch:zoomed` mark;
                    charts out of view fetch it when scrolled to)
(b) A live run at RATE steps/s of the same width, sent over /ws/ingest (protocol v1) by a sender
    that stamps each step's `time` with its send time; the page records when each step is drawn
    (window.__gradwatchLive) and the main thread's long tasks (PerformanceObserver 'longtask'):
      live p95      send -> the step drawn on the line charts in view
      longest task  the longest main-thread task while the run streams

    python benchmarks/dashboard.py [--params 1000] [--steps 10000] [--rounds 3] [--live-seconds 20]
                                    [--db FILE [--reuse-db]] [--frontend DIR]

--db FILE --reuse-db keeps the finished run between invocations (it takes a while to build).

Chromium: /usr/bin/chromium or $GRADWATCH_CHROMIUM (never downloaded). The machine is shared
and timings are noisy: each figure is the median over rounds (p95 over steps for live).
"""

from __future__ import annotations

import argparse
import base64
import json
import math
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from gradwatch_server.protocol import ABSENT_BITS, Hello, validate_message
from gradwatch_server.store import StepData, open_store

TARGETS_MS = {"interactive": 1500, "heatmap": 500, "zoom": 300, "live_p95": 250, "longest_task": 100}
NONE, ZERO, NONZERO, NONFINITE = 0, 1, 2, 3
LR = 3e-4


# -- the run ---------------------------------------------------------------------------------


def param_names(count: int) -> list[str]:
    """A GPT-like model's parameter names, `count` of them: embeddings, blocks, final norm, head."""
    block = [
        "ln1.weight",
        "ln1.bias",
        "attn.qkv.weight",
        "attn.qkv.bias",
        "attn.proj.weight",
        "attn.proj.bias",
        "ln2.weight",
        "ln2.bias",
        "mlp.fc1.weight",
        "mlp.fc1.bias",
        "mlp.fc2.weight",
        "mlp.fc2.bias",
    ]
    head, tail = ["tok_emb.weight", "pos_emb.weight"], ["ln_f.weight", "ln_f.bias", "head.weight"]
    names = head[:count]
    b = 0
    while len(names) + len(tail) < count:
        names += [f"blocks.{b}.{n}" for n in block][: count - len(tail) - len(names)]
        b += 1
    return names + tail[: count - len(names)]


def hello(run_id: str, name: str, names: list[str], started_at: float) -> dict[str, Any]:
    return {
        "v": 1,
        "type": "hello",
        "run": {
            "id": run_id,
            "name": name,
            "project": "bench",
            "started_at": started_at,
            "hook_version": "bench",
            "optimizer": "AdamW",
            "config": {"every": 1},
        },
        "params": [
            {
                "name": n,
                "shape": [64, 64],
                "numel": 4096,
                "dtype": "float32",
                "group": int(n.endswith((".bias", "ln1.weight", "ln2.weight", "ln_f.weight"))),
                "optimizer": 0,
            }
            for n in names
        ],
        "groups": [
            {"optimizer": 0, "index": 0, "hparams": {"lr": LR}},
            {"optimizer": 0, "index": 1, "hparams": {"lr": LR}},
        ],
    }


class Telemetry:
    """Plausible per-step values for `n` parameters, a block of steps at a time (numpy)."""

    def __init__(self, n: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.rng = rng
        self.n = n
        self.scale = rng.uniform(0.05, 3.0, n)
        self.phase = rng.uniform(0, 2 * math.pi, n)
        self.unused = n - 1 if n > 2 else None  # one parameter never gets a gradient

    def block(self, steps: np.ndarray) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """(arrays per metric, shape len(steps) x n; scalars per key, shape len(steps))."""
        s = steps.astype(np.float64)[:, None]
        decay = 0.3 + 0.7 * np.exp(-s / 3000)
        noise = np.exp(self.rng.standard_normal((len(steps), self.n)) * 0.15)
        grad = (self.scale * decay * (1 + 0.3 * np.sin(s / 50 + self.phase)) * noise).astype("<f4")
        status = np.full(grad.shape, NONZERO, dtype="u1")
        spike = steps % 997 == 0
        grad[spike, : self.n // 10] *= 8
        nan_rows = np.isin(steps, [4001, 4002])
        grad[nan_rows, 3] = np.nan
        status[nan_rows, 3] = NONFINITE
        absent = np.array([ABSENT_BITS], dtype="<u4").view("<f4")[0]
        exp_avg = (grad * 0.7).astype("<f4")
        exp_avg_sq = (grad * grad * 1e-3).astype("<f4")
        if self.unused is not None:
            for arr in (grad, exp_avg, exp_avg_sq):
                arr[:, self.unused] = absent
            status[:, self.unused] = NONE
        param = (20 + 0.001 * s * (1 + np.arange(self.n) % 3)).astype("<f4")
        finite = np.where(np.isfinite(grad) & (grad.view("<u4") != ABSENT_BITS), grad, 0).astype(np.float64)
        total = np.sqrt((finite**2).sum(axis=1))
        total[nan_rows] = np.nan
        cosine = 0.5 * (1 + np.cos(np.pi * np.minimum(1, steps / 10000)))
        lr = np.where(steps < 200, LR * steps / 200, LR * (0.1 + 0.9 * cosine))
        loss = 4.5 * np.exp(-steps / 2500) + 1.2 + self.rng.standard_normal(len(steps)) * 0.03
        numel = 4096.0 * self.n
        scalars = {
            "loss": loss,
            "grad_norm_total": total,
            "lr/0": lr,
            "lr/1": lr,
            "mem/params_bytes": np.full(len(steps), 4 * numel),
            "mem/grads_bytes": np.full(len(steps), 4 * numel),
            "mem/optimizer_bytes": np.full(len(steps), 8 * numel),
            "mem/rss_bytes": 2e9 + 1e4 * steps,
            "mem/zero_grad_bytes": np.zeros(len(steps)),
        }
        arrays = {
            "grad_norm": grad,
            "param_norm": param,
            "exp_avg_norm": exp_avg,
            "exp_avg_sq_norm": exp_avg_sq,
            "grad_status": status,
        }
        return arrays, scalars


def build_finished_run(db: Path, params: int, steps: int, run_id: str = "bench-finished") -> str:
    """Write the finished run into the SQLite file `db` (through Store, as ingest does)."""
    store = open_store(f"sqlite:///{db}")
    try:
        names = param_names(params)
        started = time.time() - steps * 0.5
        message = validate_message(hello(run_id, f"{params} tensors x {steps} steps", names, started))
        assert isinstance(message, Hello)
        store.open_run(message)
        data = Telemetry(params)
        chunk = max(1, min(500, 2_000_000 // max(params, 1)))
        for lo in range(1, steps + 1, chunk):
            block = np.arange(lo, min(steps, lo + chunk - 1) + 1)
            arrays, scalars = data.block(block)
            batch = [
                StepData(
                    seq=int(st),
                    step=int(st),
                    time=started + st * 0.5,
                    scalars={k: float(v[j]) for k, v in scalars.items()},
                    arrays={m: a[j].tobytes() for m, a in arrays.items()},
                )
                for j, st in enumerate(block)
            ]
            store.write_steps(run_id, batch)
        store.close_run(run_id, seq=steps + 1, status="finished")
    finally:
        store.close()
    return run_id


def has_run(db: Path, run_id: str) -> bool:
    """Whether the SQLite file `db` holds the finished run `run_id` (for --reuse-db)."""
    if not db.exists():
        return False
    store = open_store(f"sqlite:///{db}")
    try:
        run = store.get_run(run_id)
        return run is not None and run.status == "finished"
    finally:
        store.close()


# -- the server and the browser ----------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(db: Path, frontend: Path | None) -> tuple[subprocess.Popen[bytes], str]:
    """A real `gradwatch serve` on the SQLite file `db` (dashboard from `frontend` if given)."""
    port = free_port()
    exe = Path(sys.executable).with_name("gradwatch")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRADWATCH_")}
    if frontend is not None:
        env["GRADWATCH_FRONTEND_DIR"] = str(frontend)
    proc = subprocess.Popen(
        [str(exe), "serve", "--db", f"sqlite:///{db}", "--port", str(port), "--log-level", "warning"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url + "/api/health", timeout=1)
            return proc, url
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("the gradwatch server did not start")


def chromium_path() -> str:
    path = os.environ.get("GRADWATCH_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(path).exists():
        raise SystemExit(f"no Chromium at {path}: apt-get install chromium, or set GRADWATCH_CHROMIUM")
    return path


#: Installed before the page's own scripts: every main-thread task over 50 ms, as it happens.
LONGTASKS = """
window.__longtasks = [];
new PerformanceObserver((list) => {
  for (const e of list.getEntries()) window.__longtasks.push({start: e.startTime, duration: e.duration});
}).observe({type: "longtask", buffered: true});
"""

MARK = "(name) => { const m = performance.getEntriesByName(name); return m.length ? m[m.length - 1].startTime : null; }"


def open_run(context: Any, url: str, timeout_ms: int) -> tuple[Any, dict[str, float | None]]:
    """Open a run page in `context`; once every chart is drawn, its timings (ms from navigation)."""
    page = context.new_page()
    page.goto(url)
    page.wait_for_function("document.body.dataset.ready === '1'", timeout=timeout_ms)
    got = page.evaluate(f"""() => {{
        const mark = {MARK};
        return {{
            interactive: mark('gradwatch:ready'),
            plotly: mark('gradwatch:plotly'),
            heatmap_drawn: mark('gradwatch:drawn:grad-norm-heatmap'),
            longest_task: Math.max(0, ...window.__longtasks.map((t) => t.duration)),
        }};
    }}""")
    return page, got


def heatmap_reload(page: Any) -> tuple[float, float]:
    """The gradient-norm heatmap fetched and drawn again on the loaded page: ms from its request
    to drawn (its view's load() resolves once Plotly's draw has completed), and the server's part."""
    return page.evaluate("""async () => {
        const g = window.gradwatch;
        const before = performance.getEntriesByType('resource').length;
        const t0 = performance.now();
        await g.views.normMap.load({ state: g.state });
        const took = performance.now() - t0;
        const e = performance.getEntriesByType('resource').slice(before).find((x) => x.name.includes('/heatmap?metric=grad_norm'));
        return [took, e.responseEnd - e.startTime];
    }""")


def zoom_round_trip(page: Any, window: tuple[int, int], timeout_ms: int) -> tuple[float, float, int, int]:
    """Zoom the loss chart to `window` as a drag would (plotly_relayout with the new range);
    ms until every chart in view shows the window fetched again, then ms back to the overview; and the
    loss chart's points within the window against the steps in it (full resolution: equal)."""
    a, b = window
    t0 = page.evaluate(
        """([a, b]) => {
        const el = document.querySelector('[data-chart="loss"]');
        const t0 = performance.now();
        window.Plotly.relayout(el, {'xaxis.range[0]': a - 0.5, 'xaxis.range[1]': b + 0.5});
        return t0;
    }""",
        [a, b],
    )
    page.wait_for_function("w => document.body.dataset.zoom === w", arg=f"{a}-{b}", timeout=timeout_ms)
    zoomed = page.evaluate(f"({MARK})('gradwatch:zoomed')") - t0
    seen = page.evaluate(
        """([a, b]) => {
        const el = document.querySelector('[data-chart="loss"]');
        const line = el.data.find((t) => t.mode && t.mode.startsWith('lines') && t.hoverinfo !== 'skip');
        return line.x.filter((x) => x >= a && x <= b).length;
    }""",
        [a, b],
    )
    t1 = page.evaluate("""() => {
        const el = document.querySelector('[data-chart="loss"]');
        const t0 = performance.now();
        window.Plotly.relayout(el, {'xaxis.autorange': true});
        return t0;
    }""")
    page.wait_for_function("document.body.dataset.zoom === 'all'", timeout=timeout_ms)
    back = page.evaluate(f"({MARK})('gradwatch:zoomed')") - t1
    return zoomed, back, seen, b - a + 1


def finished_run(browser: Any, url: str, run_id: str, steps: int, rounds: int) -> dict[str, list[float]]:
    timeout = 120_000
    out: dict[str, list[float]] = {
        k: []
        for k in (
            "interactive",
            "interactive_revisit",
            "plotly",
            "heatmap",
            "heatmap_nav",
            "heatmap_server",
            "zoom",
            "zoom_out",
            "load_task",
        )
    }
    page_url = f"{url}/runs/{run_id}"
    # Warm the server once (its first diagnosis of a stored run, the OS's file cache).
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    context.new_page().goto(page_url)
    context.pages[0].wait_for_function("document.body.dataset.ready === '1'", timeout=timeout)
    context.close()
    width = 300  # steps in a zoomed window: fewer than a chart's pixels across, so full resolution
    for r in range(rounds):
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        context.add_init_script(LONGTASKS)
        page, got = open_run(context, page_url, timeout)
        out["interactive"].append(got["interactive"])
        if got["plotly"] is not None:  # a dashboard older than the mark has none
            out["plotly"].append(got["plotly"])
        out["heatmap_nav"].append(got["heatmap_drawn"])
        took, server = heatmap_reload(page)
        out["heatmap"].append(took)
        out["heatmap_server"].append(server)
        out["load_task"].append(got["longest_task"])
        for k in range(3):
            a = 1 + (steps - width) * (r * 3 + k + 1) // (rounds * 3 + 1)
            zoomed, back, seen, want = zoom_round_trip(page, (a, a + width - 1), timeout)
            if seen != want:
                print(f"  zoom to {a}-{a + width - 1}: the loss chart has {seen} of its {want} steps", flush=True)
            out["zoom"].append(zoomed)
            out["zoom_out"].append(back)
        page.close()
        # The same page again in the same browser: Plotly and the modules come from its caches.
        page, got = open_run(context, page_url, timeout)
        out["interactive_revisit"].append(got["interactive"])
        context.close()
        print(
            f"  round {r + 1}/{rounds}: interactive {out['interactive'][-1]:.0f} ms "
            f"(revisit {out['interactive_revisit'][-1]:.0f}), heatmap {out['heatmap'][-1]:.0f} ms "
            f"(server {out['heatmap_server'][-1]:.0f}), zoom {statistics.median(out['zoom'][-3:]):.0f} ms",
            flush=True,
        )
    return out


# -- live ------------------------------------------------------------------------------------


class LiveSender:
    """A hook speaking protocol v1 over /ws/ingest, a step every 1/rate s, each stamped with its send time."""

    def __init__(self, ws_url: str, run_id: str, params: int) -> None:
        from websockets.sync.client import connect  # the hook's own dependency

        self.names = param_names(params)
        self.data = Telemetry(params, seed=1)
        self.connection = connect(f"{ws_url}/ws/ingest", open_timeout=10, max_size=None)
        self.ws = self.connection.__enter__()
        self.ws.send(json.dumps(hello(run_id, f"live {params} tensors", self.names, time.time())))
        reply = json.loads(self.ws.recv(10))
        assert reply.get("type") == "welcome", reply
        self.step = 0
        self.sent: dict[int, float] = {}
        self.acks = threading.Thread(target=self._read_acks, daemon=True)
        self.acked = 0
        self.acks.start()

    def _read_acks(self) -> None:
        try:
            while True:
                msg = json.loads(self.ws.recv())
                if msg.get("type") == "ack":
                    self.acked = max(self.acked, msg["seq"])
        except Exception:  # the connection closed: the reader's work is done
            return

    def message(self, step: int) -> dict[str, Any]:
        arrays, scalars = self.data.block(np.array([step]))
        wire = {k: (float(v[0]) if math.isfinite(v[0]) else "NaN") for k, v in scalars.items()}
        return {
            "v": 1,
            "type": "step",
            "seq": step,
            "step": step,
            "time": 0.0,
            "scalars": wire,
            "params": {m: base64.b64encode(a[0].tobytes()).decode() for m, a in arrays.items() if m != "grad_status"},
            "grad_status": base64.b64encode(arrays["grad_status"][0].tobytes()).decode(),
        }

    def send(self, count: int, rate: float | None) -> None:
        """`count` more steps, at `rate` steps/s (None: at once); each message built before its slot."""
        start = time.monotonic()
        for k in range(count):
            self.step += 1
            msg = self.message(self.step)
            if rate:
                delay = start + k / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            msg["time"] = time.time()
            self.sent[self.step] = msg["time"]
            self.ws.send(json.dumps(msg))

    def close(self) -> None:
        self.step += 1
        self.ws.send(json.dumps({"v": 1, "type": "close", "seq": self.step, "status": "finished"}))
        deadline = time.monotonic() + 30
        while self.acked < self.step and time.monotonic() < deadline:
            time.sleep(0.05)
        self.connection.__exit__(None, None, None)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def live_run(browser: Any, url: str, params: int, rate: float, seconds: float) -> dict[str, Any]:
    run_id = f"bench-live-{int(time.time())}"
    sender = LiveSender(url.replace("http://", "ws://"), run_id, params)
    sender.send(40, None)  # the run has steps when the page opens: it picks the parameters to draw
    while sender.acked < 40:
        time.sleep(0.05)
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    context.add_init_script(LONGTASKS)
    page = context.new_page()
    page.goto(f"{url}/runs/{run_id}")
    page.wait_for_function("document.body.dataset.ready === '1'", timeout=120_000)
    page.wait_for_function("document.querySelector('.live')?.dataset.live === 'live'", timeout=30_000)
    page.wait_for_timeout(1000)
    first = sender.step + 1
    t_start = page.evaluate("performance.now()")
    count = int(rate * seconds)
    sender.send(count, rate)
    page.wait_for_timeout(3000)
    drawn = page.evaluate("window.__gradwatchLive || []")
    tasks = page.evaluate("(t0) => window.__longtasks.filter((t) => t.start >= t0)", t_start)
    in_view = page.evaluate("""() => [...document.querySelectorAll('[data-chart]')]
        .filter((el) => { const r = el.getBoundingClientRect(); return r.bottom > 0 && r.top < innerHeight; })
        .map((el) => el.dataset.chart)""")
    sender.close()
    context.close()
    steps = list(range(first, first + count))
    per_chart: dict[str, list[float]] = {}
    for chart in sorted({d["chart"] for d in drawn}):
        entries = sorted((d["step"], d["t"]) for d in drawn if d["chart"] == chart)
        latencies = []
        for s in steps:
            t = min((t for st, t in entries if st >= s), default=None)
            if t is not None:
                latencies.append(t - sender.sent[s] * 1000)
        if latencies:
            per_chart[chart] = latencies
    return {"per_chart": per_chart, "in_view": in_view, "steps": count, "tasks": tasks}


# -- main ------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", type=int, default=1000, help="parameter tensors (default 1000)")
    ap.add_argument("--steps", type=int, default=10_000, help="steps of the finished run (default 10000)")
    ap.add_argument("--rounds", type=int, default=3, help="page loads measured (default 3)")
    ap.add_argument("--rate", type=float, default=20.0, help="live steps per second (default 20)")
    ap.add_argument("--live-seconds", type=float, default=20.0, help="how long the live run streams (default 20)")
    ap.add_argument("--db", type=Path, help="SQLite file to build the finished run in (default: a temporary one)")
    ap.add_argument(
        "--reuse-db",
        action="store_true",
        help="with --db: use the finished run already built there by an earlier run of the same size",
    )
    ap.add_argument(
        "--installed-frontend",
        action="store_true",
        help="serve the dashboard installed with gradwatch-server, not this checkout's frontend/",
    )
    ap.add_argument(
        "--frontend",
        type=Path,
        help="serve the dashboard in this folder (e.g. an older commit's frontend/, to compare)",
    )
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright  # requirements-test.txt

    repo = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory() as tmp:
        db = args.db or Path(tmp) / "dashboard.db"
        run_id = f"bench-finished-{args.params}x{args.steps}"
        if args.reuse_db and args.db and has_run(db, run_id):
            print(f"reusing the finished run {run_id} in {db}", flush=True)
        else:
            for suffix in ("", "-wal", "-shm"):
                Path(f"{db}{suffix}").unlink(missing_ok=True)
            t0 = time.perf_counter()
            build_finished_run(db, args.params, args.steps, run_id)
            built = time.perf_counter() - t0
            print(
                f"built a finished run of {args.params} tensors x {args.steps} steps in {built:.1f} s "
                f"({db.stat().st_size / 2**20:.0f} MiB)",
                flush=True,
            )
        server, url = start_server(db, None if args.installed_frontend else args.frontend or repo / "frontend")
        try:
            t0 = time.perf_counter()
            urllib.request.urlopen(f"{url}/api/runs/{run_id}/diagnostics", timeout=600).read()
            print(
                "first diagnosis of the stored run (once per run, on its first view): "
                f"{time.perf_counter() - t0:.1f} s",
                flush=True,
            )
            with sync_playwright() as pw:
                browser = pw.chromium.launch(
                    executable_path=chromium_path(),
                    args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
                )
                try:
                    fin = finished_run(browser, url, run_id, args.steps, args.rounds)
                    print(
                        f"live run: {args.params} tensors at {args.rate:g} steps/s for {args.live_seconds:g} s",
                        flush=True,
                    )
                    live = live_run(browser, url, args.params, args.rate, args.live_seconds)
                finally:
                    browser.close()
        finally:
            server.send_signal(signal.SIGINT)
            try:
                server.wait(timeout=15)
            except subprocess.TimeoutExpired:
                server.kill()
    report(args, fin, live)


def report(args: argparse.Namespace, fin: dict[str, list[float]], live: dict[str, Any]) -> None:
    med = {k: statistics.median(v) for k, v in fin.items() if v}
    line_charts = {
        c: v for c, v in live["per_chart"].items() if c in live["in_view"] and "heatmap" not in c and c != "grad-status"
    }
    heat = {c: v for c, v in live["per_chart"].items() if c in live["in_view"] and c not in line_charts}
    p95_line = max((percentile(v, 0.95) for v in line_charts.values()), default=float("nan"))
    p95_heat = max((percentile(v, 0.95) for v in heat.values()), default=float("nan"))
    drawn = min((len(v) for v in line_charts.values()), default=0)
    longest = max((t["duration"] for t in live["tasks"]), default=0.0)
    over = sum(1 for t in live["tasks"] if t["duration"] > 100)

    def row(name: str, target: str, value: float, ok: bool | None, note: str = "") -> str:
        mark = "" if ok is None else ("yes" if ok else "**no**")
        return f"| {name} | {target} | {value:.0f} ms | {mark} | {note} |"

    print()
    print(
        f"Dashboard, {args.params} parameter tensors x {args.steps} steps (SQLite), headless Chromium 1400x900, "
        f"{os.cpu_count()} cores; medians over {args.rounds} page loads ({3 * args.rounds} zooms)"
    )
    print("| measure | target | measured | met | |")
    print("|---|---|---|---|---|")
    print(
        row(
            "run page interactive (every chart drawn), first visit",
            "< 1500 ms",
            med["interactive"],
            med["interactive"] < TARGETS_MS["interactive"],
            "from navigation; Plotly downloaded and compiled"
            + (f" ({med['plotly']:.0f} ms from navigation)" if "plotly" in med else ""),
        )
    )
    print(
        row(
            "run page interactive, revisit",
            "< 1500 ms",
            med["interactive_revisit"],
            med["interactive_revisit"] < TARGETS_MS["interactive"],
            "Plotly from the browser's caches",
        )
    )
    print(
        row(
            "gradient-norm heatmap fetched and drawn",
            "< 500 ms",
            med["heatmap"],
            med["heatmap"] < TARGETS_MS["heatmap"],
            f"on the loaded page, request -> drawn; server {med['heatmap_server']:.0f} ms; "
            f"first load: drawn {med['heatmap_nav']:.0f} ms from navigation",
        )
    )
    print(
        row(
            "zoom round trip (window of 300 steps at full resolution)",
            "< 300 ms",
            med["zoom"],
            med["zoom"] < TARGETS_MS["zoom"],
            f"the charts in view; back to the overview {med['zoom_out']:.0f} ms",
        )
    )
    print(
        row(
            f"live: send -> drawn, p95 ({args.rate:g} steps/s, line charts in view)",
            "< 250 ms",
            p95_line,
            p95_line < TARGETS_MS["live_p95"],
            f"{len(line_charts)} charts, {drawn}/{live['steps']} steps each",
        )
    )
    print(
        row(
            "live: longest main-thread task while streaming",
            "< 100 ms",
            longest,
            longest <= TARGETS_MS["longest_task"],
            f"{over} tasks over 100 ms",
        )
    )
    if heat:
        print(
            row(
                "live: send -> drawn, p95, heatmaps in view",
                "",
                p95_heat,
                None,
                "heatmaps redraw at most once a second",
            )
        )
    print(row("longest main-thread task while the finished run loads", "", med["load_task"], None, ""))


if __name__ == "__main__":
    main()

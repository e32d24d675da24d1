"""`gradwatch serve --workers 2` on a real PostgreSQL: live updates reach every browser whichever
worker ingested them, exactly once; crash detection holds across workers; SQLite is refused.

Hooks and dashboards are real websocket clients speaking docs/protocol.md by hand. Each socket's
handshake names the worker that serves it (`X-Gradwatch-Worker`), so the tests place hooks and
browsers on both workers (the kernel hands each connection on the shared socket to one of them)
and know that every path between them is crossed.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import json
import math
import os
import signal
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from websockets.sync.client import ClientConnection, connect

from support.databases import new_database
from support.server import ServerProcess, server_command, server_env, start_server
from support.synthetic_dist import rank_runs

#: asserts on wall-clock time: `make test` runs it alone, after the parallel tests
pytestmark = pytest.mark.timed

WORKERS = 2
WORKER_HEADER = "x-gradwatch-worker"
STEPS = 30
BURST = 5  # steps sent before waiting for the ack: batches of several steps
PARAMS = ("fc.weight", "fc.bias", "head.weight")
DEADLINE_S = 90.0


# -- the server ------------------------------------------------------------------------------


@pytest.fixture
def pg_url(request: pytest.FixtureRequest, postgres: object, tmp_path: Path) -> Iterator[str]:
    with new_database(request, "postgresql", tmp_path) as url:
        yield url


class Workers:
    """A `gradwatch serve --workers 2` and the worker pids its sockets have named."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        self.seen: set[int] = set()
        self.sockets = contextlib.ExitStack()  # every client socket, closed at the end

    def stop(self) -> int:
        self.sockets.close()
        code = self.server.stop()
        for pid in self.seen:  # a worker that outlived its parent (killed when it hung): this server's only
            with contextlib.suppress(OSError):
                environ = Path(f"/proc/{pid}/environ").read_bytes()
                if b"GRADWATCH_SERVE_WORKER=" in environ and self.server.db_url.encode() in environ:
                    os.kill(pid, signal.SIGKILL)
        return code


@pytest.fixture
def serve_workers(tmp_path: Path, pg_url: str) -> Iterator[Callable[..., Workers]]:
    """Starts the server (crash grace 1 s unless told: a hook that moves between workers on a
    loaded machine may take longer than 1 s to land on the one it wants); stops it at the end."""
    started: list[Workers] = []

    def serve(crash_grace_s: float = 1.0) -> Workers:
        started.append(
            Workers(
                start_server(tmp_path, db_url=pg_url, args=("--workers", str(WORKERS)), crash_grace_s=crash_grace_s)
            )
        )
        return started[-1]

    yield serve
    for server in started:
        server.stop()


# -- clients -----------------------------------------------------------------------------------


def open_ws(workers: Workers, path: str) -> tuple[ClientConnection, int]:
    ws = workers.sockets.enter_context(
        connect(workers.server.ws_url + path, open_timeout=10, close_timeout=2, max_size=None)
    )
    assert ws.response is not None
    pid = int(ws.response.headers[WORKER_HEADER])
    workers.seen.add(pid)
    return ws, pid


def spread(
    open_one: Callable[[], tuple[ClientConnection, int]], per_worker: int, pids: int = WORKERS
) -> list[tuple[ClientConnection, int]]:
    """Open connections until `per_worker` of them are on each of `pids` workers (all are kept)."""
    opened: list[tuple[ClientConnection, int]] = []
    counts: collections.Counter[int] = collections.Counter()
    deadline = time.monotonic() + DEADLINE_S
    while len(counts) < pids or min(counts.values()) < per_worker:
        assert time.monotonic() < deadline, f"connections landed on these workers only: {dict(counts)}"
        ws, pid = open_one()
        opened.append((ws, pid))
        counts[pid] += 1
    return opened


class Browser(threading.Thread):
    """A dashboard on /ws/live (`run`: that run's page): keeps every message it receives."""

    def __init__(self, ws: ClientConnection, pid: int, run: str | None) -> None:
        super().__init__(daemon=True)
        self.ws, self.pid, self.run_id = ws, pid, run
        self.messages: list[dict[str, Any]] = []
        self.closed_with: int | None = None
        self.stopping = threading.Event()
        self.start()

    def run(self) -> None:  # type: ignore[override]
        try:
            while not self.stopping.is_set():
                try:
                    self.messages.append(json.loads(self.ws.recv(timeout=0.2)))
                except TimeoutError:
                    continue
        except Exception as exc:  # closed by the server: recorded, and the test says so
            rcvd = getattr(exc, "rcvd", None)
            self.closed_with = rcvd.code if rcvd is not None else -1

    def steps(self) -> list[dict[str, Any]]:
        return [m for m in self.messages if m["type"] == "step"]

    def runs(self, run_id: str) -> list[dict[str, Any]]:
        return [m["run"] for m in self.messages if m["type"] == "run" and m["run"]["id"] == run_id]

    def stop(self) -> None:
        self.stopping.set()
        self.join(10)
        self.ws.close()


def browsers(workers: Workers, run: str | None, per_worker: int) -> list[Browser]:
    path = "/ws/live" + (f"?run={run}" if run else "")
    return [Browser(ws, pid, run) for ws, pid in spread(lambda: open_ws(workers, path), per_worker)]


def b64(values: list[float] | list[int], dtype: str) -> str:
    return base64.b64encode(np.array(values, dtype=dtype).tobytes()).decode("ascii")


def sent_values(run_index: int, step: int) -> dict[str, Any]:
    """What a hook sends at a step (exact in float32), as /ws/live must show it: every 7th step a
    NaN gradient, in head.weight, but in fc.weight between steps 11 and 20."""
    nan_at = None if step % 7 else (0 if 11 <= step <= 20 else 2)
    grad_norm = [step / 8, -float(run_index), 0.25]
    status = [2, 2, 2]
    if nan_at is not None:
        grad_norm[nan_at], status[nan_at] = float("nan"), 3
    return {
        "scalars": {"loss": 1.0 / step, "lr/0": 0.001 * run_index},
        "params": {"grad_norm": grad_norm, "exp_avg_norm": [step * 0.5, 1.0, 2.0]},
        "grad_status": status,
    }


def expected_step(run_id: str, run_index: int, step: int) -> dict[str, Any]:
    values = sent_values(run_index, step)
    params = {m: ["NaN" if v != v else v for v in vs] for m, vs in values["params"].items()}
    return {
        "type": "step",
        "run_id": run_id,
        "step": step,
        "time": 1_700_000_000.0 + step,
        "scalars": values["scalars"],
        "params": params,
        "grad_status": values["grad_status"],
    }


class Hook:
    """A training run's hook on /ws/ingest, on the worker it is told to use."""

    def __init__(self, workers: Workers, run_id: str, run_index: int) -> None:
        self.workers, self.run_id, self.run_index = workers, run_id, run_index
        self.ws: ClientConnection | None = None
        self.pids: list[int] = []  # the worker of each connection
        self.findings: list[list[dict[str, Any]]] = []  # the findings sent on each connection
        self.last_seq = 0

    def connect(self, pid: int | None = None) -> None:
        """Connect (to worker `pid` if given: others are closed before the hello) and say hello."""
        deadline = time.monotonic() + DEADLINE_S
        while True:
            ws, served_by = open_ws(self.workers, "/ws/ingest")
            if pid is None or served_by == pid:
                break
            ws.close()
            assert time.monotonic() < deadline, f"no connection reached worker {pid}"
        self.ws = ws
        self.pids.append(served_by)
        self.findings.append([])
        params = [{"name": n, "shape": [4], "numel": 4, "dtype": "float32", "group": 0, "optimizer": 0} for n in PARAMS]
        welcome = self.call(
            {
                "v": 1,
                "type": "hello",
                "run": {
                    "id": self.run_id,
                    "name": self.run_id,
                    "project": "workers",
                    "started_at": 1_700_000_000.0,
                    "hook_version": "0.1.0",
                    "optimizer": "AdamW",
                    "config": {"every": 1},
                },
                "params": params,
                "groups": [{"optimizer": 0, "index": 0, "name": None, "hparams": {"lr": 0.001}}],
            }
        )
        assert welcome["type"] == "welcome", welcome
        self.last_seq = welcome["last_seq"]

    def call(self, message: dict[str, Any]) -> dict[str, Any]:
        assert self.ws is not None
        self.ws.send(json.dumps(message))
        return self.reply()

    def reply(self) -> dict[str, Any]:
        assert self.ws is not None
        while True:
            frame = json.loads(self.ws.recv(timeout=30))
            if frame["type"] != "finding":
                return dict(frame)
            self.findings[-1].append(frame["finding"])

    def send_steps(self, first: int, last: int) -> None:
        """Steps first..last (seq = step), BURST at a time, each burst acknowledged."""
        assert self.ws is not None
        for start in range(first, last + 1, BURST):
            burst = range(start, min(start + BURST, last + 1))
            for step in burst:
                values = sent_values(self.run_index, step)
                self.ws.send(
                    json.dumps(
                        {
                            "v": 1,
                            "type": "step",
                            "seq": step,
                            "step": step,
                            "time": 1_700_000_000.0 + step,
                            "scalars": values["scalars"],
                            "params": {m: b64(vs, "<f4") for m, vs in values["params"].items()},
                            "grad_status": b64(values["grad_status"], "u1"),
                        }
                    )
                )
            while self.last_seq < burst[-1]:
                ack = self.reply()
                assert ack["type"] == "ack", ack
                self.last_seq = ack["seq"]

    def finish(self) -> None:
        assert self.call({"v": 1, "type": "close", "seq": STEPS + 1, "status": "finished"}) == {
            "type": "ack",
            "seq": STEPS + 1,
        }
        self.drop()

    def drop(self) -> None:
        """End the connection without a `close` message (the hook vanished, or reconnects)."""
        assert self.ws is not None
        self.ws.close()
        self.ws = None


def wait_until(condition: Callable[[], bool], what: str, timeout: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def job_owners(pg_url: str) -> list[int]:
    """The pids of the workers that hold a job's assembly in this database (an exclusive
    advisory lock on the relay's connection, named after its worker; the hooks' are shared)."""
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.locktype = 'advisory' AND l.mode = 'ExclusiveLock' AND l.granted "
            "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        ).fetchall()
    return sorted(int(name.rsplit(" ", 1)[1]) for (name,) in rows)


def get_run(workers: Workers, run_id: str) -> dict[str, Any]:
    response = httpx.get(f"{workers.server.url}/api/runs/{run_id}", timeout=30)
    assert response.status_code == 200, response.text
    return dict(response.json())


# -- tests -------------------------------------------------------------------------------------


def test_postgresql_workers_deliver_every_step_to_every_browser_once(serve_workers: Callable[..., Workers]) -> None:
    """Three runs: one ingested by each worker, one that moves from the first to the second half
    way. Browsers on both workers (the ingesting one included: every worker delivers only what
    PostgreSQL notifies) get every step once, in order, exactly as sent, and each run's events."""
    workers = serve_workers(crash_grace_s=60)
    runs = ["wk-first", "wk-second", "wk-moving"]
    watchers = {run: browsers(workers, run, per_worker=2) for run in runs}
    listers = browsers(workers, None, per_worker=2)
    pids = sorted({b.pid for b in listers})
    assert len(pids) == WORKERS
    hooks = [Hook(workers, run, index) for index, run in enumerate(runs, 1)]

    def stream(hook: Hook, pid: int, moves_to: int | None) -> None:
        hook.connect(pid)
        if moves_to is None:
            hook.send_steps(1, STEPS)
        else:  # half the run on one worker, then the hook reconnects and resumes on the other
            hook.send_steps(1, STEPS // 2)
            hook.drop()
            hook.connect(moves_to)
            assert hook.last_seq == STEPS // 2
            hook.send_steps(STEPS // 2 + 1, STEPS)
        hook.finish()

    errors: list[BaseException] = []

    def run_hook(*args: Any) -> None:
        try:
            stream(*args)
        except BaseException as exc:  # reported by the test below
            errors.append(exc)

    threads = [
        threading.Thread(target=run_hook, args=args)
        for args in [(hooks[0], pids[0], None), (hooks[1], pids[1], None), (hooks[2], pids[0], pids[1])]
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(DEADLINE_S)
    assert not errors, errors
    assert [h.pids for h in hooks] == [[pids[0]], [pids[1]], [pids[0], pids[1]]]

    every = [b for group in watchers.values() for b in group] + listers
    wait_until(
        lambda: (
            all(len(b.steps()) >= STEPS for group in watchers.values() for b in group)
            and all(len(b.runs(run)) >= 2 for b in every for run in runs)
        ),
        "every browser's messages",
    )
    time.sleep(1.0)  # anything sent twice would arrive now
    for b in every:
        b.stop()

    for index, run in enumerate(runs, 1):
        expected = [expected_step(run, index, step) for step in range(1, STEPS + 1)]
        for b in watchers[run]:
            assert b.closed_with is None, (b.pid, b.closed_with)
            assert b.steps() == expected, f"a browser on worker {b.pid} watching {run}"
        for b in every:
            events = [(r["status"], r["steps"]) for r in b.runs(run)]
            assert events == [("running", 0), ("finished", STEPS)], (b.pid, run, events)
        stored = get_run(workers, run)
        assert (stored["status"], stored["steps"], stored["last_step"]) == ("finished", STEPS, STEPS)
        export = httpx.get(f"{workers.server.url}/api/runs/{run}/export", params={"format": "json"}, timeout=30)
        lines = [json.loads(line) for line in export.text.splitlines()]
        assert [line["step"] for line in lines[1:]] == list(range(1, STEPS + 1))  # each step stored once
    assert workers.stop() == 0
    log = workers.server.log()
    assert "Traceback" not in log and "live relay" not in log, log


def test_postgresql_workers_mark_a_vanished_hook_crashed_once_and_never_a_live_one(
    serve_workers: Callable[..., Workers],
) -> None:
    """A worker that (re)starts watches every running run: it must leave alone a run whose hook
    is connected to another worker, however long that hook stays quiet."""
    workers = serve_workers(crash_grace_s=1.0)
    (first, first_pid), *others = spread(lambda: open_ws(workers, "/ws/live"), per_worker=1)
    first.close()
    for ws, _ in others:
        ws.close()
    other_pid = next(pid for _, pid in others if pid != first_pid)

    quiet = Hook(workers, "wk-quiet", 1)
    quiet.connect(first_pid)
    quiet.send_steps(1, 2)
    # The other worker dies; uvicorn starts a new one, which watches every running run.
    os.kill(other_pid, signal.SIGKILL)

    def new_worker() -> bool:
        with contextlib.suppress(httpx.HTTPError):
            pid = httpx.get(f"{workers.server.url}/api/health", timeout=5).json()["worker"]
            workers.seen.add(pid)
        return len(workers.seen - {first_pid, other_pid}) > 0

    wait_until(new_worker, "a new worker")
    time.sleep(3.0)  # three crash grace periods (start_server: 1 s)
    assert get_run(workers, "wk-quiet")["status"] == "running"

    # A run with a connection on each worker, both ending without `close`: both workers' timers run out.
    listers = browsers(workers, None, per_worker=2)
    on_first, on_new = Hook(workers, "wk-vanished", 2), Hook(workers, "wk-vanished", 2)
    on_first.connect(first_pid)
    on_new.connect(min(workers.seen - {first_pid, other_pid}))
    on_new.send_steps(1, 3)
    on_first.drop()
    on_new.drop()
    wait_until(lambda: all(len(b.runs("wk-vanished")) >= 2 for b in listers), "the crashed run's event")
    time.sleep(3.0)  # every worker's timer has run out: one mark, one event per browser
    for b in listers:
        b.stop()
        events = [(r["status"], r["steps"]) for r in b.runs("wk-vanished")]
        assert events == [("running", 0), ("crashed", 3)], (b.pid, events)
    assert get_run(workers, "wk-vanished")["status"] == "crashed"
    assert get_run(workers, "wk-quiet")["status"] == "running"
    quiet.send_steps(3, STEPS)
    quiet.finish()
    assert get_run(workers, "wk-quiet")["status"] == "finished"


def test_postgresql_workers_keep_a_moving_runs_findings_whole(serve_workers: Callable[..., Workers]) -> None:
    """A hook that comes back to a worker after streaming to another: that worker's diagnostics
    catch up with the steps stored meanwhile (NaN in head.weight at step 7 on the first worker,
    in fc.weight at step 14 on the second; the first worker reports both when the hook is back)."""
    workers = serve_workers(crash_grace_s=60)
    pids = sorted({pid for _, pid in spread(lambda: open_ws(workers, "/ws/live"), per_worker=1)})
    hook = Hook(workers, "wk-diagnosed", 1)
    for pid, (first, last) in zip([pids[0], pids[1], pids[0]], [(1, 10), (11, 20), (21, STEPS)]):
        hook.connect(pid)
        hook.send_steps(first, last)
        if last < STEPS:
            hook.drop()
    hook.finish()
    assert hook.pids == [pids[0], pids[1], pids[0]]
    whole = {"code": "nonfinite_grad", "severity": "error", "params": ["fc.weight", "head.weight"], "first_step": 7}

    def nonfinite(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: f[k] for k in whole} for f in found if f["code"] == "nonfinite_grad"]

    # A hook is sent a finding when it is new on its connection or graver, not when its parameters grow.
    first_half = {**whole, "params": ["head.weight"]}
    assert nonfinite(hook.findings[0]) == nonfinite(hook.findings[1]) == [first_half]
    assert nonfinite(hook.findings[2]) == [whole]  # not the first worker's view of steps 1-10 alone
    for _ in range(4):  # whichever worker answers
        response = httpx.get(f"{workers.server.url}/api/runs/wk-diagnosed/diagnostics", timeout=30)
        assert nonfinite(response.json()) == [whole]


def test_postgresql_workers_send_the_flight_recorders_late_steps_to_every_browser(
    serve_workers: Callable[..., Workers],
) -> None:
    """Steps 11-14 are sent with their loss only, then the flight recorder sends 12 and 13 again
    with their gradient norms (`flight/resent`): a browser watching the run on either worker gets
    them once, with the norms sent and the marker, so that its page fetches its series again."""
    workers = serve_workers(crash_grace_s=60)
    watchers = browsers(workers, "wk-late", per_worker=1)
    hook = Hook(workers, "wk-late", 1)
    hook.connect()
    hook.send_steps(1, 10)
    late = {12: [0.5, 0.25, 40.0], 13: [0.5, 0.25, 0.75]}
    for seq, step, params in [(n, n, None) for n in range(11, 15)] + [(15, 12, late[12]), (16, 13, late[13])]:
        message: dict[str, Any] = {
            "v": 1,
            "type": "step",
            "seq": seq,
            "step": step,
            "time": 1_700_000_000.0 + step,
            "scalars": {"loss": 0.5} if params is None else {"loss": 0.5, "flight/resent": 1.0},
            "params": {} if params is None else {"grad_norm": b64(params, "<f4")},
        }
        assert hook.call(message) == {"type": "ack", "seq": seq, "linger": pytest.approx(0.25)}

    def resent(b: Browser) -> list[tuple[int, list[float], float]]:
        return [
            (m["step"], m["params"]["grad_norm"], m["scalars"]["flight/resent"])
            for m in b.steps()
            if "flight/resent" in m["scalars"]
        ]

    wait_until(lambda: all(len(resent(b)) >= 2 for b in watchers), "the late steps on every browser")
    time.sleep(1.0)  # anything sent twice would arrive now
    for b in watchers:
        b.stop()
        assert resent(b) == [(12, late[12], 1.0), (13, late[13], 1.0)], f"a browser on worker {b.pid}"
        assert [m["step"] for m in b.steps() if "flight/resent" not in m["scalars"]] == list(range(1, 15))
    assert workers.stop() == 0
    assert "Traceback" not in workers.server.log()


def test_postgresql_workers_recover_when_their_database_connections_drop(
    serve_workers: Callable[..., Workers], pg_url: str
) -> None:
    """Notifications sent while a relay connection is down are lost: the browsers are closed with
    1013 (reconnect and catch up over REST), and live updates flow again once reconnected."""
    import psycopg

    workers = serve_workers(crash_grace_s=60)
    hook, other = Hook(workers, "wk-recovering", 1), Hook(workers, "wk-announced", 2)
    watching = browsers(workers, "wk-recovering", per_worker=1)
    hook.connect(watching[0].pid)
    other.connect(watching[0].pid)
    hook.send_steps(1, 5)
    wait_until(lambda: all(len(b.steps()) == 5 for b in watching), "the first steps")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        ended = conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name LIKE 'gradwatch relay %'"
        ).fetchone()
    assert ended == (2 * WORKERS,)  # a listening and a notifying connection per worker
    wait_until(lambda: all(b.closed_with == 1013 for b in watching), "the browsers closed with 1013")
    wait_until(lambda: workers.server.log().count("live relay: listening again") == WORKERS, "the listeners")
    # Another run ends on that worker: its `run` event meets the dead notify connection and is
    # lost, so the worker connects again and tells every worker to resync (browsers closed, 1013).
    late = browsers(workers, "wk-recovering", per_worker=1)
    other.finish()
    wait_until(lambda: all(b.closed_with == 1013 for b in late), "the resync")
    assert "live relay: cannot notify the workers" in workers.server.log()
    watching = browsers(workers, "wk-recovering", per_worker=1)
    hook.send_steps(6, 12)
    expected = [expected_step("wk-recovering", 1, step) for step in range(6, 13)]
    wait_until(lambda: all(len(b.steps()) >= len(expected) for b in watching), "the later steps")
    time.sleep(0.5)
    for b in watching:
        b.stop()
        assert b.closed_with is None and b.steps() == expected, b.pid
    hook.send_steps(13, STEPS)
    hook.finish()
    assert get_run(workers, "wk-recovering")["steps"] == STEPS


#: A job whose ranks stream to both workers: JOB_RANKS ranks, rank JOB_STRAGGLER the straggler.
JOB, JOB_RANKS, JOB_STEPS, JOB_STRAGGLER = "wk-job", 8, 12, 3


def test_postgresql_workers_assemble_a_job_whose_ranks_are_on_both(
    serve_workers: Callable[..., Workers], pg_url: str
) -> None:
    """A job of 8 ranks, 4 streaming to each worker: every global step is assembled once,
    whole (no partial step, no lost rank), its total norm exact (oracle: the square root of the
    sum of every rank's squared local norms, FSDP-like pieces all counted), and the spread across
    the ranks is each step's quantiles of what they sent, the straggler its outlier. One worker
    owns the job's assembly while it runs, and lets go of it once the job has finished."""
    workers = serve_workers(crash_grace_s=60)
    pids = sorted({pid for _, pid in spread(lambda: open_ws(workers, "/ws/live"), per_worker=1)})
    ranks = rank_runs(JOB, "job-on-two-workers", JOB_RANKS, straggler=JOB_STRAGGLER)
    sockets: list[ClientConnection] = []
    for run in ranks:  # even ranks on one worker, odd on the other
        ws, pid = open_ws(workers, "/ws/ingest")
        while pid != pids[run.rank % 2]:
            ws.close()
            ws, pid = open_ws(workers, "/ws/ingest")
        ws.send(json.dumps(run.hello()))
        assert json.loads(ws.recv(30))["type"] == "welcome"
        sockets.append(ws)
    grads: dict[int, list[np.ndarray]] = {}
    for first in range(1, JOB_STEPS + 1, BURST):  # a burst of every rank's steps, then their acks
        burst = range(first, min(first + BURST, JOB_STEPS + 1))
        for run, ws in zip(ranks, sockets, strict=True):
            for step in burst:
                message = run.step(step, step)
                grads.setdefault(step, []).append(
                    np.frombuffer(base64.b64decode(message["params"]["grad_norm"]), "<f4")
                )
                ws.send(json.dumps(message))
        for ws in sockets:
            acked = 0
            while acked < burst[-1]:
                frame = json.loads(ws.recv(30))
                assert frame["type"] in ("ack", "finding"), frame
                acked = frame["seq"] if frame["type"] == "ack" else acked
    owners = job_owners(pg_url)
    assert len(owners) == 1 and owners[0] in pids, (owners, pids)
    for ws in sockets:
        ws.send(json.dumps({"v": 1, "type": "close", "seq": JOB_STEPS + 1, "status": "finished"}))
    wait_until(lambda: get_run(workers, JOB)["status"] == "finished", "the job finished")
    wait_until(lambda: job_owners(pg_url) == [], "the owner let go of the finished job")

    job = get_run(workers, JOB)
    assert (job["steps"], job["last_step"]) == (JOB_STEPS, JOB_STEPS)
    answer = httpx.get(f"{workers.server.url}/api/runs/{JOB}/ranks", timeout=30).json()
    assert [(r["rank"], r["steps"], r["lost"]) for r in answer["ranks"]] == [
        (r, JOB_STEPS, False) for r in range(JOB_RANKS)
    ]
    assert answer["partial"] == {"steps": 0, "ranges": []}
    totals = httpx.get(f"{workers.server.url}/api/runs/{JOB}/series", params={"key": "grad_norm_total"}).json()
    assert totals["step"] == list(range(1, JOB_STEPS + 1))
    for step, total in zip(totals["step"], totals["value"], strict=True):
        pieces = np.stack(grads[step]).astype(np.float64)
        per_param = np.sqrt((pieces**2).sum(axis=0)).astype(np.float32).astype(np.float64)
        assert total == pytest.approx(math.sqrt(float((per_param**2).sum())), rel=1e-6), step
    found = httpx.get(
        f"{workers.server.url}/api/runs/{JOB}/ranks/spread", params={"metric": "time/before_backward_s"}
    ).json()
    assert found["steps"] == list(range(1, JOB_STEPS + 1)) and found["ranks"] == JOB_RANKS
    for i, step in enumerate(found["steps"]):
        sent = sorted(r.sent[step]["time/before_backward_s"] for r in ranks)
        cuts = statistics.quantiles(sent, n=20, method="inclusive")
        got = [found[q][i] for q in ("min", "p5", "p50", "p95", "max")]
        assert got == pytest.approx([sent[0], cuts[0], cuts[9], cuts[18], sent[-1]], rel=1e-12), step
    assert [o["rank"] for o in found["outliers"]] == [JOB_STRAGGLER]
    for ws in sockets:
        ws.close()
    assert workers.stop() == 0
    log = workers.server.log()
    assert "Traceback" not in log, log


KILLED_JOB, KILLED_RANKS, KILLED_STEPS, KILL_AFTER = "wk-killed", 4, 9, 6


@pytest.mark.parametrize("victim", ["owner", "other"])
def test_postgresql_workers_lose_no_job_step_when_one_is_killed_mid_job(
    serve_workers: Callable[..., Workers], pg_url: str, victim: str
) -> None:
    """A job of 4 ranks, 2 on each worker; once step 6 is acknowledged every rank sends steps 7 to
    9 and one worker is SIGKILLed at once (its ranks' frames, its assemblies, maybe under way):
    the one that owns the job's assembly, or the other, which only stores its ranks' rows (and
    acknowledges them once committed). The survivor takes the job over if it did not own it.
    The killed worker's ranks reconnect to the survivor and send every step again, as a hook
    resends what is unacknowledged: every global step is stored once and whole (no partial step,
    no lost rank), its total norm exact (oracle: the square root of the sum of every rank's
    squared local norms)."""
    workers = serve_workers(crash_grace_s=60)
    pids = sorted({pid for _, pid in spread(lambda: open_ws(workers, "/ws/live"), per_worker=1)})
    ranks = rank_runs(KILLED_JOB, "job-worker-killed", KILLED_RANKS)
    sent: dict[int, dict[int, dict[str, Any]]] = {run.rank: {} for run in ranks}

    def connect(run: Any, avoid: int | None = None, want: int | None = None) -> ClientConnection:
        ws, pid = open_ws(workers, "/ws/ingest")
        while (want is not None and pid != want) or pid == avoid:
            ws.close()
            ws, pid = open_ws(workers, "/ws/ingest")
        ws.send(json.dumps(run.hello()))
        assert json.loads(ws.recv(30))["type"] == "welcome"
        return ws

    def send(run: Any, ws: ClientConnection, steps: range) -> None:
        for step in steps:
            message = sent[run.rank].setdefault(step, run.step(step, step))
            ws.send(json.dumps(message))

    def acked(ws: ClientConnection, last: int) -> None:
        seq = 0
        while seq < last:
            frame = json.loads(ws.recv(30))
            assert frame["type"] in ("ack", "finding"), frame
            seq = frame["seq"] if frame["type"] == "ack" else seq

    sockets = [connect(run, want=pids[run.rank % 2]) for run in ranks]
    for run, ws in zip(ranks, sockets, strict=True):
        send(run, ws, range(1, KILL_AFTER + 1))
    for ws in sockets:
        acked(ws, KILL_AFTER)
    owners = job_owners(pg_url)
    assert len(owners) == 1 and owners[0] in pids, (owners, pids)
    killed = owners[0] if victim == "owner" else next(p for p in pids if p != owners[0])
    for run, ws in zip(ranks, sockets, strict=True):
        send(run, ws, range(KILL_AFTER + 1, KILLED_STEPS + 1))
    os.kill(killed, signal.SIGKILL)
    for run, ws in zip(ranks, sockets, strict=True):
        if pids[run.rank % 2] == killed:  # what it acknowledged may be all it stored
            ws.close()
            sockets[run.rank] = ws = connect(run, avoid=killed)
            send(run, ws, range(1, KILLED_STEPS + 1))
        acked(ws, KILLED_STEPS)
    for ws in sockets:
        ws.send(json.dumps({"v": 1, "type": "close", "seq": KILLED_STEPS + 1, "status": "finished"}))
    wait_until(lambda: get_run(workers, KILLED_JOB)["status"] == "finished", "the job finished")
    wait_until(lambda: job_owners(pg_url) == [], "the survivor let go of the finished job")

    job = get_run(workers, KILLED_JOB)
    assert (job["steps"], job["last_step"]) == (KILLED_STEPS, KILLED_STEPS)
    answer = httpx.get(f"{workers.server.url}/api/runs/{KILLED_JOB}/ranks", timeout=30).json()
    assert [(r["rank"], r["steps"], r["lost"]) for r in answer["ranks"]] == [
        (r, KILLED_STEPS, False) for r in range(KILLED_RANKS)
    ]
    assert answer["partial"] == {"steps": 0, "ranges": []}
    totals = httpx.get(f"{workers.server.url}/api/runs/{KILLED_JOB}/series", params={"key": "grad_norm_total"}).json()
    assert totals["step"] == list(range(1, KILLED_STEPS + 1))
    for step, total in zip(totals["step"], totals["value"], strict=True):
        pieces = np.stack(
            [np.frombuffer(base64.b64decode(sent[r][step]["params"]["grad_norm"]), "<f4") for r in sent]
        ).astype(np.float64)
        per_param = np.sqrt((pieces**2).sum(axis=0)).astype(np.float32).astype(np.float64)
        assert total == pytest.approx(math.sqrt(float((per_param**2).sum())), rel=1e-6), step
    for ws in sockets:
        ws.close()


# -- the command line ---------------------------------------------------------------------------


def gradwatch(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*server_command(), *args], capture_output=True, text=True, timeout=60, env=server_env(env), cwd=cwd
    )


def test_workers_on_sqlite_are_refused_with_what_to_do(tmp_path: Path) -> None:
    result = gradwatch("serve", "--workers", "2", "--db", f"sqlite:///{tmp_path / 'runs.db'}")
    assert result.returncode == 2
    assert "--workers 2 needs PostgreSQL (--db postgresql://...)" in result.stderr
    assert "SQLite takes one writer at a time" in result.stderr and "leave out --workers" in result.stderr
    assert not (tmp_path / "runs.db").exists()  # refused before anything was opened
    result = gradwatch("serve", "--workers", "3", env={"GRADWATCH_DB": str(tmp_path / "runs.db")}, cwd=tmp_path)
    assert result.returncode == 2 and "--workers 3 needs PostgreSQL" in result.stderr


@pytest.mark.parametrize(
    ("value", "message"),
    [("0", "must be at least 1"), ("-2", "must be at least 1"), ("two", "not a whole number: 'two'")],
)
def test_bad_worker_counts_are_usage_errors(value: str, message: str, tmp_path: Path) -> None:
    result = gradwatch("serve", f"--workers={value}", "--db", f"sqlite:///{tmp_path / 'runs.db'}")
    assert result.returncode == 2
    assert f"argument --workers: {message}" in result.stderr


def test_worker_count_from_the_environment_is_checked(tmp_path: Path) -> None:
    result = gradwatch("serve", env={"GRADWATCH_WORKERS": "0"}, cwd=tmp_path)
    assert result.returncode == 2 and "invalid setting: workers" in result.stderr


def test_serve_help_documents_workers() -> None:
    result = gradwatch("serve", "--help")
    assert result.returncode == 0
    assert "--workers N" in result.stdout and "PostgreSQL" in result.stdout

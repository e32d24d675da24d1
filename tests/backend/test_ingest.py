"""/ws/ingest against a real `gradwatch serve`: storage, acks, idempotency, and every refusal.

The module's server runs once on SQLite and once on PostgreSQL (`module_db_url`, tests/conftest.py).
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from gradwatch_server.cost import WINDOW_S, StepCost
from gradwatch_server.live import IDLE_LINGER_S, LIVE_LINGER_S
from support.server import ServerProcess, start_server
from support.wiremsg import Hook, close, f32, hello, step, steps, with_absent

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory, module_db_url: str) -> Iterator[ServerProcess]:
    server = start_server(tmp_path_factory.mktemp("ingest"), db_url=module_db_url, crash_grace_s=0.5)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def http(srv: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=srv.url, timeout=10) as client:
        yield client


def run_steps(http: httpx.Client, run_id: str) -> list[int]:
    return http.get(f"/api/runs/{run_id}/series", params={"key": "loss"}).json()["step"]


def good_run(ws_url: str, run_id: str, steps: int = 3) -> None:
    """A well-behaved client: hello, `steps` steps, close, every message acknowledged."""
    with Hook(ws_url) as hook:
        assert hook.call(hello(run_id)) == {
            "type": "welcome",
            "run_id": run_id,
            "last_seq": 0,
            "linger": IDLE_LINGER_S,
            "versions": [1, 2, 3],
        }
        for i in range(1, steps + 1):
            ack = hook.call(
                step(i, i, scalars={"loss": 1.0 / i}, arrays={"grad_norm": f32(i, i + 0.5)}, grad_status=[2, 2])
            )
            assert ack == {"type": "ack", "seq": i, "linger": IDLE_LINGER_S}
        assert hook.call(close(steps + 1)) == {"type": "ack", "seq": steps + 1}


def test_ingest_stores_exact_values(srv: ServerProcess, http: httpx.Client) -> None:
    grad = with_absent(f32(0.1, np.nan, 3.0), 2)
    grad.view("<u4")[1] = 0x7FC00001  # a measured NaN with a payload: data, not ABSENT
    with Hook(srv.ws_url) as hook:
        hook.call(hello("exact", params=("a.weight", "b.weight", "c.bias")))
        assert (
            hook.call(
                step(
                    1,
                    1,
                    scalars={"loss": "NaN", "lr/0": 1e-3, "neg": -0.0, "big": "Infinity"},
                    arrays={"grad_norm": grad, "param_norm": f32(-np.inf, 2.5, 1e-30)},
                    grad_status=[3, 3, 0],
                )
            )["seq"]
            == 1
        )
        hook.call(close(2))

    run = http.get("/api/runs/exact").json()
    assert run["status"] == "finished" and run["steps"] == 1 and run["last_step"] == 1
    assert run["param_count"] == 3 and run["param_numel"] == 15 and run["finished_at"] is not None
    assert http.get("/api/runs/exact/series", params={"key": "loss"}).json()["value"] == ["NaN"]
    assert http.get("/api/runs/exact/series", params={"key": "big"}).json()["value"] == ["Infinity"]
    neg = http.get("/api/runs/exact/series", params={"key": "neg"}).json()["value"][0]
    assert neg == 0.0 and np.copysign(1.0, neg) == -1.0
    body = http.get(
        "/api/runs/exact/params/series", params={"metric": "grad_norm", "param": ["a.weight", "b.weight", "c.bias"]}
    ).json()
    values = [s["value"][0] for s in body["series"]]
    assert values == [float(np.float32(0.1)), "NaN", None]
    norms = http.get(
        "/api/runs/exact/params/series", params={"metric": "param_norm", "param": ["a.weight", "b.weight", "c.bias"]}
    ).json()
    assert [s["value"][0] for s in norms["series"]] == ["-Infinity", 2.5, float(np.float32(1e-30))]


def test_resent_messages_are_acknowledged_and_stored_once(srv: ServerProcess, http: httpx.Client) -> None:
    with Hook(srv.ws_url) as hook:
        hook.call(hello("idem"))
        for seq in (1, 2):
            hook.call(step(seq, seq, scalars={"loss": float(seq)}))
        assert hook.call(step(2, 2, scalars={"loss": 99.0})) == {
            "type": "ack",
            "seq": 2,
            "linger": IDLE_LINGER_S,
        }  # same seq
        assert hook.call(step(3, 2, scalars={"loss": 98.0})) == {
            "type": "ack",
            "seq": 3,
            "linger": IDLE_LINGER_S,
        }  # same step
    with Hook(srv.ws_url) as hook:  # a reconnect learns what is committed
        assert hook.call(hello("idem"))["last_seq"] == 3
        assert hook.call(step(1, 1, scalars={"loss": 97.0})) == {"type": "ack", "seq": 1, "linger": IDLE_LINGER_S}
        hook.call(step(4, 3, scalars={"loss": 3.0}))
    series = http.get("/api/runs/idem/series", params={"key": "loss"}).json()
    assert series["step"] == [1, 2, 3] and series["value"] == [1.0, 2.0, 3.0]
    assert http.get("/api/runs/idem").json()["steps"] == 3


def test_a_browser_that_starts_watching_has_the_hook_told_the_live_pace_at_once(srv: ServerProcess) -> None:
    """A hook at the idle pace hears the live one as soon as a browser opens its run (`pace`),
    not with its next ack, IDLE_LINGER_S away; a second browser tells it nothing new."""
    with Hook(srv.ws_url) as hook:
        hook.call(hello("paced-live"))
        assert hook.call(step(1, 1, scalars={"loss": 1.0}))["linger"] == IDLE_LINGER_S
        with connect(f"{srv.ws_url}/ws/live?run=paced-live", origin=srv.url):
            assert json.loads(hook.ws.recv(timeout=5)) == {"type": "pace", "linger": LIVE_LINGER_S}
            with connect(f"{srv.ws_url}/ws/live?run=paced-live", origin=srv.url):
                assert hook.call(step(2, 2, scalars={"loss": 2.0})) == {
                    "type": "ack",
                    "seq": 2,
                    "linger": LIVE_LINGER_S,
                }
        with connect(f"{srv.ws_url}/ws/live?run=another", origin=srv.url):  # another run's browser
            assert hook.call(step(3, 3, scalars={"loss": 3.0}))["type"] == "ack"


def test_a_steps_message_is_stored_whole_once_and_streamed_live(srv: ServerProcess, http: httpx.Client) -> None:
    grads = np.array([[0.5, 1.5], [np.nan, 2.5], [0.25, np.inf]], dtype="<f4")
    batch = steps(
        2,
        [2, 3, 4],
        scalars={"loss": [0.2, 0.3, "NaN"]},
        arrays={"grad_norm": grads},
        grad_status=[[2, 2], [3, 2], [2, 3]],
    )
    with connect(f"{srv.ws_url}/ws/live?run=batch", origin=srv.url) as live, Hook(srv.ws_url) as hook:
        hook.call(hello("batch"))
        assert hook.call(step(1, 1, scalars={"loss": 0.1}))["seq"] == 1
        ack = hook.call(batch)
        assert ack == {"type": "ack", "seq": 2, "linger": LIVE_LINGER_S}  # a browser watches: the live pace
        assert hook.call(batch)["seq"] == 2  # resent: acknowledged, stored once
        overlap = steps(
            3, [4, 5], scalars={"loss": [9.0, 0.5]}, arrays={"grad_norm": grads[:2]}, grad_status=[[2, 2], [2, 2]]
        )
        assert hook.call(overlap)["seq"] == 3  # step 4 is stored already: only step 5 is new
        hook.call(close(4))
        events: list[dict] = []
        while len(events) < 5:
            event = json.loads(live.recv(timeout=10))
            events += [event] if event["type"] == "step" else []
    assert [e["step"] for e in events] == [1, 2, 3, 4, 5]
    assert events[2]["params"]["grad_norm"] == ["NaN", 2.5] and events[2]["grad_status"] == [3, 2]
    series = http.get("/api/runs/batch/series", params={"key": "loss"}).json()
    assert series["step"] == [1, 2, 3, 4, 5] and series["value"] == [0.1, 0.2, 0.3, "NaN", 0.5]
    norms = http.get("/api/runs/batch/params/series", params={"metric": "grad_norm", "param": ["fc.bias"]}).json()
    assert norms["step"] == [2, 3, 4, 5] and norms["series"][0]["value"] == [1.5, 2.5, "Infinity", 2.5]
    assert http.get("/api/runs/batch").json()["steps"] == 5


def test_a_bad_steps_message_is_refused_and_nothing_of_it_stored(srv: ServerProcess, http: httpx.Client) -> None:
    with Hook(srv.ws_url) as hook:
        hook.call(hello("badbatch"))
        hook.call(step(1, 1, scalars={"loss": 1.0}))
        hook.send(steps(2, [2, 3], scalars={"loss": [2.0]}))
        code, _, error = hook.refused()
    assert code == 1003 and "scalars.loss has 1 values for 2 steps" in error
    assert http.get("/api/runs/badbatch/series", params={"key": "loss"}).json()["step"] == [1]


def test_resume_with_other_params_is_refused(srv: ServerProcess, http: httpx.Client) -> None:
    good_run(srv.ws_url, "resume", steps=1)
    with Hook(srv.ws_url) as hook:
        hook.send(hello("resume", params=("fc.weight", "other.bias")))
        code, reason, error = hook.refused()
    assert code == 1003 and "different parameters" in error and "other.bias" in error
    assert len(reason.encode()) <= 123
    assert http.get("/api/runs/resume").json()["status"] == "finished"


def _huge_frame() -> str:
    return json.dumps(step(1, 1, scalars={"loss": 1.0})).replace('"loss"', '"pad": "' + "x" * (16 << 20) + '", "loss"')


BAD_FRAMES = {
    "malformed JSON": ('{"v": 1, "type": "step", ', 1003, "not valid JSON"),
    "wrong version": (json.dumps({**step(1, 1), "v": 3}), 1003, "unsupported protocol version 3"),
    "version true": (json.dumps({**step(1, 1), "v": True}), 1003, "unsupported protocol version"),
    "wrong types": (json.dumps({**step(1, 1), "seq": "1"}), 1003, "seq"),
    "bad base64 length": (json.dumps(step(1, 1, arrays={"grad_norm": f32(1, 2, 3)})), 1003, "expected 8"),
    "bad base64": (json.dumps({**step(1, 1), "params": {"grad_norm": "***"}}), 1003, "base64"),
    "bad status code": (json.dumps(step(1, 1, grad_status=[0, 9])), 1003, "grad_status"),
    "bare NaN": ('{"v": 1, "type": "step", "seq": 1, "step": 1, "time": 1.0, "scalars": {"loss": NaN}}', 1003, "NaN"),
    "bad scalar name": (json.dumps(step(1, 1, scalars={"no spaces": 1.0})), 1003, "scalars"),
    "unknown field": (json.dumps({**step(1, 1), "extra": 1}), 1003, "extra"),
    "second hello": (json.dumps(hello("bad")), 1003, "hello"),
    "step beyond 64 bits": (json.dumps(step(2, 2**63)), 1003, "step"),
    "oversized frame": (_huge_frame(), 1009, None),
}


@pytest.mark.parametrize("case", list(BAD_FRAMES))
def test_bad_frame_is_refused_and_nothing_is_stored(srv: ServerProcess, http: httpx.Client, case: str) -> None:
    frame, expected_code, expected_text = BAD_FRAMES[case]
    run_id = "bad-" + case.replace(" ", "-")
    with Hook(srv.ws_url) as hook:
        hook.call(hello(run_id))
        hook.call(step(1, 1, scalars={"loss": 1.0}))
        try:
            hook.send(frame)
        except ConnectionClosed:
            pass  # the server may close while a huge frame is still being sent
        code, reason, error = hook.refused()
    assert code == expected_code
    if expected_text is not None:
        assert error is not None and expected_text in error
        assert reason and len(reason.encode()) <= 123
    assert run_steps(http, run_id) == [1]  # only the good step before the bad frame
    good_run(srv.ws_url, f"after-{run_id}")  # the server keeps serving
    assert run_steps(http, f"after-{run_id}") == [1, 2, 3]


@pytest.mark.parametrize("where", ["name", "project", "param", "hook_version"])
def test_a_nul_in_the_hello_is_refused(srv: ServerProcess, http: httpx.Client, where: str) -> None:
    """PostgreSQL text cannot hold U+0000: refused on both databases, so runs move between them."""
    run_id = f"nul-{where}"
    if where == "param":
        message = hello(run_id, params=("a\x00.weight", "b.bias"))
    else:
        message = hello(run_id, **{where: "x\x00y"})
    with Hook(srv.ws_url) as hook:
        hook.send(message)
        code, _, error = hook.refused()
    assert code == 1003 and "NUL" in error
    assert http.get(f"/api/runs/{run_id}").status_code == 404


def test_invalid_step_stores_nothing_of_it(srv: ServerProcess, http: httpx.Client) -> None:
    with Hook(srv.ws_url) as hook:
        hook.call(hello("half"))
        hook.send(step(1, 1, scalars={"loss": 5.0}, arrays={"grad_norm": f32(1.0)}))  # 1 value for 2 params
        code, _, error = hook.refused()
    assert code == 1003 and "grad_norm" in error
    assert http.get("/api/runs/half").json()["steps"] == 0
    assert http.get("/api/runs/half/metrics").json() == {"scalars": [], "params": []}


def test_step_before_hello_is_refused(srv: ServerProcess) -> None:
    with Hook(srv.ws_url) as hook:
        hook.send(step(1, 1))
        code, reason, error = hook.refused()
    assert code == 1003 and "first message must be hello" in error and reason


def test_a_binary_frame_before_hello_is_refused(srv: ServerProcess) -> None:
    with Hook(srv.ws_url) as hook:
        hook.ws.send(b"\x00\x01")
        code, _, error = hook.refused()
    assert code == 1003 and "first message must be hello, in a JSON text frame" in error


def test_disconnect_without_close_marks_the_run_crashed(srv: ServerProcess, http: httpx.Client) -> None:
    with Hook(srv.ws_url) as hook:
        hook.call(hello("crashy"))
        hook.call(step(1, 1, scalars={"loss": 1.0}))
    disconnected = time.monotonic()
    status = http.get("/api/runs/crashy").json()["status"]
    # running through the crash grace (0.5 s: `srv`); a loaded machine may answer after it
    assert status == "running" or (status == "crashed" and time.monotonic() - disconnected >= 0.5), status
    deadline = time.monotonic() + 10
    while http.get("/api/runs/crashy").json()["status"] != "crashed":
        assert time.monotonic() < deadline, "the run was never marked crashed"
        time.sleep(0.1)
    with Hook(srv.ws_url) as hook:  # the hook comes back: the run is running again
        assert hook.call(hello("crashy"))["last_seq"] == 1
        assert http.get("/api/runs/crashy").json()["status"] == "running"
        hook.call(close(2))
    assert http.get("/api/runs/crashy").json()["status"] == "finished"


def test_reconnect_within_the_grace_period_keeps_the_run_running(srv: ServerProcess, http: httpx.Client) -> None:
    with Hook(srv.ws_url) as hook:
        hook.call(hello("flaky"))
    with Hook(srv.ws_url) as hook:
        hook.call(hello("flaky"))
        time.sleep(1.0)  # twice the grace period, connected all along
        assert http.get("/api/runs/flaky").json()["status"] == "running"
        hook.call(close(1))


def test_a_database_file_another_process_locks_stalls_no_one_and_loses_no_step(tmp_path: Path) -> None:
    """An unmeasured step is stored on the server's loop only where the store need not wait: with
    the SQLite file locked by another process, its batch waits on a thread, the server answers
    meanwhile, and the step is stored and acked once the lock is gone."""
    server = start_server(tmp_path)
    try:
        with Hook(server.ws_url) as hook, httpx.Client(base_url=server.url, timeout=10) as http:
            hook.call(hello("locked"))
            assert hook.call(step(1, 1, scalars={"loss": 1.0})) == {"type": "ack", "seq": 1, "linger": IDLE_LINGER_S}
            assert server.db_path is not None
            other = sqlite3.connect(server.db_path, isolation_level=None)
            try:
                other.execute("BEGIN IMMEDIATE")  # another process writes (`gradwatch import`, say)
                hook.send(step(2, 2, scalars={"loss": 0.5}))
                time.sleep(0.5)
                began = time.monotonic()
                assert http.get("/api/runs/locked").json()["steps"] == 1  # the loop answers
                assert time.monotonic() - began < 1.0
                with pytest.raises(TimeoutError):  # not acked while it cannot be stored
                    hook.recv(timeout=0.5)
                other.execute("ROLLBACK")
            finally:
                other.close()
            assert hook.recv() == {"type": "ack", "seq": 2, "linger": IDLE_LINGER_S}
            assert run_steps(http, "locked") == [1, 2]
    finally:
        server.stop()


def test_token_is_required_for_ingest(tmp_path: Path) -> None:
    server = start_server(tmp_path, token="s3cret")
    try:
        for token in (None, "wrong"):
            with Hook(server.ws_url, token=token) as hook:
                code, reason, error = hook.refused()  # refused before any message
            assert code == 1008 and "token" in error and reason
        good = Hook(server.ws_url, token="s3cret")
        with good:
            assert good.call(hello("guarded"))["type"] == "welcome"
        with httpx.Client(base_url=server.url) as http:  # reads stay open
            assert http.get("/api/runs/guarded").status_code == 200
    finally:
        server.stop()


def test_a_restarted_server_keeps_the_data_and_gives_running_runs_a_grace(tmp_path: Path, db_url: str) -> None:
    first = start_server(tmp_path, db_url=db_url, crash_grace_s=0.5)
    try:
        with Hook(first.ws_url) as hook:
            hook.call(hello("survivor"))
            hook.call(step(1, 1, scalars={"loss": 0.5}))
            first.stop()
    finally:
        first.stop()
    second = start_server(tmp_path, db_url=db_url, crash_grace_s=0.5)
    try:
        with httpx.Client(base_url=second.url) as http:
            assert run_steps(http, "survivor") == [1]
            deadline = time.monotonic() + 10
            while http.get("/api/runs/survivor").json()["status"] != "crashed":
                assert time.monotonic() < deadline
                time.sleep(0.1)
    finally:
        second.stop()


def test_pipelined_messages_are_batched_and_all_acknowledged(srv: ServerProcess, http: httpx.Client) -> None:
    with Hook(srv.ws_url) as hook:
        hook.call(hello("burst"))
        for i in range(1, 301):
            hook.send(step(i, i, scalars={"loss": float(i)}, arrays={"grad_norm": f32(i, -i)}))
        hook.send(json.dumps({**step(301, 301), "v": 3}))  # refused after the 300 before it
        acked = 0
        while acked < 300:
            frame = hook.recv()
            assert frame["type"] == "ack" and frame["seq"] > acked  # cumulative, increasing
            acked = frame["seq"]
        code, _, error = hook.refused()
    assert code == 1003 and "version 3" in error
    assert run_steps(http, "burst") == list(range(1, 301))
    grad = http.get("/api/runs/burst/params/series", params={"metric": "grad_norm", "param": "fc.bias"}).json()
    assert grad["series"][0]["value"] == [float(-i) for i in range(1, 301)]


def test_step_acks_tell_the_servers_cpu_per_stored_step(srv: ServerProcess) -> None:
    """Once the server has stored for WINDOW_S seconds, its step acks say what a stored step
    costs its process in CPU (cost.py): what a hook with every="auto" budgets."""
    with Hook(srv.ws_url) as hook:
        hook.call(hello("costly"))
        deadline, seq = time.monotonic() + WINDOW_S + 30, 0
        while not hook.costs and time.monotonic() < deadline:
            seq += 1
            assert hook.call(step(seq, seq, scalars={"loss": 1.0}, arrays={"grad_norm": f32(1, 2)}))["type"] == "ack"
            time.sleep(0.05)
    assert hook.costs and all(0.0 < c < 0.5 for c in hook.costs)


def test_step_cost_is_process_cpu_over_steps_stored_in_windows() -> None:
    now, cpu = [100.0], [10.0]
    cost = StepCost(clock=lambda: now[0], cpu=lambda: cpu[0])
    now[0], cpu[0] = 200.0, 30.0  # the server's start and idle time are no step's
    assert cost.stored(100) is None  # the first steps open the window
    now[0], cpu[0] = 200.0 + WINDOW_S - 0.1, 30.5
    assert cost.stored(100) is None
    now[0], cpu[0] = 200.0 + WINDOW_S, 31.0
    assert cost.stored(150) == pytest.approx(1.0 / 250)  # the steps stored since it opened
    now[0], cpu[0] = 200.0 + 3 * WINDOW_S, 31.5
    assert cost.stored(0) == pytest.approx(1.0 / 250)  # no step stored: the window stays open
    assert cost.stored(100) == pytest.approx(0.5 / 100)

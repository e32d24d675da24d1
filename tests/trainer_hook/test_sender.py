"""The sender's pacing: steps submitted within one `linger` go out as `steps` messages, in order,
and the server sets the pace (short while a browser watches the run)."""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect
from websockets.sync.server import ServerConnection, serve

import gradwatch
from gradwatch.sender import FINDING_LINGER_S, MAX_LINGER_S, MIN_LINGER_S, SPOOL_EVERY_S, Sender
from gradwatch.wire import UnsentStep, binary_as_json
from gradwatch_server.live import IDLE_LINGER_S, LIVE_LINGER_S
from support.sent import wait_serialized
from support.server import start_server
from support.wiremsg import rank_hello
from support.wiresteps import split

pytestmark = pytest.mark.unit  # a test that starts a server says so (@pytest.mark.server)


def train(w: gradwatch.Watcher, model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    for _ in range(steps):
        opt.zero_grad()
        loss = model(torch.randn(4, 8)).sum()
        loss.backward()
        w.log(loss=loss)  # rides with this step
        opt.step()


@pytest.mark.server
def test_fast_steps_go_out_batched_in_order_and_arrive_whole(tmp_path: Path) -> None:
    server = start_server(tmp_path)
    try:
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
        opt = torch.optim.Adam(model.parameters())
        w = gradwatch.watch(opt, model=model, server=server.url, every=3, warn=False)
        sent: list[dict] = []
        add = w._sender._add
        w._sender._add = lambda *made: _record(add(*made), sent)  # type: ignore[method-assign]
        train(w, model, opt, 60)
        w.close(timeout=10)
        steps = [m["step"] for msg in sent for m in split(msg)]
        assert steps == list(range(1, 61))
        batches = [msg for msg in sent if msg["type"] == "steps"]
        assert batches, "60 steps in well under a second: some must share a message"
        for msg in batches:  # one kind of step per message: measured ones carry grad_status
            measured = {(s - 1) % 3 == 0 for s in msg["step"]}
            assert len(measured) == 1 and ("grad_status" in msg) == measured.pop()
        stored = httpx.get(f"{server.url}/api/runs/{w.run_id}/series", params={"key": "loss"}).json()
        assert stored["step"] == list(range(1, 61))
        norms = httpx.get(
            f"{server.url}/api/runs/{w.run_id}/params/series", params={"metric": "grad_norm", "param": ["0.weight"]}
        ).json()
        assert norms["step"] == list(range(1, 61, 3)) and all(v > 0 for v in norms["series"][0]["value"])
        assert w._sender.linger == IDLE_LINGER_S  # nobody watched: the server asked for the idle pace
    finally:
        server.stop()


def _record(payload: str | bytes | None, sent: list[dict]) -> str | bytes | None:
    """Keep a message the sender made, as JSON (a binary step frame as the message it stands for)."""
    if payload is not None:
        sent.append(json.loads(payload) if isinstance(payload, str) else binary_as_json(payload))
    return payload


@pytest.mark.server
@pytest.mark.timed  # it times how soon the pace changes: a quiet machine
def test_the_server_sets_the_pace_while_a_browser_watches(tmp_path: Path) -> None:
    """The idle pace while nobody watches; the live one within a couple of seconds of a browser
    opening the run, with no step sent meanwhile (the server's `pace`, read at the sender's next
    look, a second away at most), not with the next ack, IDLE_LINGER_S away."""
    server = start_server(tmp_path)
    try:
        model = torch.nn.Linear(8, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        w = gradwatch.watch(opt, model=model, server=server.url, run="paced", warn=False)
        train(w, model, opt, 2)
        s = w._sender

        def settled() -> bool:  # both steps sent and acknowledged: the next send is a linger away
            return not w.pending and s.linger == IDLE_LINGER_S and s._sent_upto == s._seq

        deadline = time.monotonic() + 10
        while not settled() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert settled()
        with connect(f"{server.ws_url}/ws/live?run={w.run_id}", origin=server.url):
            opened = time.monotonic()
            while w._sender.linger != LIVE_LINGER_S and time.monotonic() < opened + IDLE_LINGER_S:
                time.sleep(0.02)
            assert w._sender.linger == LIVE_LINGER_S
            assert time.monotonic() - opened < 2.5
        w.close(timeout=10)
    finally:
        server.stop()


def test_a_pace_out_of_bounds_or_malformed_is_clamped_or_ignored() -> None:
    sender = Sender("ws://127.0.0.1:9/ws/ingest", {"type": "hello"}, linger=0.25)
    try:
        for reply, linger in (
            ({"linger": 1e9}, MAX_LINGER_S),
            ({"linger": -1}, MIN_LINGER_S),
            ({"linger": "fast"}, MIN_LINGER_S),
            ({"linger": float("nan")}, MIN_LINGER_S),
            ({"linger": True}, MIN_LINGER_S),
            ({}, MIN_LINGER_S),
            ({"linger": 0.5}, 0.5),
        ):
            sender._pace(reply)
            assert sender.linger == linger, reply
    finally:
        sender.close(timeout=0.1)


def test_the_servers_cost_is_kept_only_when_sane() -> None:
    """An ack's `cpu_per_step` (server CPU per stored step, for every="auto") comes from the
    network: anything but a number in [0, 10) s leaves the last good one."""
    sender = Sender("ws://127.0.0.1:9/ws/ingest", {"type": "hello"}, linger=0.25)
    try:
        assert sender.server_cpu_per_step == 0.0
        for reply, kept in (
            ({"cpu_per_step": 0.0002}, 0.0002),
            ({"cpu_per_step": -1}, 0.0002),
            ({"cpu_per_step": float("nan")}, 0.0002),
            ({"cpu_per_step": float("inf")}, 0.0002),
            ({"cpu_per_step": "1e-4"}, 0.0002),
            ({"cpu_per_step": True}, 0.0002),
            ({}, 0.0002),
            ({"cpu_per_step": 1e9}, 0.0002),
            ({"cpu_per_step": 0}, 0.0),
        ):
            sender._note_cost(reply)
            assert sender.server_cpu_per_step == kept, reply
    finally:
        sender.close(timeout=0.1)


@pytest.mark.server
@pytest.mark.timed  # it asserts what happens within SPOOL_EVERY_S and IDLE_LINGER_S: a quiet machine
def test_a_step_is_spooled_within_a_second_whatever_the_servers_pace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server asks a run nobody watches for one send every IDLE_LINGER_S, but a training
    process killed outright must lose at most SPOOL_EVERY_S of steps: the hook serializes and
    spools that often, and sends at the server's pace."""
    assert IDLE_LINGER_S > 1 + 2 * SPOOL_EVERY_S
    monkeypatch.setenv("GRADWATCH_SPOOL", str(tmp_path / "spool"))
    server = start_server(tmp_path)
    try:
        model = torch.nn.Linear(8, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        w = gradwatch.watch(opt, model=model, server=server.url, warn=False)
        train(w, model, opt, 2)
        deadline = time.monotonic() + 10

        def settled() -> bool:  # the acks can arrive before the sender thread has noted what it sent
            s = w._sender
            return not w.pending and s.linger == IDLE_LINGER_S and s._sent_upto == s._seq

        while not settled() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert settled()  # steps 1-2 sent: the next send is a linger away
        sent = w._sender._sent_upto
        train(w, model, opt, 3)
        time.sleep(SPOOL_EVERY_S + 0.3)
        spooled = [m["step"] for text in list(w._sender.spool.records())[1:] for m in split(json.loads(text))]
        assert spooled == [1, 2, 3, 4, 5]
        assert w._sender._sent_upto == sent and w.pending  # held for the server's pace meanwhile
        w.close(timeout=10)
        stored = httpx.get(f"{server.url}/api/runs/{w.run_id}/series", params={"key": "loss"}).json()
        assert stored["step"] == [1, 2, 3, 4, 5]
    finally:
        server.stop()


def test_a_sender_with_no_server_waits_rather_than_spins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Serialized messages wait for a connection: with none, the thread sleeps between its
    spool writes and connection attempts, rather than waking every millisecond to find nothing
    it may send."""
    monkeypatch.setenv("GRADWATCH_SPOOL", str(tmp_path / "spool"))
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w = gradwatch.watch(opt, model=model, server="http://127.0.0.1:9", warn=False)
    try:
        train(w, model, opt, 3)
        assert wait_serialized(w._sender, 5)
        thread = w._sender._thread
        clock = time.pthread_getcpuclockid(thread.ident)
        cpu = time.clock_gettime(clock)
        time.sleep(2.0)
        assert time.clock_gettime(clock) - cpu < 0.03  # spinning: 60-100 ms; waiting: a few ms
    finally:
        w.close(timeout=0.1)


def test_a_pump_that_always_fails_logs_once_and_ends_at_close(caplog: pytest.LogCaptureFixture) -> None:
    """A bug that makes every pump raise: its traceback is logged once, not ten times a second for
    the rest of the process, and the thread ends once close()'s deadline has passed."""
    sender = Sender("ws://127.0.0.1:9/ws/ingest", {"type": "hello"}, linger=0.05)
    pumps = []

    def failing() -> None:
        pumps.append(time.monotonic())
        raise RuntimeError("injected sender bug")

    sender._pump = failing  # type: ignore[method-assign]
    with caplog.at_level("DEBUG", logger="gradwatch"):
        while len(pumps) < 3:
            time.sleep(0.05)
        assert sender.close(timeout=0.2)  # the thread has ended
    assert not sender._thread.is_alive()
    tracebacks = [r for r in caplog.records if r.levelname == "ERROR" and "sender error" in r.getMessage()]
    assert len(tracebacks) == 1 and tracebacks[0].exc_info is not None
    assert sum("sender error again" in r.getMessage() for r in caplog.records) == len(pumps) - 1


@pytest.mark.server
def test_a_replica_sends_its_digest_and_answers_the_servers_ask_from_its_ring(tmp_path: Path) -> None:
    """A DDP replica (rank 1, nothing counted) on protocol v2 sends a measured step's grad_digest
    (BLAKE2b-16 of its grad_norm bytes, 0xFF, its grad_status) and no arrays; the real server asks
    for the step whose digest differs from rank 0's, and the replica sends its arrays again."""
    server = start_server(tmp_path)
    status = np.array([2, 2], dtype=np.uint8)
    same, own = np.array([1.0, 0.5], dtype="<f4"), np.array([1.0, 0.75], dtype="<f4")
    hellos = [rank_hello("j-ring", 0, 2), rank_hello("j-ring", 1, 2, counted=[False, False])]
    senders = [Sender(f"{server.ws_url}/ws/ingest", h, linger=0.05) for h in hellos]
    sent: list[dict] = []
    add = senders[1]._add
    senders[1]._add = lambda *made: _record(add(*made), sent)  # type: ignore[method-assign]
    try:
        deadline = time.monotonic() + 10
        while not senders[1]._v2 and time.monotonic() < deadline:
            time.sleep(0.01)
        for rank, sender in enumerate(senders):
            for s, grad in ((1, same), (2, same if rank == 0 else own)):
                record = UnsentStep(s, 1.7e9 + s, {"loss": 1.0}, {"grad_norm": grad}, status)
                sender.submit_step(lambda r=record: r)
        deadline = time.monotonic() + 10
        while not any(m.get("scalars", {}).get("flight/resent") for m in sent) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert all(s.close(timeout=10) for s in senders)
        lines = httpx.get(f"{server.url}/api/runs/j-ring/export", params={"format": "json"}).text
    finally:
        server.stop()
    digests = {m["step"]: m for msg in sent for m in split(msg) if "grad_digest" in m}
    for s, grad in ((1, same), (2, own)):
        oracle = hashlib.blake2b(grad.tobytes() + b"\xff" + status.tobytes(), digest_size=16).hexdigest()
        assert (digests[s]["v"], digests[s]["grad_digest"], digests[s]["params"]) == (2, oracle, {})
        assert "grad_status" not in digests[s]
    again = [m for m in sent if m.get("scalars", {}).get("flight/resent")]
    assert [m["step"] for m in again] == [2]  # only the step that differs from rank 0's
    assert np.frombuffer(base64.b64decode(again[0]["params"]["grad_norm"]), "<f4").tolist() == own.tolist()
    job = {d["step"]: d for d in map(json.loads, lines.splitlines()) if d["type"] == "step" and d.get("rank") is None}
    assert [job[s]["params"]["desync_ranks"] for s in (1, 2)] == [[0.0, 0.0], [0.0, 1.0]]


def test_a_replica_that_owns_optimizer_state_keeps_its_state_norms_beside_its_digest() -> None:
    """A replica's digested step leaves out the norms the server reads from rank 0 only; its
    optimizer-state norms go too unless its optimizer shards its state (ZeroRedundancyOptimizer:
    each parameter's state is on its owner rank only, the server counts it from there)."""
    grad, status = np.array([1.0, 0.5], dtype="<f4"), np.array([2, 2], dtype=np.uint8)
    owned = np.array([0.25, np.frombuffer(np.uint32(0x7FDEAD00).tobytes(), "<f4")[0]], dtype="<f4")
    norms = {"grad_norm": grad, "param_norm": grad * 3, "update_norm": grad / 9, "exp_avg_norm": owned}
    record = UnsentStep(4, 1.7e9, {"loss": 1.0}, {**norms, "momentum_norm": owned}, status)
    oracle = hashlib.blake2b(grad.tobytes() + b"\xff" + status.tobytes(), digest_size=16).hexdigest()
    for state, kept in ((False, set()), (True, {"exp_avg_norm", "momentum_norm"})):
        sent = gradwatch.wire.digested(record, state)
        assert (sent.digest, sent.grad_status, set(sent.metrics)) == (oracle, None, kept)
        assert all(sent.metrics[m] is record.metrics[m] for m in kept)


@pytest.mark.server
def test_a_replica_that_closes_before_rank_0_sends_answers_the_ask_at_its_close(tmp_path: Path) -> None:
    """Rank 1's run ends before rank 0's steps reach the server: its close is answered by an ask
    for the steps no comparison has settled, which its ring answers before the close ends, so
    the job's rank_desync is exact (step 2 differs) though rank 1 is gone when rank 0's come."""
    server = start_server(tmp_path)
    status = np.array([2, 2], dtype=np.uint8)
    same, own = np.array([1.0, 0.5], dtype="<f4"), np.array([1.0, 0.75], dtype="<f4")
    try:
        senders = [
            Sender(f"{server.ws_url}/ws/ingest", rank_hello("j-closes", r, 2, counted=[r == 0] * 2), linger=0.05)
            for r in (0, 1)
        ]
        for s, grad in ((1, same), (2, own)):
            record = UnsentStep(s, 1.7e9 + s, {"loss": 1.0}, {"grad_norm": grad}, status)
            senders[1].submit_step(lambda r=record: r)
        assert senders[1].close(timeout=10) and senders[1].pending == 0
        for s in (1, 2):
            record = UnsentStep(s, 1.7e9 + s, {"loss": 1.0}, {"grad_norm": same}, status)
            senders[0].submit_step(lambda r=record: r)
        assert senders[0].close(timeout=10)
        lines = httpx.get(f"{server.url}/api/runs/j-closes/export", params={"format": "json"}).text
        closed = [httpx.get(f"{server.url}/api/runs/{run}").json()["status"] for run in ("j-closes.r1", "j-closes")]
        assert closed == ["finished", "finished"]  # the close, after its answers, still closes the rank
    finally:
        server.stop()
    job = {d["step"]: d for d in map(json.loads, lines.splitlines()) if d["type"] == "step" and d.get("rank") is None}
    assert [job[s]["params"]["desync_ranks"] for s in (1, 2)] == [[0.0, 0.0], [0.0, 1.0]]


@pytest.fixture
def paced_server(request: pytest.FixtureRequest) -> Iterator[tuple[str, list[tuple[float, dict]]]]:
    """A websocket server that asks for a pace (`linger`, in its welcome and acks: 2 s, or the
    test's indirect parameter: `linger`, or `(linger, seconds before the welcome)`), acks each
    message and notes when it came. Yields its URL and (arrival, message) of each message."""
    received: list[tuple[float, dict]] = []
    param = getattr(request, "param", 2.0)
    linger, welcome_after = param if isinstance(param, tuple) else (param, 0.0)

    def handler(ws: ServerConnection) -> None:
        ws.recv()  # the hello
        time.sleep(welcome_after)  # a slow admission: the hook queues its steps meanwhile
        ws.send(json.dumps({"type": "welcome", "run_id": "paced", "last_seq": 0, "linger": linger}))
        with contextlib.suppress(ConnectionClosed):
            while True:
                message = json.loads(ws.recv())
                received.append((time.monotonic(), message))
                ws.send(json.dumps({"type": "ack", "seq": message["seq"], "linger": linger}))

    with serve(handler, "127.0.0.1", 0) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        yield f"ws://127.0.0.1:{server.socket.getsockname()[1]}", received
        server.shutdown()


@pytest.mark.timed  # it counts what happens within a few seconds at a 2 s pace: a quiet machine
def test_a_send_and_its_acks_ride_on_the_wakes_of_the_spool_writes(
    paced_server: tuple[str, list[tuple[float, dict]]],
) -> None:
    """Steps streamed at 50 a second, at a 2 s pace: the thread wakes once per spool write
    (SPOOL_EVERY_S): each send goes with one of them, and the acks are read at the next one
    rather than waking the thread (each wake costs it more than its work); every step arrives,
    in order, and the sends are about `linger` apart."""
    url, received = paced_server
    sender = Sender(url, {"v": 1, "type": "hello", "run": {"id": "paced"}, "params": [], "groups": []})
    drains = pumps = 0
    drain, pump = sender._drain, sender._pump

    def counted_drain() -> None:
        nonlocal drains
        drains += 1
        drain()

    def counted_pump() -> None:
        nonlocal pumps
        pumps += 1
        pump()

    try:
        deadline = time.monotonic() + 10
        while (sender._ws is None or sender.linger != 2.0) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sender.linger == 2.0
        sender._drain, sender._pump = counted_drain, counted_pump  # type: ignore[method-assign]
        for s in range(1, 226):  # 4.5 s
            sender.submit_step(functools.partial(UnsentStep, s, 1.7e9 + s, {"loss": float(s)}, {}, None))
            time.sleep(0.02)
        counted = (drains, pumps)
        assert sender.close(timeout=10)
    finally:
        sender.close(timeout=1)
    assert 4 <= counted[0] <= 6  # a spool write a second
    assert counted[1] <= counted[0] + 1  # no wake of its own for a send or an ack
    steps = [m["step"] for _, message in received for m in split(message) if message["type"] != "close"]
    assert steps == list(range(1, 226))
    sends = [t for i, (t, _) in enumerate(received) if i == 0 or t - received[i - 1][0] > 0.5]
    gaps = [b - a for a, b in zip(sends, sends[1:-1])]  # the last: close() sends at once
    assert gaps and all(1.4 < g < 2.6 for g in gaps), gaps


@pytest.mark.timed  # it times each step's way to the server at a quarter-second pace: a quiet machine
@pytest.mark.parametrize("paced_server", [FINDING_LINGER_S], indirect=True)
def test_a_step_submitted_to_an_idle_sender_goes_out_at_the_pace(
    paced_server: tuple[str, list[tuple[float, dict]]],
) -> None:
    """At a short pace (a training that acts on findings, a browser watching), a step submitted
    while nothing is queued waits for the next drain, `linger` away at most, not for the spool's
    second (SPOOL_EVERY_S): its finding can then reach `on_finding` within a second of the step.
    Steps come 0.37 s apart, so most find a sender that drained nothing at its last wake."""
    url, received = paced_server
    hello = {"v": 1, "type": "hello", "run": {"id": "paced"}, "params": [], "groups": []}
    sender = Sender(url, hello, linger=FINDING_LINGER_S, max_linger=FINDING_LINGER_S)
    submitted: dict[int, float] = {}
    try:
        deadline = time.monotonic() + 10
        while sender._ws is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sender._ws is not None
        for s in range(1, 13):
            time.sleep(0.37)
            submitted[s] = time.monotonic()
            sender.submit_step(functools.partial(UnsentStep, s, 1.7e9 + s, {"loss": float(s)}, {}, None))
        time.sleep(2 * FINDING_LINGER_S)  # the last step goes at the pace too, not with close()
        assert sender.close(timeout=10)
    finally:
        sender.close(timeout=1)
    arrived = {m["step"]: t for t, message in received if message["type"] != "close" for m in split(message)}
    assert sorted(arrived) == sorted(submitted)
    delays = [round(arrived[s] - submitted[s], 3) for s in submitted]
    assert max(delays) < FINDING_LINGER_S + 0.25, delays


@pytest.mark.timed  # it times when a step goes out after the connection's first send
@pytest.mark.parametrize("paced_server", [(4.0, 1.5)], indirect=True)
def test_the_backlog_sent_on_connecting_starts_the_pace(paced_server: tuple[str, list[tuple[float, dict]]]) -> None:
    """Steps queued before the server's welcome go out as the hook connects; that send starts
    the pace like any other: a step submitted right after waits about `linger` for the next
    send, not for the thread's next wake (a second at most)."""
    url, received = paced_server
    linger = 4.0
    sender = Sender(url, {"v": 1, "type": "hello", "run": {"id": "paced"}, "params": [], "groups": []})
    try:
        for s in (1, 2, 3):  # before the welcome, 1.5 s away
            sender.submit_step(functools.partial(UnsentStep, s, 1.7e9 + s, {"loss": float(s)}, {}, None))
        deadline = time.monotonic() + 20
        while len(received) < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [m["step"] for _, message in received for m in split(message)] == [1, 2, 3]
        backlog_sent = received[0][0]
        sender.submit_step(functools.partial(UnsentStep, 4, 1.7e9 + 4, {"loss": 4.0}, {}, None))
        while len(received) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sender.close(timeout=10)
    finally:
        sender.close(timeout=1)
    assert [m["step"] for m in split(received[1][1])] == [4]
    # at the earliest with the wake half a drain period (0.5 s) before the pace is up: 3.5 s
    assert received[1][0] - backlog_sent > linger - 1.0, received[1][0] - backlog_sent

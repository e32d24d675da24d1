"""The sender's binary step frames (protocol v3): sent to a server whose welcome lists version 3,
JSON to one that does not, and a frame made for the one resent as JSON to the other; the values a
real server stores are the arrays submitted."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.server import ServerConnection, serve

from gradwatch.replay import replay
from gradwatch.sender import Sender
from gradwatch.spool import SpoolWriter, read_payloads, read_records
from gradwatch.wire import UnsentStep
from gradwatch_server.protocol import Step, parse_binary, parse_message
from support.server import start_server
from support.wiremsg import hello

pytestmark = pytest.mark.unit

GRAD = np.array([0.25, 3.5], dtype="<f4")
STATUS = np.array([2, 3], dtype=np.uint8)


def wait_until(what: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not what() and time.monotonic() < deadline:
        time.sleep(0.01)
    return what()


@pytest.fixture
def two_servers() -> Iterator[tuple[str, list[list[str | bytes]]]]:
    """A websocket server whose first connection welcomes with `versions` [1, 2, 3] and drops
    after the first frame without an ack; later ones welcome as a server older than v3 (no
    `versions`) and ack every frame. Yields its URL and the frames of each connection."""
    received: list[list[str | bytes]] = []

    def handler(ws: ServerConnection) -> None:
        first = not received
        frames: list[str | bytes] = []
        received.append(frames)
        ws.recv()  # the hello
        welcome: dict[str, object] = {"type": "welcome", "run_id": "bin", "last_seq": 0}
        if first:
            welcome["versions"] = [1, 2, 3]
        ws.send(json.dumps(welcome))
        with contextlib.suppress(Exception):
            while True:
                frame = ws.recv()
                frames.append(frame)
                if first:
                    return
                message = json.loads(frame)
                ws.send(json.dumps({"type": "ack", "seq": message["seq"]}))
                if message["type"] == "close":
                    return

    with serve(handler, "127.0.0.1", 0) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        yield f"ws://127.0.0.1:{server.socket.getsockname()[1]}", received
        server.shutdown()


def test_a_step_goes_binary_to_a_server_that_reads_it_and_as_json_after_reconnecting_to_one_that_does_not(
    two_servers: tuple[str, list[list[str | bytes]]], tmp_path: Path
) -> None:
    """The spool keeps the step as the binary frame, which reads back as the JSON sent to the second."""
    url, received = two_servers
    spool = SpoolWriter(tmp_path, "bin", json.dumps(hello("bin")))
    sender = Sender(url, hello("bin"), linger=0.05, spool=spool)
    try:
        assert wait_until(lambda: sender._binary)
        sender.submit_step(lambda: UnsentStep(1, 1.7e9, {"loss": 0.5}, {"grad_norm": GRAD}, STATUS))
        assert wait_until(lambda: len(received) >= 2 and len(received[1]) >= 1)
        spooled = list(read_records(spool.path)[0])
        assert sender.close(timeout=10)
    finally:
        sender.close(timeout=1)
    assert len(spooled) == 2  # the hello, the step
    first, second = received[0][0], received[1][0]
    assert parse_message(spooled[1], 2) == parse_message(second, 2)
    assert isinstance(first, bytes) and isinstance(second, str)
    assert not sender._binary  # the second server does not read binary frames
    for message in (parse_binary(first, 2), parse_message(second, 2)):
        assert isinstance(message, Step) and (message.seq, message.step, message.scalars) == (1, 1, {"loss": 0.5})
        assert np.frombuffer(message.params["grad_norm"], "<f4").tolist() == GRAD.tolist()
        assert np.frombuffer(message.grad_status or b"", "u1").tolist() == STATUS.tolist()
    assert json.loads(received[1][-1])["type"] == "close"


@pytest.mark.server
def test_the_steps_a_sender_sends_binary_are_stored_as_submitted(tmp_path: Path) -> None:
    """One step and a batch of steps (a `steps` frame), against a real server: the stored norms are
    the arrays submitted, bit for bit."""
    server = start_server(tmp_path)
    rng = np.random.default_rng(3)
    grads = [rng.random(2).astype("<f4") for _ in range(4)]
    sender = Sender(f"{server.ws_url}/ws/ingest", hello("bin-sent", params=("a.weight", "b.bias")), linger=0.05)
    kinds: list[type] = []
    add = sender._add
    sender._add = lambda *made: kinds.append(type(payload := add(*made))) or payload  # type: ignore[method-assign]
    try:
        assert wait_until(lambda: sender._binary)
        sender.submit_step(lambda: UnsentStep(1, 1.7e9, {"loss": 1.0}, {"grad_norm": grads[0]}, STATUS))
        assert wait_until(lambda: sender.pending == 0)
        for s in (2, 3, 4):  # submitted together: one `steps` frame
            sender.submit_step(lambda s=s: UnsentStep(s, 1.7e9 + s, {"loss": 1.0}, {"grad_norm": grads[s - 1]}, STATUS))
        assert sender.close(timeout=10)
        body = httpx.get(
            f"{server.url}/api/runs/bin-sent/params/series",
            params={"metric": "grad_norm", "param": ["a.weight", "b.bias"]},
        ).json()
    finally:
        server.stop()
    assert body["step"] == [1, 2, 3, 4]
    stored = np.array([s["value"] for s in body["series"]], dtype="<f4").T
    assert stored.tobytes() == np.stack(grads).tobytes()
    assert kinds[:2] == [bytes, bytes] and kinds[-1] is str  # the steps binary, the close JSON


def test_a_spooled_binary_frame_replays_binary_to_a_server_that_reads_it_and_as_json_to_one_that_does_not(
    two_servers: tuple[str, list[list[str | bytes]]], tmp_path: Path
) -> None:
    """The spool keeps a step as the binary frame the sender made; replay sends it as such to a
    server whose welcome lists version 3 (the first connection, which drops without an ack: the
    file stays) and as the JSON it stands for to one older (the second, which acks it)."""
    url, received = two_servers
    spool = SpoolWriter(tmp_path, "bin", json.dumps(hello("bin")))
    sender = Sender("ws://127.0.0.1:9", hello("bin"), linger=0.05, spool=spool)  # nothing listens: it spools
    try:
        sender.submit_step(lambda: UnsentStep(1, 1.7e9, {"loss": 0.5}, {"grad_norm": GRAD}, STATUS))
        assert wait_until(lambda: sender._serialized == 1)
    finally:
        sender.close(timeout=0.2)
    payloads = list(read_payloads(spool.path)[0])
    assert len(payloads) == 3 and isinstance(payloads[1], bytes)  # the hello, the step, the close
    with pytest.raises((OSError, ConnectionClosed)):
        replay(spool.path, url, timeout=5)
    assert spool.path.exists()
    delivery = replay(spool.path, url, timeout=5)
    assert delivery.sent == 2 and not spool.path.exists()
    first, second = received[0][0], received[1][0]
    assert first == payloads[1] and isinstance(second, str)
    a, b = parse_binary(first, 2), parse_message(second, 2)
    assert a.model_dump(exclude={"v"}) == b.model_dump(exclude={"v"})
    assert isinstance(b, Step) and np.frombuffer(b.params["grad_norm"], "<f4").tolist() == GRAD.tolist()

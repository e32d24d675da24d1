"""The hook's handshake with a server that takes its time to welcome (a crowd of ranks at a job's
start): the hook waits for the welcome, spooling meanwhile (`waiting`), rather than retrying into a
storm, and stops waiting as soon as `waiting` says so (close() bounds its wait). A rank's hellos
(protocol v2): its job's list named by digest, sent in full when the server asks, and v1 for a
server older than v2."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from websockets.sync.server import ServerConnection, serve

from gradwatch import wire
from gradwatch.connection import OPEN_TIMEOUT_S, WAIT_SLICE_S, WELCOME_TIMEOUT_S, Refused, handshake, negotiate
from support.server import start_server
from support.wiremsg import rank_hello

pytestmark = pytest.mark.unit

SLOW_S = 3 * WAIT_SLICE_S


@pytest.fixture
def slow_server() -> Iterator[str]:
    """A websocket server that welcomes each hello after SLOW_S."""

    def handler(ws: ServerConnection) -> None:
        ws.recv()
        time.sleep(SLOW_S)
        with contextlib.suppress(Exception):
            ws.send('{"type": "welcome", "run_id": "r", "last_seq": 7}')
            ws.recv()

    with serve(handler, "127.0.0.1", 0) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        yield f"ws://127.0.0.1:{server.socket.getsockname()[1]}"
        server.shutdown()


def test_a_slow_welcome_is_waited_for_with_the_caller_called_meanwhile(slow_server: str) -> None:
    assert WELCOME_TIMEOUT_S >= 10 * SLOW_S  # the default waits far longer than this server takes
    calls: list[float] = []
    started = time.monotonic()
    with contextlib.ExitStack() as scope:
        _, welcome = handshake(slow_server, '{"type": "hello"}', None, scope, waiting=lambda: not calls.append(1))
    assert welcome == {"type": "welcome", "run_id": "r", "last_seq": 7}
    assert time.monotonic() - started >= SLOW_S
    assert len(calls) >= 2  # once per WAIT_SLICE_S while the welcome was awaited


def test_the_wait_for_a_welcome_stops_when_the_caller_says_so(slow_server: str) -> None:
    started = time.monotonic()
    with contextlib.ExitStack() as scope, pytest.raises(TimeoutError):
        handshake(slow_server, '{"type": "hello"}', None, scope, waiting=lambda: False)
    assert time.monotonic() - started < SLOW_S  # gave up after the first slice, not at the welcome


@pytest.fixture
def slow_open_server() -> Iterator[str]:
    """A websocket server that answers the opening handshake after SLOW_S (a crowd queued)."""

    def delay(ws: ServerConnection, request: object) -> None:
        time.sleep(SLOW_S)

    def handler(ws: ServerConnection) -> None:
        with contextlib.suppress(Exception):
            ws.recv()
            ws.send('{"type": "welcome", "run_id": "r", "last_seq": 0}')
            ws.recv()

    with serve(handler, "127.0.0.1", 0, process_request=delay) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        yield f"ws://127.0.0.1:{server.socket.getsockname()[1]}"
        server.shutdown()


def test_a_slow_open_is_waited_for_with_the_caller_called_meanwhile(slow_open_server: str) -> None:
    assert OPEN_TIMEOUT_S >= 10 * SLOW_S / 1.5  # far longer than this server takes
    calls: list[int] = []
    with contextlib.ExitStack() as scope:
        _, welcome = handshake(slow_open_server, '{"type": "hello"}', None, scope, waiting=lambda: not calls.append(1))
    assert welcome["type"] == "welcome" and len(calls) >= 2
    started = time.monotonic()
    with contextlib.ExitStack() as scope, pytest.raises(TimeoutError):
        handshake(slow_open_server, '{"type": "hello"}', None, scope, waiting=lambda: False)
    assert time.monotonic() - started < SLOW_S  # gave up after the first slice


def _rank_hellos(job: str, rank: int, params: tuple[str, ...] = ("fc.weight", "fc.bias")) -> list[str]:
    return [wire.dumps(h) for h in wire.rank_hellos(rank_hello(job, rank, 2, params))]


@pytest.mark.server
def test_ranks_name_the_jobs_list_by_digest_and_send_it_when_the_server_asks(tmp_path: Path) -> None:
    """Against a real server: rank 0 sends the list (v2), rank 1 its digest; a rank whose digest
    is not its job's is asked for its list (4002), sends it, and hears how it differs."""
    server = start_server(tmp_path)
    try:
        with contextlib.ExitStack() as scope:
            _, welcome, taken = negotiate(f"{server.ws_url}/ws/ingest", _rank_hellos("j", 0), None, scope)
            assert (welcome["run_id"], taken) == ("j.r0", 0)
            _, welcome, taken = negotiate(f"{server.ws_url}/ws/ingest", _rank_hellos("j", 1), None, scope)
            assert (welcome["run_id"], taken) == ("j.r1", 0)  # by digest
            with pytest.raises(Refused, match="'fc.bias' is missing"):  # asked for its list, then told
                negotiate(f"{server.ws_url}/ws/ingest", _rank_hellos("j", 1, ("fc.weight",)), None, scope)
    finally:
        server.stop()


@pytest.fixture
def v1_server() -> Iterator[str]:
    """A server of protocol v1 only, as released before v2: it refuses any other version with the
    v1 server's error frame and close (1003), and welcomes a v1 hello."""

    def handler(ws: ServerConnection) -> None:
        with contextlib.suppress(Exception):
            version = json.loads(ws.recv())["v"]
            if version != 1:
                message = f"unsupported protocol version {version!r}: this server speaks version 1"
                ws.send(json.dumps({"type": "error", "message": message}))
                ws.close(1003, message)
                return
            ws.send('{"type": "welcome", "run_id": "j.r1", "last_seq": 0}')
            ws.recv()

    with serve(handler, "127.0.0.1", 0) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        yield f"ws://127.0.0.1:{server.socket.getsockname()[1]}"
        server.shutdown()


def test_a_server_older_than_v2_gets_the_v1_hello(v1_server: str) -> None:
    hellos = _rank_hellos("j", 1)
    with contextlib.ExitStack() as scope:
        _, welcome, taken = negotiate(v1_server, hellos, None, scope)
    assert welcome["type"] == "welcome" and taken == len(hellos) - 1 and json.loads(hellos[taken])["v"] == 1

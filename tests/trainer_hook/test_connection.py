"""The hook's handshake with a server that takes its time to welcome (a crowd of ranks at a job's
start): the hook waits for the welcome, spooling meanwhile (`waiting`), rather than retrying into a
storm, and stops waiting as soon as `waiting` says so (close() bounds its wait)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import pytest
from websockets.sync.server import ServerConnection, serve

from gradwatch.connection import WAIT_SLICE_S, WELCOME_TIMEOUT_S, handshake

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

"""The hook's one protocol client: open an ingest connection, say hello, read the server's replies.

The live sender (sender.py) and spool replay (replay.py) both talk to the server through these
functions, so both speak the handshake the same way and read a refusal the same way. Needs
`websockets` only (no torch): `python -m gradwatch sync` runs on machines without it.
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Optional

from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.sync.client import ClientConnection, connect

#: Close codes of the ingest endpoint (docs/protocol.md): a message it refuses as invalid, and a
#: connection it refuses (a missing or wrong token).
CLOSE_INVALID = 1003
CLOSE_POLICY = 1008
#: A frame larger than the server takes.
CLOSE_TOO_BIG = 1009
#: A v2 hello named its job's parameter list by a digest the server does not know: send it in full.
CLOSE_NEED_PARAMS = 4002
#: The server takes frames of up to 16 MiB.
MAX_FRAME_BYTES = 16 << 20
#: How long a connection may take to open, and its welcome to come once the hello is sent. Both are
#: long: a server that has the connection or the hello queued (a crowd of ranks at a job's start)
#: answers it in turn, and a retry would only make it take it twice (each abandoned connect or hello
#: costs the server as much as an answered one: retries became a storm, docs/distributed.md; at
#: 1,024 ranks a 2 s open timeout gave thousands of failed connects). A server that is down
#: refuses the connect at once; the sender spools meanwhile (`waiting`).
OPEN_TIMEOUT_S = 10.0
WELCOME_TIMEOUT_S = 30.0
#: While waiting for the welcome, `waiting` is called this often (the sender spools meanwhile).
WAIT_SLICE_S = 0.5


class Refused(ConnectionError):
    """The server was reached and said no (a wrong token, a hello or message it does not accept):
    trying again unchanged will not help."""


class NeedParams(Refused):
    """The server does not know the parameter list a v2 hello named by digest: send it in full."""


def token_headers(token: Optional[str]) -> Optional[dict[str, str]]:
    return {"Authorization": f"Bearer {token}"} if token else None


def handshake(
    ws_url: str,
    hello: str,
    token: Optional[str],
    scope: contextlib.ExitStack,
    *,
    open_timeout: float = OPEN_TIMEOUT_S,
    welcome_timeout: float = WELCOME_TIMEOUT_S,
    send_timeout: Optional[float] = None,
    waiting: Optional[Callable[[], bool]] = None,
) -> tuple[ClientConnection, dict[str, Any]]:
    """Connect, send the serialized `hello`, and return the connection with the server's `welcome`.

    The connection is entered into `scope`, which closes it. `send_timeout` bounds each send: a
    server that stops reading then fails the send instead of holding the caller. `waiting` is
    called every WAIT_SLICE_S while the connection opens and while the welcome is awaited; it
    returns False to stop waiting (a TimeoutError, as when `open_timeout` or `welcome_timeout`
    passes). Raises `Refused`
    when the server answers with anything but a welcome, OSError/TimeoutError when it cannot be
    reached, does not answer, or the address does not speak HTTP/websocket.
    """
    try:
        ws = scope.enter_context(_open(ws_url, token, open_timeout, waiting))
    except InvalidStatus as exc:  # answered over HTTP, but not with a websocket
        raise Refused(
            f"the server answered HTTP {exc.response.status_code} at {ws_url}: is it a gradwatch "
            "server, and is the URL its address?"
        ) from None
    except InvalidHandshake as exc:  # something answered, but not HTTP (another service on that port)
        raise ConnectionError(
            f"{ws_url} does not speak HTTP/websocket ({type(exc).__name__}: {exc}): is the URL "
            "the gradwatch server's address?"
        ) from None
    if send_timeout is not None:
        seconds = int(send_timeout)
        micros = int((send_timeout - seconds) * 1e6)
        try:
            ws.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", seconds, micros))
        except OSError:  # closed already (a server that refuses closes at once): the recv below says why
            pass
    try:  # a server that refuses the connection closes it at once: the send may see that already
        ws.send(hello)
        reply = json.loads(_welcome(ws, welcome_timeout, waiting))
    except ConnectionClosed as exc:
        raise closed(exc, "the server closed the connection before its welcome") from None
    if reply.get("type") != "welcome":
        kind = NeedParams if _close_code(ws) == CLOSE_NEED_PARAMS else Refused
        raise kind(f"the server answered the hello with {reply.get('message', reply)!r}")
    return ws, reply


def negotiate(
    ws_url: str, hellos: Sequence[str], token: Optional[str], scope: contextlib.ExitStack, **options: Any
) -> tuple[ClientConnection, dict[str, Any], int]:
    """`handshake` with the first of `hellos` (wire.rank_hellos) the server takes: the next one
    after `NeedParams`, the last (v1) after a refusal of the protocol version (a server older
    than v2). Returns the connection, its welcome and the index of the hello taken."""
    i = 0
    while True:
        try:
            ws, reply = handshake(ws_url, hellos[i], token, scope, **options)
            return ws, reply, i
        except Refused as exc:
            if i + 1 >= len(hellos):
                raise
            if isinstance(exc, NeedParams):
                i += 1
            elif "unsupported protocol version" in str(exc):
                i = len(hellos) - 1
            else:
                raise


def _close_code(ws: ClientConnection) -> Optional[int]:
    """The code of the close that follows a refusal's error frame (None if none comes soon)."""
    try:
        ws.recv(timeout=1.0)
    except ConnectionClosed as exc:
        return None if exc.rcvd is None else exc.rcvd.code
    except TimeoutError:
        return None
    return None


def _open(ws_url: str, token: Optional[str], timeout: float, waiting: Optional[Callable[[], bool]]) -> ClientConnection:
    """Open the connection; with `waiting`, on a thread of its own, calling `waiting` every
    WAIT_SLICE_S meanwhile (a connection given up on is closed once it opens)."""

    def attempt() -> ClientConnection:
        return connect(
            ws_url,
            additional_headers=token_headers(token),
            open_timeout=timeout,
            close_timeout=2,
            max_size=MAX_FRAME_BYTES,
            compression=None,
        )

    if waiting is None:
        return attempt()
    lock = threading.Lock()
    got: dict[str, Any] = {}

    def run() -> None:
        try:
            ws: Any = attempt()
        except BaseException as exc:  # handed to the caller below
            ws = exc
        with lock:
            got["result"] = ws
            abandoned = got.get("abandoned", False)
        if abandoned and isinstance(ws, ClientConnection):
            ws.close()

    opener = threading.Thread(target=run, name="gradwatch-connect", daemon=True)
    opener.start()
    deadline = time.monotonic() + timeout
    while True:
        opener.join(max(0.0, min(WAIT_SLICE_S, deadline - time.monotonic())))
        with lock:
            if "result" in got:
                break
        if time.monotonic() >= deadline or not waiting():
            with lock:
                if "result" not in got:  # else it opened meanwhile: taken
                    got["abandoned"] = True
                    raise TimeoutError(f"the connection to {ws_url} did not open in time")
            break
    result = got["result"]
    if isinstance(result, BaseException):
        raise result
    opened: ClientConnection = result
    return opened


def _welcome(ws: ClientConnection, timeout: float, waiting: Optional[Callable[[], bool]]) -> Any:
    if waiting is None:
        return ws.recv(timeout=timeout)
    deadline = time.monotonic() + timeout
    while True:
        try:
            return ws.recv(timeout=max(0.0, min(WAIT_SLICE_S, deadline - time.monotonic())))
        except TimeoutError:
            if time.monotonic() >= deadline or not waiting():
                raise


def replies(ws: ClientConnection, timeout: float) -> Iterator[dict[str, Any]]:
    """The server's replies (ack, error, finding): waits up to `timeout` for the first, then
    yields those already received. Raises ConnectionClosed when the server closes."""
    while True:
        try:
            yield json.loads(ws.recv(timeout=timeout))
        except TimeoutError:
            return
        timeout = 0.0


def closed(exc: ConnectionClosed, otherwise: str) -> ConnectionError:
    """The error to raise for a connection the server closed: `Refused` when it refused something."""
    if exc.rcvd is not None and exc.rcvd.code == CLOSE_NEED_PARAMS:
        return NeedParams(exc.rcvd.reason)
    why = refusal(exc)
    return Refused(why) if why is not None else ConnectionError(otherwise)


def refusal(exc: ConnectionClosed) -> Optional[str]:
    """What a close by the server means, when it refused something; None for any other close."""
    rcvd = exc.rcvd
    if rcvd is None:
        return None
    if rcvd.code == CLOSE_POLICY:
        return (
            f"the server refused the connection ({rcvd.reason}): check the token (--token, watch(token=...) "
            "or GRADWATCH_TOKEN)"
        )
    if rcvd.code == CLOSE_INVALID:
        return f"the server refused a message as invalid ({rcvd.reason})"
    return None

"""The server's app in this process: REST through `httpx.ASGITransport`, the ingest websocket
through the ASGI websocket protocol, with the app's lifespan run as `gradwatch serve` runs it.

For tests of what the app answers (routes, queries, encodings, errors), where a process and a
socket add seconds and nothing under test. What only a real process has (uvicorn's HTTP and
websocket handling, signals, several workers, the CLI) stays with `support.server.start_server`.

    with InProcessServer(Settings(db_url=url)) as server:
        with server.hook() as hook:        # a `support.wiremsg.Hook`, without a socket
            hook.call(hello("run"))
        with server.client() as http:      # an httpx.Client
            http.get("/api/runs/run")

The app runs on an event loop of its own, in a thread (`anyio.from_thread`), as under uvicorn;
the test's calls wait for their answers there.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from types import TracebackType
from typing import Any

import anyio
import httpx
from anyio.from_thread import BlockingPortal, start_blocking_portal
from websockets.exceptions import ConnectionClosed
from websockets.frames import Close

from gradwatch_server.app import create_app
from gradwatch_server.settings import Settings
from support.wiremsg import Hook

#: The URL the in-process app is addressed by (its Host header passes the loopback host guard).
BASE_URL = "http://127.0.0.1:8765"


class _PortalTransport(httpx.BaseTransport):
    """httpx.ASGITransport for a synchronous httpx.Client: each request runs on the app's loop."""

    def __init__(self, portal: BlockingPortal, app: Any) -> None:
        self._portal = portal
        self._asgi = httpx.ASGITransport(app=app)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        return self._portal.call(self._send, request)

    async def _send(self, request: httpx.Request) -> httpx.Response:
        response = await self._asgi.handle_async_request(request)
        body = await response.aread()
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            content=body,
            extensions=response.extensions,
            request=request,
        )


class _AsgiWebSocket:
    """A websocket connection to the app, driven through ASGI messages; offers what `Hook` uses
    of websockets' client connection: `send(text)`, `recv(timeout)`, and ConnectionClosed."""

    def __init__(self, portal: BlockingPortal, app: Any, path: str, headers: dict[str, str]) -> None:
        self._portal = portal
        self._to_app, self._app_receives = portal.call(_channel)
        self._app_sends, self._from_app = portal.call(_channel)
        scope = {
            "type": "websocket",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "scheme": "ws",
            "path": path,
            "raw_path": path.encode(),
            "root_path": "",
            "query_string": b"",
            "headers": [(b"host", b"127.0.0.1:8765"), *((k.lower().encode(), v.encode()) for k, v in headers.items())],
            "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 8765),
            "subprotocols": [],
        }
        self._done = portal.start_task_soon(self._run, app, scope)
        self._closed: Close | None = None
        self._send_message({"type": "websocket.connect"})
        accepted = self._next(10.0)
        if accepted["type"] != "websocket.accept":
            raise ConnectionError(f"the app refused the websocket: {accepted}")

    async def _run(self, app: Any, scope: dict[str, Any]) -> None:
        try:
            await app(scope, self._app_receives.receive, self._app_sends.send)
        finally:
            await self._app_sends.send({"type": "websocket.close", "code": 1006, "reason": "the app returned"})

    def _send_message(self, message: dict[str, Any]) -> None:
        self._portal.call(self._to_app.send, message)

    def _next(self, timeout: float | None) -> dict[str, Any]:
        async def receive() -> dict[str, Any]:
            with anyio.fail_after(timeout):
                message: dict[str, Any] = await self._from_app.receive()
                return message

        return self._portal.call(receive)

    def send(self, text: str | bytes) -> None:
        if self._closed is not None:
            raise ConnectionClosed(self._closed, None)
        self._send_message({"type": "websocket.receive", "bytes" if isinstance(text, bytes) else "text": text})

    def recv(self, timeout: float | None = None) -> str:
        if self._closed is None:
            message = self._next(timeout)
            if message["type"] == "websocket.send":
                return str(message["text"])
            self._closed = Close(int(message.get("code", 1000)), str(message.get("reason", "")))
        raise ConnectionClosed(self._closed, None)

    def close(self) -> None:
        if self._closed is None:
            self._send_message({"type": "websocket.disconnect", "code": 1000})
        self._done.result(timeout=10)


async def _channel() -> tuple[Any, Any]:
    """Unbounded: neither side waits for the other to read (as a socket's buffers, roughly)."""
    return anyio.create_memory_object_stream[dict[str, Any]](math.inf)


class InProcessHook(Hook):
    """`support.wiremsg.Hook` on the in-process app's /ws/ingest."""

    def __init__(self, server: InProcessServer, token: str | None = None) -> None:
        self._server = server
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.findings: list[dict[str, Any]] = []
        self.costs: list[float] = []

    def __enter__(self) -> InProcessHook:
        self.ws = _AsgiWebSocket(self._server.portal, self._server.app, "/ws/ingest", self._headers)  # type: ignore[assignment]  # duck-types websockets' ClientConnection
        return self

    def __exit__(self, *exc: object) -> None:
        self.ws.close()


class InProcessServer:
    """`create_app(settings)` with its lifespan entered; a context manager."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.app = create_app(settings)
        self._stack = contextlib.ExitStack()
        self.portal: BlockingPortal

    def __enter__(self) -> InProcessServer:
        self.portal = self._stack.enter_context(start_blocking_portal())
        lifespan = self.app.router.lifespan_context(self.app)
        self._stack.enter_context(self.portal.wrap_async_context_manager(lifespan))
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stack.__exit__(kind, exc, tb)

    def client(self, **kwargs: Any) -> httpx.Client:
        """An httpx.Client whose requests the app answers in this process."""
        return httpx.Client(transport=_PortalTransport(self.portal, self.app), base_url=BASE_URL, **kwargs)

    def hook(self, token: str | None = None) -> InProcessHook:
        return InProcessHook(self, token)


@contextlib.contextmanager
def in_process_server(db_url: str, **settings: Any) -> Iterator[InProcessServer]:
    """An in-process server on `db_url` (crash grace 1 s, as `start_server`'s)."""
    with InProcessServer(Settings(db_url=db_url, **{"crash_grace_s": 1.0, **settings})) as server:
        yield server

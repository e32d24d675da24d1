"""Run the app under uvicorn with a quieter main loop.

uvicorn's main loop wakes ten times a second to see whether it should stop and to renew the `Date`
header; gradwatch usually runs beside the training it watches, on the same cores. `QuietServer`
renews the `Date` header when a request reads it in a new second (`FreshHeaders`), a SIGINT or
SIGTERM wakes its main loop at once, and the loop looks at its state every TICK_S otherwise: a
server at rest does not wake. Why: docs/design.md, The server's main loop.

Before the server starts, what was built so far (modules, the app, the schema's models) is
moved out of the garbage collector's view (`gc.freeze`) and the collector runs less often
(GC_THRESHOLD): a large job keeps millions of live objects, which every full collection walked
(about half the server's CPU at 1,024 ranks). Why: docs/design.md, The garbage collector.
"""

from __future__ import annotations

import asyncio
import gc
import time
from email.utils import formatdate
from types import FrameType
from typing import Any

import uvicorn
from uvicorn.server import ServerState

#: Seconds between the main loop's looks at its state when no signal wakes it (a stop asked for
#: otherwise). Each wake-up costs the server CPU, which the training beside it pays.
TICK_S = 60.0
#: The collector's thresholds once started (CPython's default is (700, 10, 10)): a young
#: generation of 50,000 objects lets the objects of a frame, an ack or a group commit die by
#: their reference counts before a collection promotes them, so that fewer reach the oldest
#: generation, whose collections walk every live object.
GC_THRESHOLD = (50_000, 20, 100)


def tune_gc() -> None:
    """Freeze what startup built, and collect less often (GC_THRESHOLD)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)


class FreshHeaders(ServerState):
    """uvicorn's state shared by its connections, whose `default_headers` (what every response
    carries) renew their `Date` header when read in a new second: uvicorn's protocols read them
    once a request, so no timer has to renew them."""

    _dated: bool
    _rest: list[tuple[bytes, bytes]]
    _second: int
    _headers: list[tuple[bytes, bytes]]

    @property
    def default_headers(self) -> list[tuple[bytes, bytes]]:
        if self._dated and (now := int(time.time())) != self._second:
            self._second = now
            self._headers = [(b"date", formatdate(now, usegmt=True).encode()), *self._rest]
        return self._headers

    @default_headers.setter
    def default_headers(self, headers: list[tuple[bytes, bytes]]) -> None:
        """uvicorn's `on_tick` sets them: a `Date` header among them says they carry one."""
        self._dated = any(name == b"date" for name, _ in headers)
        self._rest = [(name, value) for name, value in headers if name != b"date"]
        self._second = -1
        self._headers = list(headers)


class QuietServer(uvicorn.Server):
    """uvicorn.Server whose main loop wakes at once on a signal to stop, else every TICK_S, and
    whose `Date` header is renewed by the requests that read it (FreshHeaders)."""

    _loop: asyncio.AbstractEventLoop | None = None
    _waiter: asyncio.Future[None] | None = None

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.server_state = FreshHeaders()

    async def main_loop(self) -> None:
        self._loop = loop = asyncio.get_running_loop()
        counter = 0
        while not await self.on_tick(counter):  # True once should_exit: a signal came meanwhile
            counter = (counter + 10) % 864000  # on_tick sets the headers (FreshHeaders) when counter % 10 == 0
            # a future and a timer: asyncio.wait_for made a task and raised two exceptions a tick
            self._waiter = waiter = loop.create_future()
            timer = loop.call_later(TICK_S, _wake, waiter)
            await waiter
            timer.cancel()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        if self._loop is not None:
            # a signal handler runs between two bytecodes of the loop's thread, which may be
            # inside the selector's wait: only the loop's self-pipe ends that wait now
            self._loop.call_soon_threadsafe(self._wake_now)

    def _wake_now(self) -> None:
        if self._waiter is not None:
            _wake(self._waiter)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def run(app: Any, **config: Any) -> None:
    """`uvicorn.run(app, **config)` with a QuietServer; SystemExit(3) if it could not start, as uvicorn."""
    server = QuietServer(uvicorn.Config(app, **config))
    tune_gc()  # the app is built: what it holds lives as long as the server
    server.run()
    if not server.started:
        raise SystemExit(3)

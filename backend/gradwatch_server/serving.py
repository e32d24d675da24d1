"""Run the app under uvicorn with a quieter main loop.

uvicorn's main loop wakes ten times a second to see whether it should stop; gradwatch usually runs
beside the training it watches, on the same cores. `QuietServer` ticks every 5 s (the `Date`
header is renewed then), and a SIGINT or SIGTERM wakes it at once, so it stops as promptly.
Why: docs/design.md, The server's main loop.

Before the server starts, what was built so far (modules, the app, the schema's models) is
moved out of the garbage collector's view (`gc.freeze`) and the collector runs less often
(GC_THRESHOLD): a large job keeps millions of live objects, which every full collection walked
(about half the server's CPU at 1,024 ranks). Why: docs/design.md, The garbage collector.
"""

from __future__ import annotations

import asyncio
import gc
from types import FrameType
from typing import Any

import uvicorn

#: Seconds between the main loop's looks at its state when no signal wakes it, and between two
#: renewals of the `Date` header (HTTP asks only for a reasonable approximation of the time). Each
#: wake-up costs the server CPU, which the training beside it pays.
TICK_S = 5.0
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


class QuietServer(uvicorn.Server):
    """uvicorn.Server whose main loop ticks every TICK_S, and at once on a signal to stop."""

    _loop: asyncio.AbstractEventLoop | None = None
    _waiter: asyncio.Future[None] | None = None

    async def main_loop(self) -> None:
        self._loop = loop = asyncio.get_running_loop()
        counter = 0
        while not await self.on_tick(counter):  # True once should_exit: a signal came meanwhile
            counter = (counter + 10) % 864000  # on_tick renews the Date header when counter % 10 == 0
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

"""Run the app under uvicorn with a quieter main loop.

uvicorn's main loop wakes ten times a second to see whether it should stop; gradwatch usually runs
beside the training it watches, on the same cores. `QuietServer` ticks once a second, which is
all the `Date` header needs, and a SIGINT or SIGTERM wakes it at once, so it stops as promptly.
Why: docs/design.md, The server's main loop.
"""

from __future__ import annotations

import asyncio
import contextlib
from types import FrameType
from typing import Any

import uvicorn

#: Seconds between the main loop's looks at its state when no signal wakes it.
TICK_S = 1.0


class QuietServer(uvicorn.Server):
    """uvicorn.Server whose main loop ticks every TICK_S, and at once on a signal to stop."""

    _loop: asyncio.AbstractEventLoop | None = None
    _stop: asyncio.Event | None = None

    async def main_loop(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        if self.should_exit:  # a signal came before the loop could be woken
            self._stop.set()
        counter = 0
        while not await self.on_tick(counter):
            counter = (counter + 10) % 864000  # on_tick renews the Date header when counter % 10 == 0
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stop.wait(), TICK_S)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        if self._loop is not None and self._stop is not None:
            # a signal handler runs between two bytecodes of the loop's thread, which may be
            # inside the selector's wait: only the loop's self-pipe ends that wait now
            self._loop.call_soon_threadsafe(self._stop.set)


def run(app: Any, **config: Any) -> None:
    """`uvicorn.run(app, **config)` with a QuietServer; SystemExit(3) if it could not start, as uvicorn."""
    server = QuietServer(uvicorn.Config(app, **config))
    server.run()
    if not server.started:
        raise SystemExit(3)

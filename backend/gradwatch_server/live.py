"""Live fan-out to browsers on /ws/live: run events, and the steps of the run a browser shows.

Each browser has a bounded queue. Publishing never waits: a browser whose queue is full is
dropped and closed with 1013, and reconnects to catch up over REST (docs/protocol.md). Events
are serialized once and the same text goes to every browser.
"""
from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import WebSocket, WebSocketDisconnect
from starlette.websockets import WebSocketDisconnected

from .jsonvalues import metric_list, word
from .models import RunPublic
from .protocol import GRAD_STATUS, Step, decode_floats
from .store import Run

CLOSE_TRY_AGAIN_LATER = 1013


class Subscriber:
    """One browser: its run filter (None: run events only) and its queue of JSON texts."""

    def __init__(self, run_id: str | None, size: int) -> None:
        self.run_id = run_id
        # None in the queue is the order to close with 1013.
        self.queue: asyncio.Queue[str | None] = asyncio.Queue(size)


class LiveHub:
    """Who listens, and delivery to them; used from the event loop only."""

    def __init__(self, queue_size: int) -> None:
        self._queue_size = queue_size
        self._subscribers: set[Subscriber] = set()

    def subscribe(self, run_id: str | None) -> Subscriber:
        sub = Subscriber(run_id, self._queue_size)
        self._subscribers.add(sub)
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        self._subscribers.discard(sub)

    def publish_run(self, run: Run) -> None:
        """A run was created or changed status: tell every browser."""
        text = json.dumps({"type": "run", "run": RunPublic.of(run).model_dump()}, allow_nan=False)
        for sub in list(self._subscribers):
            self._deliver(sub, text)

    def publish_step(self, run_id: str, step: Step) -> None:
        """A step was committed: tell the browsers watching its run."""
        watchers = [s for s in self._subscribers if s.run_id == run_id]
        if not watchers:
            return
        status = step.grad_status
        text = json.dumps({
            "type": "step", "run_id": run_id, "step": step.step, "time": step.time,
            "scalars": {k: word(v) for k, v in step.scalars.items()},
            "params": {m: metric_list(decode_floats(raw)) for m, raw in step.params.items()},
            GRAD_STATUS: None if status is None else list(status),
        }, allow_nan=False)
        for sub in watchers:
            self._deliver(sub, text)

    def publish_finding(self, run_id: str, finding: dict[str, Any]) -> None:
        """A diagnostic finding of a run is new or changed: tell the browsers watching the run."""
        watchers = [s for s in self._subscribers if s.run_id == run_id]
        if not watchers:
            return
        text = json.dumps({"type": "finding", "run_id": run_id, "finding": finding}, allow_nan=False)
        for sub in watchers:
            self._deliver(sub, text)

    def _deliver(self, sub: Subscriber, text: str) -> None:
        try:
            sub.queue.put_nowait(text)
        except asyncio.QueueFull:
            self._subscribers.discard(sub)
            while not sub.queue.empty():
                sub.queue.get_nowait()
            sub.queue.put_nowait(None)


async def pump(websocket: WebSocket, sub: Subscriber) -> None:
    """Send queued events until the browser leaves or falls behind."""

    async def send() -> None:
        while (text := await sub.queue.get()) is not None:
            await websocket.send_text(text)
        await websocket.close(CLOSE_TRY_AGAIN_LATER, "too slow: reconnect and catch up over REST")

    async def wait_for_disconnect() -> None:
        while (await websocket.receive())["type"] != "websocket.disconnect":
            pass  # browsers have nothing to say; ignore what they send

    tasks = [asyncio.create_task(send()), asyncio.create_task(wait_for_disconnect())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
    for result in results:
        # A browser that went away mid-send is the normal end of the stream.
        if isinstance(result, BaseException) and not isinstance(
            result, (asyncio.CancelledError, WebSocketDisconnect, WebSocketDisconnected)
        ):
            raise result

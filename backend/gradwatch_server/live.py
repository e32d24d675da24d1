"""Live fan-out to browsers on /ws/live: run events, and the steps of the run a browser shows.

Each browser has a bounded queue. Publishing never waits: a browser whose queue is full is
dropped and closed with 1013, and reconnects to catch up over REST (docs/protocol.md). Events
are serialized once and the same text goes to every browser. With `gradwatch serve --workers N`
each worker's hub is relay.py's `RelayedHub`, which also passes every event to the other workers.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from fastapi import WebSocket, WebSocketDisconnect
from starlette.websockets import WebSocketDisconnected

from .jsonvalues import metric_list, word
from .models import RunPublic
from .protocol import GRAD_STATUS, Step, decode_floats
from .store import Run, StepData, StoredStep

CLOSE_TRY_AGAIN_LATER = 1013

#: Handshake header of /ws/live and /ws/ingest: the process id of the worker serving the socket
#: (`gradwatch serve --workers N` runs several; tests and operators can tell them apart).
WORKER_HEADER = "x-gradwatch-worker"


def worker_headers() -> list[tuple[bytes, bytes]]:
    """Headers for `websocket.accept`: which worker process serves this socket."""
    return [(WORKER_HEADER.encode(), str(os.getpid()).encode())]


def run_event(run: Run) -> str:
    """The `run` message: a run was created or changed status."""
    return json.dumps({"type": "run", "run": RunPublic.of(run).model_dump()}, allow_nan=False)


def step_event(
    run_id: str,
    step: int,
    time: float,
    scalars: Mapping[str, float],
    params: Mapping[str, np.ndarray],
    grad_status: Sequence[int] | None,
) -> str:
    """The `step` message: float32 arrays per metric, grad_status codes apart."""
    return json.dumps(
        {
            "type": "step",
            "run_id": run_id,
            "step": step,
            "time": time,
            "scalars": {k: word(v) for k, v in scalars.items()},
            "params": {m: metric_list(values) for m, values in params.items()},
            GRAD_STATUS: None if grad_status is None else list(grad_status),
        },
        allow_nan=False,
    )


def finding_event(run_id: str, finding: Mapping[str, Any]) -> str:
    """The `finding` message: a finding of the run is new or changed."""
    return json.dumps({"type": "finding", "run_id": run_id, "finding": finding}, allow_nan=False)


class Subscriber:
    """One browser: its run filter (None: run events only) and its queue of JSON texts."""

    def __init__(self, run_id: str | None, size: int) -> None:
        self.run_id = run_id
        # None in the queue is the order to close with 1013.
        self.queue: asyncio.Queue[str | None] = asyncio.Queue(size)


#: How long a hook may hold steps before it sends them (`linger` in `welcome` and `ack`, see
#: docs/protocol.md): short while a browser watches the run, longer while none does (fewer
#: commits, acks and diagnostics passes on both sides: what a fast training loop pays). What a
#: killed training process loses does not depend on it: the hook writes its spool every second
#: whatever the pace (gradwatch.sender.SPOOL_EVERY_S). Docs: design.md (the pace), benchmarks.md.
LIVE_LINGER_S = 0.25
IDLE_LINGER_S = 5.0


class LiveHub:
    """Who listens, and delivery to them; used from the event loop only."""

    def __init__(self, queue_size: int) -> None:
        self._queue_size = queue_size
        self._subscribers: set[Subscriber] = set()
        #: run id -> how to tell each of its hooks' connections a new pace (`listen_pace`)
        self._pacers: dict[str, set[Callable[[float], None]]] = {}

    def subscribe(self, run_id: str | None) -> Subscriber:
        """A browser; one that changes its run's pace (the first to watch it) has the run's hooks
        told the new pace at once rather than with their next ack, up to IDLE_LINGER_S away."""
        before = None if run_id is None else self.linger(run_id)
        sub = Subscriber(run_id, self._queue_size)
        self._subscribers.add(sub)
        if run_id is not None and (linger := self.linger(run_id)) != before:
            for tell in list(self._pacers.get(run_id, ())):
                tell(linger)
        return sub

    def listen_pace(self, run_id: str, tell: Callable[[float], None]) -> None:
        """A hook's connection of the run: `tell(linger)` when a browser starts watching it."""
        self._pacers.setdefault(run_id, set()).add(tell)

    def unlisten_pace(self, run_id: str, tell: Callable[[float], None]) -> None:
        tells = self._pacers.get(run_id)
        if tells is not None:
            tells.discard(tell)
            if not tells:
                del self._pacers[run_id]

    def unsubscribe(self, sub: Subscriber) -> None:
        self._subscribers.discard(sub)

    def publish_run(self, run: Run) -> None:
        """A run was created or changed status: tell every browser."""
        self.send_all(run_event(run))

    def publish_step(self, run_id: str, step: Step) -> None:
        """A step was committed: tell the browsers watching its run."""
        watchers = self._watchers(run_id)
        if not watchers:
            return
        status = step.grad_status
        text = step_event(
            run_id,
            step.step,
            step.time,
            step.scalars,
            {m: decode_floats(raw) for m, raw in step.params.items()},
            None if status is None else list(status),
        )
        for sub in watchers:
            self._deliver(sub, text)

    def publish_steps(self, run_id: str, steps: Sequence[Step]) -> None:
        """The new steps of one committed batch, in order (none watching: nothing per step)."""
        if not self._watchers(run_id):
            return
        for step in steps:
            self.publish_step(run_id, step)

    def publish_late(self, run_id: str, steps: Sequence[Step]) -> None:
        """Steps stored before that got arrays late (the flight recorder's, protocol.RESENT: their
        scalars hold it), once committed: the pages watching the run fetch their series again."""
        self.publish_steps(run_id, steps)

    def steps_notice(self, run_id: str) -> Callable[[Sequence[StepData]], tuple[str, str]] | None:
        """What to NOTIFY in the transaction that stores a run's steps (`Store.write_steps`):
        nothing for one process; relay.py's hub announces them to every worker."""
        return None

    def publish_record(self, run_id: str, record: StoredStep) -> None:
        """A stored step read back (another worker ingested it): the same message as `publish_step`."""
        watchers = self._watchers(run_id)
        if not watchers:
            return
        arrays = dict(record.arrays)
        status = arrays.pop(GRAD_STATUS, None)
        text = step_event(
            run_id, record.step, record.time, record.scalars, arrays, None if status is None else status.tolist()
        )
        for sub in watchers:
            self._deliver(sub, text)

    def publish_finding(self, run_id: str, finding: dict[str, Any]) -> None:
        """A diagnostic finding of a run is new or changed: tell the browsers watching the run."""
        if self.watching(run_id):
            self.send_watchers(run_id, finding_event(run_id, finding))

    def send_all(self, text: str) -> None:
        """Queue a message for every browser."""
        for sub in list(self._subscribers):
            self._deliver(sub, text)

    def send_watchers(self, run_id: str, text: str) -> None:
        """Queue a message for the browsers watching a run."""
        for sub in self._watchers(run_id):
            self._deliver(sub, text)

    def listening(self) -> bool:
        """Whether any browser is connected."""
        return bool(self._subscribers)

    def watching(self, run_id: str) -> bool:
        """Whether any browser watches this run's steps."""
        return any(s.run_id == run_id for s in self._subscribers)

    def linger(self, run_id: str) -> float:
        """The pace to ask of the run's hook (seconds it may hold steps)."""
        return LIVE_LINGER_S if self.watching(run_id) else IDLE_LINGER_S

    def drop_all(self) -> None:
        """Close every browser with 1013 (events were lost): each reconnects and catches up over REST."""
        for sub in list(self._subscribers):
            self._drop(sub)

    def _watchers(self, run_id: str) -> list[Subscriber]:
        return [s for s in self._subscribers if s.run_id == run_id]

    def _deliver(self, sub: Subscriber, text: str) -> None:
        try:
            sub.queue.put_nowait(text)
        except asyncio.QueueFull:
            self._drop(sub)

    def _drop(self, sub: Subscriber) -> None:
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

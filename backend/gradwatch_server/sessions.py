"""Which runs have a hook connected, and marking the ones that vanished as crashed.

A hook that disconnects without sending `close` may just be reconnecting, so a run is marked
crashed only after `grace_s` seconds without any connection, and only if it is still running
and nothing was written to it since the timer started (so a hook that reconnects while the
timer fires is never overruled). Runs found running when the server starts get the same
grace: their hooks may come back. A rank of a distributed job is waited for at least
`--rank-timeout` (`rank_grace_s`), as the job's assembly waits for a silent rank: once crashed,
the job's steps would go on without it.

With `gradwatch serve --workers N` each worker counts only the hooks it holds, so a timer may run
out in one worker while the run's hook is connected to another (a worker that starts, or is
restarted, watches every running run): a `Presence` (relay.py) says whether any worker holds a
hook of the run, and only a run that no worker holds is marked. The mark itself is one
conditional UPDATE, so of several workers whose timers run out only one marks the run and
announces it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Protocol

from .live import LiveHub
from .protocol import is_stream_id
from .store import Store

log = logging.getLogger("gradwatch.sessions")

#: Seconds before asking again when it cannot be told whether another worker holds a hook.
PRESENCE_RETRY_S = 5.0


class Presence(Protocol):
    """Which runs have a hook connected to some worker (`serve --workers N`; relay.py)."""

    def arrived(self, run_id: str) -> None: ...
    def left(self, run_id: str) -> None: ...
    async def held_elsewhere(self, run_id: str) -> bool: ...


class Sessions:
    """Counts connections per run and runs one crash timer per run left without any. Loop-only."""

    def __init__(
        self,
        store: Store,
        hub: LiveHub,
        grace_s: float,
        clock: Callable[[], float] = time.time,
        presence: Presence | None = None,
        rank_grace_s: float = 0.0,
    ) -> None:
        self._store = store
        self._rank_grace_s = max(grace_s, rank_grace_s)
        self._presence = presence
        self._clock = clock
        self._hub = hub
        self._grace_s = grace_s
        self._connections: Counter[str] = Counter()
        self._timers: dict[str, asyncio.Task[None]] = {}

    def attach(self, run_id: str) -> None:
        """A hook connected for this run: it is alive, whatever timer was counting."""
        self._connections[run_id] += 1
        if self._presence is not None and self._connections[run_id] == 1:
            self._presence.arrived(run_id)
        timer = self._timers.pop(run_id, None)
        if timer is not None:
            timer.cancel()

    def detach(self, run_id: str, *, closed: bool) -> None:
        """A hook's connection ended; without a `close` (`closed`) the run may have crashed."""
        self._connections[run_id] -= 1
        if self._connections[run_id] <= 0:
            del self._connections[run_id]
            if self._presence is not None:
                self._presence.left(run_id)
            if not closed:
                self.watch([run_id])

    def watch(self, run_ids: Iterable[str]) -> None:
        """Mark these runs crashed unless a hook connects for them within the grace period."""
        for run_id in run_ids:
            if run_id not in self._connections and run_id not in self._timers:
                self._timers[run_id] = asyncio.create_task(self._expire(run_id, self._clock()))

    def grace_s(self, run_id: str) -> float:
        """How long this run may stay without a hook: a rank's stream at least `rank_grace_s`."""
        return self._rank_grace_s if is_stream_id(run_id) else self._grace_s

    async def _expire(self, run_id: str, idle_since: float, delay: float | None = None) -> None:
        grace = self.grace_s(run_id)
        await asyncio.sleep(grace if delay is None else delay)
        self._timers.pop(run_id, None)
        if run_id in self._connections:
            return
        if self._presence is not None:
            try:
                elsewhere = await self._presence.held_elsewhere(run_id)
            except Exception as exc:  # the database is away: never mark a run that may be alive
                retry = max(grace, PRESENCE_RETRY_S)
                log.warning(
                    "run %s: cannot tell whether another worker holds its hook (%s); asking again in %.0f s",
                    run_id,
                    exc,
                    retry,
                )
                if run_id not in self._connections and run_id not in self._timers:
                    self._timers[run_id] = asyncio.create_task(self._expire(run_id, idle_since, retry))
                return
            if elsewhere or run_id in self._connections:
                return  # that worker (or this one, since the question) watches it from now on
        try:
            if await asyncio.to_thread(self._store.mark_crashed, run_id, idle_since):
                log.info("run %s marked crashed: no hook for %.0f s", run_id, grace)
                run = await asyncio.to_thread(self._store.get_run, run_id)
                if run is not None and run.parent_id is None:  # a rank's run: its job's stands for it
                    self._hub.publish_run(run)
        except Exception:  # a timer has no caller to report to: log, and keep serving
            log.exception("could not mark run %s crashed", run_id)

    async def close(self) -> None:
        """Stop every timer (server shutdown): the next start gives those runs a new grace."""
        timers = list(self._timers.values())
        self._timers.clear()
        for timer in timers:
            timer.cancel()
        await asyncio.gather(*timers, return_exceptions=True)

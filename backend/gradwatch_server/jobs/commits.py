"""Group commits of ranks' frames: the batches that the ranks' connections of this process have
read while the previous group was being stored are stored together, in one transaction
(`Store.write_rank_steps`), and each connection is answered once that transaction is committed.

A large job's ranks each send a frame per step at about the same moment; stored one transaction
per frame, a 64-rank job spent more of the server's CPU on the commits and on taking turns for
the store's writer than on its rows. One group is stored at a time (SQLite has one writer; the
frames that arrive meanwhile make the next group), so a group is as large as the load makes it:
one frame when the server is idle, all of a step's ranks when it is busy. A connection's ack
still comes only after its frame is committed (docs/reliability.md: nothing acknowledged is lost).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from ..store import NotifyInTransaction, StepData, Store

#: Most ranks' batches in one transaction: bounds how long one commit holds the store's writer
#: (a dashboard's delete or another run's steps wait behind it).
MAX_GROUP = 256


@dataclass
class _Write:
    run_id: str
    batch: Sequence[StepData]
    notify: NotifyInTransaction | None
    done: asyncio.Future[list[bool]]


class GroupCommits:
    """Stores ranks' batches in groups; used from the event loop only."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._pending: list[_Write] = []
        self._storing: asyncio.Task[None] | None = None

    async def write(self, run_id: str, batch: Sequence[StepData], notify: NotifyInTransaction | None) -> list[bool]:
        """Store `batch` in `run_id` (a rank's run) with the next group; per step, whether it
        was new (Store.write_steps). Raises what storing it alone would raise (UnknownRun)."""
        done: asyncio.Future[list[bool]] = asyncio.get_running_loop().create_future()
        self._pending.append(_Write(run_id, batch, notify, done))
        if self._storing is None:
            self._storing = asyncio.create_task(self._store_groups())
        return await done

    async def _store_groups(self) -> None:
        group: list[_Write] = []
        try:
            while self._pending:
                group = self._next_group()
                try:
                    results = await asyncio.to_thread(
                        self._store.write_rank_steps, [(w.run_id, w.batch, w.notify) for w in group]
                    )
                except Exception as exc:  # not one write's error (those are in the results)
                    results = [exc] * len(group)
                for write, result in zip(group, results):
                    if write.done.done():  # its connection went away meanwhile
                        continue
                    if isinstance(result, Exception):
                        write.done.set_exception(result)
                    else:
                        write.done.set_result(result)
                group = []
        finally:  # cancelled (the server stops): nobody is left waiting
            for write in [*group, *self._pending]:
                write.done.cancel()
            self._pending = []
            self._storing = None

    def _next_group(self) -> list[_Write]:
        """The oldest pending writes, one per run (a run's next batch waits for the next group:
        its store-side state, a tail, is updated only once committed), by run id (the order in
        which PostgreSQL locks their rows: two workers' groups never wait on each other in a
        cycle), at most MAX_GROUP."""
        group: dict[str, _Write] = {}
        rest: list[_Write] = []
        for write in self._pending:
            if write.done.done():
                continue
            if write.run_id in group or len(group) >= MAX_GROUP:
                rest.append(write)
            else:
                group[write.run_id] = write
        self._pending = rest
        return [group[r] for r in sorted(group)]

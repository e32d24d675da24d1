"""A crowd of rank hellos admitted in batches (a job's start: 1,024 ranks connect at once).

Each rank's hello used to open its run in a transaction of its own: eight statements and a commit
per rank, one after the other. Here the hellos of a job that arrive while a batch is being opened
wait for the next batch, opened in one transaction (store/admission.py): the first hello goes at
once, and the crowd behind it in a few batches.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ..protocol import Hello
from ..store import OpenedRank, ParamsMismatch, Store

#: Most hellos opened in one transaction (a batch holds the store's write lock meanwhile).
MAX_BATCH = 256

#: Runs a blocking call off the event loop (ingest.py's hello threads).
OffLoop = Callable[..., Awaitable[Any]]


class Admission:
    """The rank hellos waiting to be opened, by job; one batch at a time, in arrival order."""

    def __init__(self, store: Store, off_loop: OffLoop) -> None:
        self.store = store
        self._off_loop = off_loop
        self._waiting: dict[str, list[tuple[Hello, asyncio.Future[OpenedRank]]]] = {}
        self._task: asyncio.Task[None] | None = None

    async def open(self, hello: Hello) -> OpenedRank:
        """Open `hello`'s run (and its job's) with the batch it joins; raises ParamsMismatch as
        `Store.open_rank` does."""
        assert hello.dist is not None
        future: asyncio.Future[OpenedRank] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(hello.dist.job, []).append((hello, future))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        while self._waiting:
            job = next(iter(self._waiting))
            queue = self._waiting.pop(job)
            batch = queue[:MAX_BATCH]
            if len(queue) > MAX_BATCH:  # the rest after the other jobs' hellos
                self._waiting[job] = queue[MAX_BATCH:]
            try:
                results: Sequence[OpenedRank | ParamsMismatch] = await self._off_loop(
                    self.store.open_ranks, [hello for hello, _ in batch]
                )
            except Exception as exc:  # each hello's connection says so (a server error)
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for (_, future), result in zip(batch, results):
                if future.done():  # its connection went meanwhile
                    continue
                if isinstance(result, ParamsMismatch):
                    future.set_exception(result)
                else:
                    future.set_result(result)


_admissions: weakref.WeakKeyDictionary[Store, Admission] = weakref.WeakKeyDictionary()


def admission(store: Store, off_loop: OffLoop) -> Admission:
    """The admission of `store`'s rank hellos (one per store, on its server's event loop)."""
    found = _admissions.get(store)
    if found is None:
        found = _admissions[store] = Admission(store, off_loop)
    return found

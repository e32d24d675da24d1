"""What a server process hears of a job's ranks before its store does (docs/distributed.md, Lost
ranks). Lost means silent, not slow: a rank whose hello or steps wait on this process's writer
(a crowd of hellos at a job's start, a writer behind) has been heard from now, whatever its
run's last write says. A job's `JobMemory` holds one; the event loop writes it (ingest.py, through
`JobAssembler.hear`) and the assembly's thread reads it (store/jobs.py, `_lost`)."""

from __future__ import annotations


class Hearing:
    """When each rank last sent a frame to this process, and how many of its frames wait on
    this process's writer."""

    def __init__(self) -> None:
        self._heard: dict[int, float] = {}
        self._queued: dict[int, int] = {}

    def hear(self, rank: int, now: float, queued: int = 0) -> None:
        """`rank` sent a frame at `now`; `queued` (+n or -n): n of its frames start or stop
        waiting on the writer."""
        self._heard[rank] = now
        if queued:
            left = self._queued.get(rank, 0) + queued
            if left > 0:
                self._queued[rank] = left
            else:
                self._queued.pop(rank, None)

    def last(self, rank: int, now: float) -> float | None:
        """When this process last heard of `rank`: `now` while frames of it wait here; None if
        it never sent one here."""
        return now if rank in self._queued else self._heard.get(rank)

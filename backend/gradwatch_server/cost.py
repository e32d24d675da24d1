"""What a stored step costs this server process, told to the hooks in their acks (`cpu_per_step`).

Why. A hook with every="auto" keeps what watching costs the training within a budget, and a
server on the training's own machine (the usual `gradwatch serve` beside it) is part of that
cost, which the hook cannot see and which can exceed the hook's own every-step cost on a fast
loop (docs/benchmarks.md). The hook adds it to its budget when the server is on its machine.

What. This process's CPU time (every thread: storing, diagnostics, websockets, the event loop,
answering browsers) over the steps that every connection stored meanwhile, in windows of at
least WINDOW_S seconds, the first opening at the first stored steps (not at the server's start,
whose CPU is no step's). On a server that stores several runs at once, each hears the cost of an
average step: at most a run's own, never less than what its own steps cost on average.
"""

from __future__ import annotations

import time
from collections.abc import Callable

#: Shortest window a figure is taken over: a batch or more of each hook (one every `linger`: 5 s unwatched).
WINDOW_S = 5.0


class StepCost:
    """Process CPU seconds per stored step; used from the event loop only."""

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, cpu: Callable[[], float] = time.process_time
    ) -> None:
        self._clock, self._cpu = clock, cpu
        self._steps = 0
        self._mark: tuple[float, float, int] | None = None  # (time, process CPU, steps) where the window opened
        self.cpu_per_step: float | None = None  # the last full window's figure; None before one

    def stored(self, steps: int) -> float | None:
        """Count `steps` newly stored steps; returns the current figure (None before a window)."""
        now = self._clock()
        if self._mark is None:  # these steps' CPU was spent before the window: they open it
            self._mark = (now, self._cpu(), steps)
        self._steps += steps
        started, cpu, counted = self._mark
        if now - started >= WINDOW_S and self._steps > counted:
            spent = self._cpu()
            self.cpu_per_step = max(0.0, spent - cpu) / (self._steps - counted)
            self._mark = (now, spent, self._steps)
        return self.cpu_per_step

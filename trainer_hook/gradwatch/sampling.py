"""Which optimizer steps are measured: every N-th, or as often as a cost budget allows."""
from __future__ import annotations

import math
import statistics
from collections import deque
from typing import Optional, Union


class EveryN:
    """Steps 1, 1+N, 1+2N, ..."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __call__(self, step: int) -> bool:
        return (step - 1) % self.n == 0

    def observe(self, cost_s: float, step_time_s: float, every_step_s: float = 0.0) -> None:
        """A fixed interval learns nothing from costs."""

    def observe_step(self, measured_s: float, step_time_s: float) -> None:
        """Nor from step times."""

    def observe_every_step(self, every_step_s: float) -> None:
        """Nor from what every step costs."""


class AutoInterval:
    """Measures the hook's own cost and keeps it within `budget` of the step time.

    After each measured step the interval becomes ceil(cost / (budget * step time - every step)),
    with the cost (training-thread time in the hook plus the sender thread's CPU for that step)
    and what every step costs anyway (the cheap facts sent at unmeasured steps, their sending,
    and the CPU a server on the training's machine spends per stored step, which its acks say;
    the median of the last EXCESS_WINDOW figures, learnt at measured steps and whenever the
    server says a new one: learnt at measured steps only, one early figure too high would keep
    the interval at its longest, and nothing measured, for `max_interval` steps), the cost
    smoothed over recent steps, and the step time as StepTimes gives it. When every step's own
    cost takes the whole budget, the interval is the longest allowed. Step 1 is always
    measured, so the first interval is known after one step.

    The cost is also taken from the outside (observe_step): how much longer a measured step
    took than the typical one, the median of the last EXCESS_WINDOW, whenever that is more than
    the hook's own time. A median, not a running average: a pause after a measured step (an
    evaluation, a checkpoint, a stall of a shared machine) reads as that step's cost, and a
    running average (weight 0.3) of one 10 s pause on a 0.6 s step stretches the interval to
    hundreds of steps, and keeps it long (it moves only at measured steps, which it made rare):
    on the GPT of tests/bench/overhead.py, whose variant "auto" waits about 10 s for the others'
    warm-up, it measured none of 48 steps where it measures one in 2 or 3. The
    hook's clock sees neither what its reads do to the rest of the step (the training's data
    evicted from the CPU caches) nor, on a GPU, its kernels, which run after it has returned.
    (On the CPU MLP of tests/bench/overhead.py the two agree: about 3 ms a measured step.)
    """

    EXCESS_WINDOW = 5

    def __init__(self, budget: float = 0.01, max_interval: int = 1000) -> None:
        self.budget = budget
        self.max_interval = max_interval
        self.interval = 1
        self._last: Optional[int] = None
        self._cost: Optional[float] = None
        self._step_time: Optional[float] = None
        self._every_step: deque[float] = deque(maxlen=self.EXCESS_WINDOW)
        self._excesses: deque[float] = deque(maxlen=self.EXCESS_WINDOW)

    def __call__(self, step: int) -> bool:
        if self._last is not None and step < self._last + self.interval:
            return False
        self._last = step
        return True

    def observe(self, cost_s: float, step_time_s: float, every_step_s: float = 0.0) -> None:
        self._cost = cost_s if self._cost is None else 0.7 * self._cost + 0.3 * cost_s
        self._every_step.append(every_step_s)
        if step_time_s > 0:
            self._step_time = step_time_s
        self._update()

    def observe_every_step(self, every_step_s: float) -> None:
        """What every step costs, learnt between measured steps (a server's new figure)."""
        self._every_step.append(every_step_s)
        self._update()

    def observe_step(self, measured_s: float, step_time_s: float) -> None:
        """A measured step took `measured_s` of wall time where a step takes `step_time_s`."""
        self._excesses.append(max(0.0, measured_s - step_time_s))
        self._update()

    def _update(self) -> None:
        if not self._step_time or self._cost is None or not self._every_step:
            return
        cost = max(self._cost, statistics.median(self._excesses) if self._excesses else 0.0)
        room = self.budget * self._step_time - statistics.median(self._every_step)
        wanted = math.ceil(cost / room) if room > 0 else self.max_interval
        self.interval = max(1, min(self.max_interval, wanted))


class StepTimes:
    """The wall time between optimizer steps, as the median of the last `window`: the measured
    steps (slower by the hook's cost) and the first (one-time setup) do not move it. A running
    average did: on a 40 ms step it started at the 81 ms after step 1 and took 80 steps to come
    back below 55 ms, and meanwhile "auto" measured twice as often as its budget allowed."""

    def __init__(self, window: int = 15) -> None:
        self._times: deque[float] = deque(maxlen=window)
        self._last: Optional[float] = None

    def tick(self, now: float) -> None:
        """A step starts at `now` (perf_counter seconds)."""
        if self._last is not None:
            self._times.append(now - self._last)
        self._last = now

    def last(self) -> float:
        """The time between the last two steps; 0 before a second step."""
        return self._times[-1] if self._times else 0.0

    def typical(self) -> float:
        """The median of the recent step times; 0 before a second step."""
        return statistics.median(self._times) if self._times else 0.0


Sampler = Union[EveryN, AutoInterval]


def make_sampler(every: object) -> Sampler:
    """`every=N` (a whole number >= 1) or `every="auto"`; ValueError otherwise."""
    if every == "auto":
        return AutoInterval()
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(f'every must be a whole number >= 1 (sample every N-th optimizer step) or "auto"; got {every!r}')
    return EveryN(every)

"""Which optimizer steps are measured: every N-th, or as often as a cost budget allows."""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from typing import Callable, Optional, Union


class EveryN:
    """Steps 1, 1+N, 1+2N, ...; aligned (a distributed job): N, 2N, 3N, ..., the same steps on
    every rank, whichever step a rank started watching at."""

    #: whether the sampler learns from costs and step times (the cost meter skips the medians if not)
    learns = False

    def __init__(self, n: int) -> None:
        self.n = n
        self.aligned = False

    def align(self) -> None:
        """Measure the steps that are multiples of N (see `make_sampler`)."""
        self.aligned = True

    def __call__(self, step: int) -> bool:
        return step % self.n == 0 if self.aligned else (step - 1) % self.n == 0

    def revise(self, step: int, decided: bool) -> bool:
        """Whether `step` is measured, asked again (see `AutoInterval.revise`): the same answer."""
        return self(step)

    def observe(self, cost_s: float, step_time_s: float, every_step_s: float = 0.0) -> None:
        """A fixed interval learns nothing from costs."""

    def observe_step(self, measured_s: float, step_time_s: float) -> None:
        """Nor from step times."""

    def observe_every_step(self, every_step_s: float) -> None:
        """Nor from what every step costs."""


class AutoInterval:
    """Measures the hook's own cost and keeps it within `budget` of the step time.

    After each measured step the interval becomes ceil(cost / (budget * step time - every step)):
    cost is the larger of the hook's own clock (training thread plus the sender's CPU for the
    step) and the measured step's wall time beyond a typical step (the hook's clock sees neither
    its GPU kernels nor the caches it evicts); every step is what each step costs measured or not
    (server CPU included when the server is local), learnt also between measured steps. Both are
    medians of the last EXCESS_WINDOW figures, so one pause cannot stretch the interval for
    long; step 1 is always measured. Aligned (a distributed job), the interval is rounded up to a
    power of two and a step is measured iff it is a multiple of it, so ranks with different
    intervals still meet. The budget is the whole cost's, measured steps spread over the interval
    plus every step's: 0.4% of the step, so that what the estimates miss stays under 0.5%. Why:
    docs/design.md, "every="auto" budgets 0.4% of the step".
    """

    #: the default budget, a share of the step time (docs/design.md: why 0.4%)
    BUDGET = 0.004

    EXCESS_WINDOW = 5

    learns = True

    def __init__(self, budget: float = BUDGET, max_interval: int = 1000) -> None:
        self.budget = budget
        self.max_interval = max_interval
        self.interval = 1
        self.aligned = False
        self._last: Optional[int] = None
        self._before: Optional[int] = None  # `_last` before the last step that was measured
        self._cost: Optional[float] = None
        self._step_time: Optional[float] = None
        self._every_step: deque[float] = deque(maxlen=self.EXCESS_WINDOW)
        self._excesses: deque[float] = deque(maxlen=self.EXCESS_WINDOW)

    def align(self) -> None:
        """Measure the multiples of the interval rounded up to a power of two (see `make_sampler`)."""
        self.aligned = True

    def __call__(self, step: int) -> bool:
        if self.aligned:
            return step % (1 << (self.interval - 1).bit_length()) == 0
        if self._last is not None and step < self._last + self.interval:
            return False
        self._before, self._last = self._last, step
        return True

    def revise(self, step: int, decided: bool) -> bool:
        """Whether `step` is measured, asked again after the interval may have changed: the
        watcher asks about a step one round ahead (it arms its gradient hooks for it), and
        the interval learnt at the end of the round in between decides. `decided`: the answer
        the last call (about `step`) gave."""
        if decided and not self.aligned:
            self._last = self._before
        return self(step)

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
    """The wall time between optimizer steps, as the median of the last `window`: neither the
    measured steps (slower by the hook's cost) nor the first (one-time setup) may move it, or
    every="auto" would measure more often than its budget allows while it recovers."""

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
    """`every=N` (a whole number >= 1) or `every="auto"`; ValueError otherwise.

    In a distributed job each rank's sampler is `align()`ed: the ranks decide alone (no
    communication), so they must measure the same steps by their step numbers for the job's values
    at a step to be known (the server counts a step as measured when every rank measured it)."""
    if every == "auto":
        return AutoInterval()
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(
            f'every must be a whole number >= 1 (sample every N-th optimizer step) or "auto"; got {every!r}'
        )
    return EveryN(every)


class CostMeter:
    """What watching costs, told to the sampler (only `every="auto"` learns from it).

    A measured step costs the hook's training-thread time plus the sender thread's CPU to render
    it; every step, measured or not, costs the pre- and post-step hooks of an unmeasured step
    (the flight recorder's pass over the gradients included), the sender's CPU per step (sending
    included), and, for a server on this machine, the CPU its acks say it spends per stored step
    (`server_cpu`, read only when `server_here`).
    Training thread: `begin_step`, `measured`, `unmeasured`, `pre_hook`, `light_hook`. Sender
    thread: `render_began`, `render_done`.
    """

    def __init__(self, sampler: Sampler, server_here: bool, server_cpu: Callable[[], float]) -> None:
        self.sampler = sampler
        self.step_times = StepTimes()
        self._server_here = server_here
        self._server_cpu = server_cpu
        self._server_seen = 0.0  # the server's figure the sampler last learnt
        self._light_s = 0.0  # training-thread seconds of the last unmeasured step's step hooks
        self._pre_s = 0.0  # training-thread seconds of the open unmeasured round's pre-step hooks
        self._since_measured = 0  # steps since the last measured step
        self._sender_cpu = 0.0  # sender-thread CPU seconds when the last measured step's rendering began
        self._sender_step_s = 0.0  # sender-thread CPU seconds per step between the last two measured steps
        self._render_began = 0.0
        self._render_s = 0.0  # sender-thread CPU seconds to render the last measured step

    # -- training thread -------------------------------------------------------------------
    def begin_step(self, previous_measured: bool) -> None:
        """A step begins; after a measured one, the sampler learns what it cost all told (wall time)."""
        self.step_times.tick(time.perf_counter())
        if previous_measured and self.sampler.learns:
            self.sampler.observe_step(self.step_times.last(), self.step_times.typical())

    def measured(self, cost_s: Optional[float]) -> int:
        """A measured step ended, having cost `cost_s` on the training thread (None: nothing was
        measured after all). Returns the steps since the previous measured one, this one included.

        The sampler learns now, not when the sender renders this step (up to a `linger` later,
        when many steps could have been measured meanwhile)."""
        self._since_measured += 1
        steps, self._since_measured = self._since_measured, 0
        if cost_s is not None and self.sampler.learns:
            self.sampler.observe(cost_s + self._render_s, self.step_times.typical(), self.every_step_s())
        return steps

    def unmeasured(self, began: Optional[float] = None, hooks_s: Optional[float] = None) -> None:
        """An unmeasured step ended; when the server said a new figure, the sampler learns it.

        A step whose hooks all ran in one post-step hook (`Rounds._lean_after`) tells here, in
        one call, what `begin_step` and `light_hook` would: `began`, where it began in that
        hook (perf_counter), and `hooks_s`, what its hooks cost: every call is a cache miss there."""
        self._since_measured += 1
        if began is not None:
            self.step_times.tick(began)
        if hooks_s is not None:
            self._light_s, self._pre_s = hooks_s + self._pre_s, 0.0
        if self._server_here and self._server_cpu() != self._server_seen:
            self._server_seen = self._server_cpu()
            self.sampler.observe_every_step(self.every_step_s())

    def pre_hook(self, seconds: float) -> None:
        """A pre-step hook of an unmeasured step took `seconds` (the flight recorder's pass included)."""
        self._pre_s += seconds

    def light_hook(self, seconds: float) -> None:
        """The post-step hook of an unmeasured step took `seconds`: with its pre-step hooks, what
        the step's hooks cost."""
        self._light_s, self._pre_s = seconds + self._pre_s, 0.0

    def every_step_s(self) -> float:
        """What every step costs, measured or not."""
        server = self._server_cpu() if self._server_here else 0.0
        return self._light_s + self._sender_step_s + server

    # -- sender thread ---------------------------------------------------------------------
    def render_began(self, steps: int) -> float:
        """The sender starts rendering a measured step, `steps` after the previous one; returns
        the sender's CPU seconds per step since then."""
        began = time.thread_time()
        cpu, self._sender_cpu = began - self._sender_cpu, began
        self._render_began = began
        self._sender_step_s = cpu / steps if steps > 1 else 0.0
        return cpu / max(1, steps)

    def render_done(self, steps: int = 1) -> None:
        """The sender rendered `steps` measured steps together: each one's share is its cost."""
        self._render_s = (time.thread_time() - self._render_began) / max(1, steps)

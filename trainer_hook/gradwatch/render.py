"""A measured step made ready to send, on the sender thread (`StepRenderer`).

The training thread hands the sender a `Snapshot` (its norms on their way to the host) with a
`StepRenderer.render` bound to it: the sender calls it, and nothing else of the watcher, when it
serializes the step. The render waits for the copy to the host, scatters the norms into
per-parameter arrays and adds what the hook itself cost.
"""

from __future__ import annotations

import os
from typing import Optional

from .measure import Probe, Snapshot
from .sampling import CostMeter
from .wire import UnsentStep


class StepRenderer:
    """Renders a run's measured steps: its probe takes their host buffers back, its cost meter
    hears the sender thread's CPU per step."""

    def __init__(self, probe: Probe, cost: CostMeter) -> None:
        self._probe = probe
        self._cost = cost

    def render(self, snapshot: Snapshot, steps: int) -> UnsentStep:
        """The step of `snapshot`; `steps`: the steps since the previous measured one."""
        sender_cpu_s = self._cost.render_began(steps)
        metrics, status, scalars = snapshot.resolve()
        self._probe.recycle(snapshot)
        rss = _rss_bytes()
        if rss is not None:
            scalars["mem/rss_bytes"] = rss
        # The hook's own cost, so that users can see it: training-thread seconds of this step,
        # and sender-thread CPU per step since the previous measured step (sending included).
        scalars["hook/train_s"] = snapshot.cost_s
        scalars["hook/sender_cpu_s"] = sender_cpu_s
        record = UnsentStep(snapshot.step, snapshot.time, scalars, metrics, status)
        self._cost.render_done()
        return record


#: (pid, descriptor) of /proc/self/statm, kept open: a read at offset 0 is the current figure, and
#: opening the file is most of a read's cost (docs/benchmarks.md).
#: Keyed by pid: a forked child opens its own (the parent's would report the parent).
_statm: Optional[tuple[int, int]] = None
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _rss_bytes() -> Optional[float]:
    global _statm
    try:
        pid = os.getpid()
        if _statm is None or _statm[0] != pid:
            _statm = (pid, os.open("/proc/self/statm", os.O_RDONLY))
        return float(int(os.pread(_statm[1], 128, 0).split()[1]) * _PAGE)
    except (OSError, ValueError, IndexError, AttributeError):  # no /proc (macOS), or no pread (Windows)
        return None

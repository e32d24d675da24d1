"""Measured steps made ready to send, on the sender thread (`StepRenderer`).

The training thread hands the sender a `Snapshot` (its norms on their way to the host) with a
`StepRenderer.render` bound to it: the sender calls it, and nothing else of the watcher, when it
serializes the step. The render waits for the copy to the host, scatters the norms into
per-parameter arrays and adds what the hook itself cost.

The sender renders the steps it drains together (`render_many`): steps whose norms came in the
same layout (every step of a run, but for the one where a plan changed) are scattered as one
steps x parameters array per metric, so a step costs a few numpy calls shared with its batch
instead of its own tens (docs/benchmarks.md). Each step's values are those of
`Snapshot.resolve`, which renders one step alone (tests/trainer_hook/test_render.py).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Optional

import numpy as np

from .measure import Probe, Snapshot, is_absent
from .sampling import CostMeter
from .wire import (
    ABSENT_BITS,
    GRAD_STATUS_NONE,
    GRAD_STATUS_NONFINITE,
    GRAD_STATUS_NONZERO,
    GRAD_STATUS_ZERO,
    UnsentStep,
)


class StepRenderer:
    """Renders a run's measured steps: its probe takes their host buffers back, its cost meter
    hears the sender thread's CPU per step."""

    def __init__(self, probe: Probe, cost: CostMeter) -> None:
        self._probe = probe
        self._cost = cost

    def render(self, snapshot: Snapshot, steps: int) -> UnsentStep:
        """The step of `snapshot`; `steps`: the steps since the previous measured one."""
        return self.render_many([(snapshot, steps)])[0]

    def render_many(self, jobs: Sequence[tuple[Snapshot, int]]) -> list[UnsentStep]:
        """The steps of `jobs` (each a `render`'s arguments, in step order), rendered together.

        The hook's cost per step is charged as one figure for the batch: the sender thread's
        CPU per step since the previous rendering began (sending included) is the same for each
        of its steps, and each step's rendering is its share of the batch's."""
        sender_cpu_s = self._cost.render_began(sum(steps for _, steps in jobs))
        snapshots = [snapshot for snapshot, _ in jobs]
        rss = _rss_bytes()
        records: list[UnsentStep] = []
        start = 0
        while start < len(snapshots):  # runs of snapshots laid out alike
            end = start + 1
            while end < len(snapshots) and _same_layout(snapshots[start], snapshots[end]):
                end += 1
            for snapshot, (metrics, status, scalars) in zip(snapshots[start:end], _resolve(snapshots[start:end])):
                if rss is not None:
                    scalars["mem/rss_bytes"] = rss
                # The hook's own cost, so that users can see it: training-thread seconds of this
                # step, and sender-thread CPU per step since the previous rendering (sending included).
                scalars["hook/train_s"] = snapshot.cost_s
                scalars["hook/sender_cpu_s"] = sender_cpu_s
                records.append(UnsentStep(snapshot.step, snapshot.time, scalars, metrics, status))
            start = end
        for snapshot in snapshots:  # only now: the sender renders them again, one by one, if this raised
            self._probe.recycle(snapshot)
        self._cost.render_done(len(jobs))
        return records


def _same_layout(a: Snapshot, b: Snapshot) -> bool:
    """Whether `b`'s norms lie in its host buffers as `a`'s do (the same segments), with the same
    per-parameter host metrics."""
    return (
        a.num_params == b.num_params
        and len(a.buffers) == len(b.buffers)
        and all(_same_segments(x.segments, y.segments) for x, y in zip(a.buffers, b.buffers))
        and a.host_arrays().keys() == b.host_arrays().keys()
    )


Segments = list[tuple[str, Optional[np.ndarray], int]]


def _same_segments(x: Segments, y: Segments) -> bool:
    """Whether two buffers' segments are alike: a probe's plans keep their parameter index arrays
    from step to step, which the list comparison (in C) finds the same by identity; index arrays
    made anew (a step with a gradient absent) are compared by their values."""
    try:
        return x == y
    except ValueError:  # index arrays of several parameters, not the same objects: ambiguous
        return len(x) == len(y) and all(
            s[0] == t[0]
            and s[2] == t[2]
            and (s[1] is t[1] or (s[1] is not None and t[1] is not None and np.array_equal(s[1], t[1])))
            for s, t in zip(x, y)
        )


Resolved = tuple[dict[str, np.ndarray], np.ndarray, dict[str, float]]
#: the "does not apply" value (wire.ABSENT_BITS) as a float32
_ABSENT = np.array(ABSENT_BITS, dtype=np.uint32).view(np.float32)
#: id of an index array -> (the array, whether it is 0..n-1 for its probe's n parameters); the
#: array is held so that its id is not another's (a probe keeps its plans' few arrays)
_ORDERED: dict[int, tuple[np.ndarray, bool]] = {}


def _in_order(index: np.ndarray, n: int) -> bool:
    """Whether `index` is every parameter in order (the gradients and states of a one-optimizer
    run), remembered per array."""
    known = _ORDERED.get(id(index))
    if known is None or known[0] is not index:
        if len(_ORDERED) >= 256:  # arrays made anew per step (a gradient absent): forget them
            _ORDERED.clear()
        known = _ORDERED[id(index)] = (index, len(index) == n and bool(np.array_equal(index, np.arange(n))))
    return known[1]


def _resolve(snapshots: Sequence[Snapshot]) -> list[Resolved]:
    """`Snapshot.resolve` of each of `snapshots` (laid out alike: `_same_layout`), computed as
    one steps x parameters array per metric; each step's arrays are rows of those."""
    first, n, p = snapshots[0], len(snapshots), snapshots[0].num_params
    # each metric's array; a segment of every parameter in order is the host copy's columns as
    # they are (no absent values to fill, no scatter)
    metrics: dict[str, Optional[np.ndarray]] = {"grad_norm": None}
    scalars: list[dict[str, Any]] = [dict(s.scalars) for s in snapshots]
    for b, buf in enumerate(first.buffers):
        for s in snapshots:
            event = s.buffers[b].event
            if event is not None:
                event.synchronize()
        host = np.array([s.buffers[b].host.numpy() for s in snapshots])  # a copy: the buffers go back to the probe
        offset = 0
        for metric, index, count in buf.segments:
            chunk = host[:, offset : offset + count]
            offset += count
            if index is None:
                for row, values in zip(scalars, chunk[:, 0].tolist()):
                    row[metric] = values
                continue
            values = metrics.get(metric)
            if values is None and _in_order(index, p):
                metrics[metric] = chunk
                continue
            if values is None:
                values = metrics[metric] = np.full((n, p), _ABSENT, dtype=np.float32)
            values[:, index] = chunk
    for name in first.host_arrays():
        values = _rows([s.host_arrays()[name] for s in snapshots])
        metrics[name] = np.where(np.isnan(values), _ABSENT, values).astype(np.float32, copy=False)
    grad_norm = metrics["grad_norm"]
    if grad_norm is None:
        grad_norm = metrics["grad_norm"] = np.full((n, p), _ABSENT, dtype=np.float32)
    status = np.full(grad_norm.shape, GRAD_STATUS_NONZERO, dtype=np.uint8)
    status[grad_norm == 0] = GRAD_STATUS_ZERO
    status[~np.isfinite(grad_norm)] = GRAD_STATUS_NONFINITE
    none = is_absent(grad_norm)
    status[none] = GRAD_STATUS_NONE
    grad_bytes = _rows([s.grad_bytes for s in snapshots])
    all_bytes = grad_bytes.sum(axis=1).tolist()
    zero_bytes = np.where(status == GRAD_STATUS_ZERO, grad_bytes, 0).sum(axis=1).tolist()
    # the total norm sums exactly the values `Snapshot.resolve` sums, in their order: a row with
    # an absent gradient sums its present ones alone (pairwise summation of another length
    # could round differently)
    grads = grad_norm.astype(np.float64)
    totals = np.sqrt(np.sum(grads * grads, axis=1)).tolist()
    for k in np.flatnonzero(none.any(axis=1)).tolist():
        present = grads[k][~none[k]]
        totals[k] = float(np.sqrt(np.sum(present * present)))
    columns = {name: values for name, values in metrics.items() if values is not None}  # all of them
    names = list(columns)
    out: list[Resolved] = []
    # each step's arrays: rows of the batch's (`list` makes the row views in C)
    for row, arrays, status_row, total, nbytes, zero in zip(
        scalars, zip(*map(list, columns.values())), list(status), totals, all_bytes, zero_bytes
    ):
        row["grad_norm_total"] = total
        row["mem/grads_bytes"] = float(nbytes)
        row["mem/zero_grad_bytes"] = float(zero)
        out.append((dict(zip(names, arrays)), status_row, row))
    return out


def _rows(arrays: list[np.ndarray]) -> np.ndarray:
    """`arrays` (of one shape) as the rows of one array (a view of a lone one; `np.stack` costs
    three times `np.array` here)."""
    return arrays[0][None] if len(arrays) == 1 else np.array(arrays)


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

"""The flight recorder: with `every=N` (N > 1) or `every="auto"`, an incident between two
measured steps (a gradient-norm spike, a non-finite gradient, a loss spike) is not lost.

Training thread, at each step that is not measured (`record`): every parameter's gradient norm,
as the step uses it, in one fused call per device, written into a small ring buffer ON THE
DEVICE (`size` rows of one float per parameter). Nothing is copied to the host there. The steps'
cheap facts are held meanwhile (`hold`); when `size` steps are held, or HOLD_S seconds have
passed since the first, or a measured step comes, the rows of the held steps are copied to the
host in one copy (on CUDA into pinned memory with `non_blocking` and an event: the training
thread never waits) and the held steps go to the sender (`flush`).

Sender thread (`FlightBatch.render`): the rows are scored against each parameter's and the total's
own recent history (the server's spike score, spikes.py: log value against the median of the last
WINDOW values in units of 1.4826 x MAD) and a loss logged with
the step against the recent losses; around a step that scores as a spike (Z and RATIO as the
server's grad_norm_spike, a loss LOSS_RATIO above its median) or holds a non-finite norm, the steps
from BEFORE before it to AFTER after it are sent with their `grad_norm` (full resolution), the
others with their cheap facts only, as without the recorder. The server stores and diagnoses those
steps as measured ones. The window crosses flushes: the last BEFORE steps sent without their norms
are kept on the host (their rows were copied with their batch: no device work), and those an
incident of a later batch reaches are sent again with their `grad_norm` and the scalar RESENT,
which tells a server to add the norms to the steps it stored (docs/protocol.md; an older server
skips them as steps already stored).

Cost: one fused norm pass over the gradients per unmeasured step, and one copy of at most `size`
rows per flush (docs/benchmarks.md). Only whole tensors are recorded (no DTensor or FSDP piece).
"""

from __future__ import annotations

import math
import operator
import time
import warnings
from collections import deque
from collections.abc import Callable, Sequence
from itertools import repeat
from typing import Any, Optional

import numpy as np
import torch

from .measure import NormPlan, fused_norms, norm_plan, norm_preps
from .wire import ABSENT_BITS, UnsentStep

#: The longest the cheap facts of unmeasured steps are held for the recorder (the spool's pace).
HOLD_S = 1.0
#: Steps sent at full resolution before and after a recorded incident.
BEFORE, AFTER = 8, 8
#: The spike score (as the server's grad_norm_spike: docs/diagnostics.md).
WINDOW, WARMUP, Z, RATIO = 128, 20, 6.0, 3.0
LOSS_RATIO = 2.0
MAD_SIGMA = 1.4826
#: The scalar of a step sent again with the norms the recorder kept (docs/protocol.md).
RESENT = "flight/resent"

_GRAD = operator.attrgetter("grad")
_IS_SPARSE = operator.attrgetter("is_sparse")


class _History:
    """Recent log values of a few series (the sender thread's, for the incident test).

    A spike needs a value at least `ratio_min` times its series' median, and a median is at least
    the window's smallest value: only the series at least `ratio_min` times their smallest kept
    value (few, most steps none) get their median and spread made. Those (a sort of the window per
    series) were the sender thread's largest cost per step at hundreds of tensors, and on a GPU
    the training thread waited for their GIL; the figures are the same as from all the medians."""

    def __init__(self, count: int) -> None:
        self.values: deque[np.ndarray] = deque(maxlen=WINDOW)
        self.count = count

    def spike(self, row: np.ndarray, ratio_min: float) -> Optional[tuple[np.ndarray, np.ndarray]]:
        """(score, ratio to the median) per series when `row` holds a spike against the kept
        rows, else None; then keeps `row`."""
        with np.errstate(divide="ignore", invalid="ignore"):
            logs = np.log(row)
        found = None
        if len(self.values) >= WARMUP:
            kept = np.array(self.values)
            with np.errstate(invalid="ignore"):
                # a margin far above the rounding of a log keeps a value at the bound a candidate
                maybe = logs - np.fmin.reduce(kept, axis=0) >= math.log(ratio_min) - 1e-9
            if maybe.any() and _scored(kept[:, maybe], logs[maybe], ratio_min) is not None:
                found = _scored(kept, logs, ratio_min)
        self.values.append(np.where(np.isfinite(logs), logs, np.nan))
        return found


def _scored(kept: np.ndarray, logs: np.ndarray, ratio_min: float) -> Optional[tuple[np.ndarray, np.ndarray]]:
    """(score, ratio to the median) of `logs` against the columns of `kept` (NaNs left out) when
    one of them is a spike, else None."""
    with np.errstate(divide="ignore", invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN column: no .grad yet
        if np.isnan(kept).any():
            median = np.nanmedian(kept, axis=0)
            spread = np.nanmedian(np.abs(kept - median), axis=0) * MAD_SIGMA
        else:  # np.median: several times faster than nanmedian
            median = np.median(kept, axis=0)
            spread = np.median(np.abs(kept - median), axis=0) * MAD_SIGMA
        z = np.where(spread > 0, (logs - median) / spread, np.where(logs > median, np.inf, 0.0))
        ratio = np.exp(logs - median)
        return (z, ratio) if np.any((z >= Z) & (ratio >= ratio_min)) else None


class FlightRecorder:
    """The ring buffer of recent per-parameter gradient norms, per device, and the held steps."""

    def __init__(
        self,
        params: Sequence[torch.Tensor],
        recorded: Sequence[bool],
        inverse_scale: Callable[[torch.device], Optional[torch.Tensor]],
        size: int = 64,
    ) -> None:
        self.params = list(params)
        self.size = size
        self._inverse_scale = inverse_scale
        self._by_device: dict[torch.device, list[int]] = {}
        for i, (p, keep) in enumerate(zip(self.params, recorded)):
            if keep:
                self._by_device.setdefault(p.device, []).append(i)
        self._on_device = {d: [self.params[i] for i in idx] for d, idx in self._by_device.items()}
        # a .grad has its parameter's dtype, device and size (torch enforces them): where no
        # parameter needs a prep, the parameters' plan is their gradients' (`NormPlan`)
        self._plan: dict[torch.device, Optional[NormPlan]] = {
            d: None if any(norm_preps(ps)) else norm_plan(ps) for d, ps in self._on_device.items()
        }
        self._rings = {d: torch.full((size, len(idx)), math.nan, device=d) for d, idx in self._by_device.items()}
        self._slot_of: dict[int, int] = {}  # step -> its ring row
        self._absent: dict[int, list[int]] = {}  # step -> the parameters that had no .grad (host-side)
        self._next = 0
        self.held: list[tuple[int, Callable[[], UnsentStep]]] = []
        self._held_since = 0.0
        # sender thread: the incident test's state, and how many more steps go at full resolution
        self._grads = _History(len(self.params) + 1)
        self._losses = _History(1)
        self._after = 0
        #: the last BEFORE steps sent without their norms, with them (for an incident of a later batch)
        self._unsent: deque[tuple[UnsentStep, tuple[np.ndarray, np.ndarray]]] = deque(maxlen=BEFORE)

    # -- training thread -------------------------------------------------------------------
    @torch.no_grad()
    def record(self, step: int) -> None:
        """Write `step`'s gradient norms into the next ring row (device work only)."""
        slot = self._next
        self._next = (slot + 1) % self.size
        absent: list[int] = []
        for device, idx in self._by_device.items():
            row = self._rings[device][slot]
            grads = list(map(_GRAD, self._on_device[device]))
            if all(map(operator.is_not, grads, repeat(None))) and not any(map(_IS_SPARSE, grads)):
                norms = fused_norms(grads, self._plan[device])
                present = None
            else:
                present = [k for k, g in enumerate(grads) if g is not None and not g.is_sparse]
                absent.extend(idx[k] for k, g in enumerate(grads) if g is None or g.is_sparse)
                row.fill_(math.nan)
                if not present:
                    continue
                norms = fused_norms([grads[k] for k in present])
            scale = self._inverse_scale(device)
            if scale is not None:
                norms = norms * scale
            if present is None:
                row.copy_(norms)
            else:  # views of the row, not an index tensor: building one on the device would sync
                torch._foreach_copy_([row[k] for k in present], list(norms.unbind()))
        for old in [s for s, k in self._slot_of.items() if k == slot]:
            del self._slot_of[old]
            self._absent.pop(old, None)
        self._slot_of[step] = slot
        self._absent[step] = absent

    def hold(self, step: int, make: Callable[[], UnsentStep]) -> bool:
        """Hold an unmeasured step's record; whether it is time to `flush`."""
        if not self.held:
            self._held_since = time.monotonic()
        self.held.append((step, make))
        return len(self.held) >= self.size or time.monotonic() - self._held_since >= HOLD_S

    @torch.no_grad()
    def flush(self) -> Optional[FlightBatch]:
        """The held steps and one copy of their rows to the host; None when nothing is held."""
        if not self.held:
            return None
        held, self.held = self.held, []
        slots = [self._slot_of.get(step) for step, _ in held]
        copies: list[tuple[list[int], torch.Tensor, Any]] = []
        for device, idx in self._by_device.items():
            # the whole ring, its held rows picked on the host: an index tensor made on the
            # device from host numbers would be a synchronising copy (a ring is `size` x the
            # parameters in float32: 180 kB at 700 tensors)
            ring = self._rings[device]
            if device.type == "cpu":
                copies.append((idx, ring.clone(), None))
                continue
            host = torch.empty(ring.shape, dtype=ring.dtype, pin_memory=True)
            with torch.cuda.device(device):
                host.copy_(ring, non_blocking=True)
                event = torch.cuda.Event()
                event.record()
            copies.append((idx, host, event))
        absent = [self._absent.get(step, []) for step, _ in held]
        return FlightBatch(self, held, slots, absent, copies)

    # -- sender thread ---------------------------------------------------------------------
    def judge(self, steps: list[tuple[UnsentStep, Optional[tuple[np.ndarray, np.ndarray]]]]) -> list[UnsentStep]:
        """The held steps' records in order, each with its norms where it lies near an incident
        (the BEFORE steps before it, AFTER after it, into the next batches); first, the steps
        before an incident that earlier batches sent without their norms, again with them (RESENT)."""
        full = [False] * len(steps)
        out = []
        resent: list[UnsentStep] = []
        for k, (record, norms) in enumerate(steps):
            if self._after > 0:
                full[k] = True
                self._after -= 1
            incident, record = self._incident(record, norms)
            out.append(record)
            if incident:
                first = record.step - BEFORE
                for j in range(k, -1, -1):
                    if steps[j][0].step < first:
                        break
                    full[j] = True
                earlier = [(r, n) for r, n in self._unsent if r.step >= first]
                resent += [with_norms(r, n, resent=True) for r, n in earlier]
                self._unsent = deque([(r, n) for r, n in self._unsent if r.step < first], maxlen=BEFORE)
                self._after = AFTER
        for keep, record, (_, norms) in zip(full, out, steps):
            if not keep and norms is not None:
                self._unsent.append((record, norms))
        return resent + [
            with_norms(record, norms if keep else None) for keep, record, (_, norms) in zip(full, out, steps)
        ]

    def _incident(
        self, record: UnsentStep, recorded: Optional[tuple[np.ndarray, np.ndarray]]
    ) -> tuple[bool, UnsentStep]:
        """Whether the step holds a spike of a parameter's or the total gradient norm, a non-finite
        norm, or a loss spike; and its record, with the spike's scores where there was one (the
        server has too few measured steps to score it itself: `spike_z`, `spike_ratio` per
        parameter, `flight/total_z`, `flight/total_ratio`)."""
        incident = False
        if recorded is not None:
            norms, missing = recorded
            norms = np.where(missing, np.nan, norms)
            known = norms[np.isfinite(norms)].astype(np.float64)
            total = float(np.sqrt(np.sum(known * known))) if known.size else math.nan
            incident = bool(np.any(~np.isfinite(norms) & ~missing))
            spike = self._grads.spike(np.append(norms, total).astype(np.float64), RATIO)
            if spike is not None:
                z, ratio = spike
                incident = True
                scalars = {**record.scalars, "flight/total_z": float(z[-1]), "flight/total_ratio": float(ratio[-1])}
                metrics = {
                    **record.metrics,
                    "spike_z": np.minimum(z[:-1], 1e30).astype(np.float32),
                    "spike_ratio": ratio[:-1].astype(np.float32),
                }
                record = UnsentStep(record.step, record.time, scalars, metrics, record.grad_status)
        loss = record.scalars.get("loss")
        if loss is not None and math.isfinite(loss) and loss > 0:
            incident = self._losses.spike(np.array([loss]), LOSS_RATIO) is not None or incident
        return incident or (loss is not None and not math.isfinite(loss)), record


class FlightBatch:
    """Held steps and the host copy of the ring, rendered on the sender thread."""

    def __init__(
        self,
        recorder: FlightRecorder,
        held: list[tuple[int, Callable[[], UnsentStep]]],
        slots: list[Optional[int]],
        absent: list[list[int]],
        copies: list[tuple[list[int], torch.Tensor, Any]],
    ) -> None:
        self.recorder = recorder
        self.held = held
        self.slots = slots  # each held step's ring row; None where it was not recorded
        self.absent = absent
        self.copies = copies

    def render(self) -> list[UnsentStep]:
        """The held steps' records, in order (sender thread)."""
        n = len(self.recorder.params)
        rows = np.full((len(self.held), n), np.nan, dtype=np.float32)
        taken = [s if s is not None else 0 for s in self.slots]
        for idx, host, event in self.copies:
            if event is not None:
                event.synchronize()
            rows[:, idx] = host.numpy()[taken]
        missing = np.zeros(rows.shape, dtype=bool)
        for k, absent in enumerate(self.absent):
            missing[k, absent] = True
        steps = [
            (make(), (rows[k], missing[k]) if self.slots[k] is not None else None)
            for k, (_, make) in enumerate(self.held)
        ]
        return self.recorder.judge(steps)


def with_norms(
    record: UnsentStep, recorded: Optional[tuple[np.ndarray, np.ndarray]], resent: bool = False
) -> UnsentStep:
    """`record` with the recorded `grad_norm` of each parameter (ABSENT where it had no .grad);
    `resent`: marked as a step sent before without them (RESENT)."""
    if recorded is None:
        return record
    norms, missing = recorded
    values = np.where(missing, np.array([ABSENT_BITS], dtype=np.uint32).view(np.float32)[0], norms)
    scalars = {**record.scalars, RESENT: 1.0} if resent else record.scalars
    return UnsentStep(
        record.step, record.time, scalars, {**record.metrics, "grad_norm": values.astype(np.float32)}, None
    )

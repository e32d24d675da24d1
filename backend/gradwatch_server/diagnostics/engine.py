"""The diagnostics engine: runs every check over each run's steps and keeps the findings.

`RunDiagnosis` is the state of one run: its checks, fed each step once, in order.
`Diagnostics` holds them for the server. Ingest calls `observe` after each committed batch, so
findings follow a live run within a step; the changed ones are stored at once (store/findings.py), with a
mark saying how many steps they cover. A run the server holds no state for (after a restart,
or an imported run) is diagnosed again from its stored steps when it is resumed or its findings
are asked for; a finished run whose stored findings are current is answered from the store.

The flight recorder's late norms (steps judged unmeasured that get their `grad_norm` later) are
judged exactly at a cost independent of the run's length: a run's diagnosis keeps copies of its
checks' state every `SNAPSHOT_EVERY` judged steps (the last `SNAPSHOTS`), and a batch that resends
steps rewinds to the copy before its earliest step and replays the stored steps from there
(`Diagnostics.judge_late`), as a diagnosis derived from the start would have judged them.

Cost: the checks are vectorised over parameters and run in a worker thread; the consecutive
measured steps of a batch are judged at once (`RunDiagnosis.observe_records`, `StepBatch`): each
check either proves over the whole batch that a step by step judgement would change nothing but
what it updates at once, or judges them step by step (docs/design.md, docs/benchmarks.md).
"""

from __future__ import annotations

import collections
import copy
import functools
import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..jobs.assemble import DESYNC_PREFIX
from ..store import DiagnosisMark, StepData, Store, StoredFinding, UnknownRun
from .amp import AmpSkippedSteps
from .check import Check
from .clearing import GradAccumulation, UnclearedGradients, ZeroFilledGradBuffers
from .coverage import ParamNeverGetsGrad, ParamNotInOptimizer, StepWithoutGrad
from .data import METRICS, SCALARS, RunContext, StepBatch, StepView
from .finding import Finding
from .ranks import RankDesync
from .spikes import AdamEpsilonRegime, GradNormSpike, LargeUpdate, LossSpike
from .values import ExplodingGrad, NonfiniteGrad, VanishingGrad

log = logging.getLogger("gradwatch.diagnostics")

#: Bump when a check changes what it finds: stored findings of an older version are derived again.
RULES_VERSION = 2

#: Every check, one per finding code (docs/diagnostics.md).
CHECKS: tuple[type[Check], ...] = (
    UnclearedGradients,
    GradAccumulation,
    ZeroFilledGradBuffers,
    ParamNotInOptimizer,
    ParamNeverGetsGrad,
    StepWithoutGrad,
    NonfiniteGrad,
    AmpSkippedSteps,
    ExplodingGrad,
    VanishingGrad,
    RankDesync,
    GradNormSpike,
    LargeUpdate,
    AdamEpsilonRegime,
    LossSpike,
)


@dataclass(frozen=True)
class _Snapshot:
    """A run's checks as they were after judging its steps up to `last_step` (None: none yet)."""

    checks: list[Check]
    steps: int
    last_step: int | None


class RunDiagnosis:
    """One run's checks and findings. Not thread-safe: `Diagnostics` serialises access per run.

    With `snapshots`, a copy of the checks' state is kept every `SNAPSHOT_EVERY` judged steps, the
    last `SNAPSHOTS` of them (the start's until they replace it), so that `rewind` can go back
    before a step whose values came late. The flight recorder resends at most 8 steps back
    (recorder.BEFORE); the kept copies reach at least (SNAPSHOTS - 1) x SNAPSHOT_EVERY = 64 judged
    steps back, and a replay from them is at most SNAPSHOTS x SNAPSHOT_EVERY steps plus the batch's.
    Their cost: a copy of the checks' state (about 3 KB per parameter) every SNAPSHOT_EVERY steps,
    SNAPSHOTS of them held per run (docs/benchmarks.md, issue 25).
    """

    SNAPSHOT_EVERY = 64
    SNAPSHOTS = 2

    def __init__(self, context: RunContext, checks: Iterable[type[Check]] = CHECKS, *, snapshots: bool = True) -> None:
        self.context = context
        self.checks = [cls() for cls in checks]
        self.steps = 0  # steps offered (each stored step once)
        self.last_step: int | None = None
        self.saved: dict[str, Finding] = {}  # findings as last stored (Diagnostics keeps this)
        self._snapshots: collections.deque[_Snapshot] | None = (
            collections.deque(maxlen=self.SNAPSHOTS) if snapshots else None
        )
        self._since = 0  # steps judged since the last snapshot
        #: the latest snapshot's copy of each live check (by id), and the checks called since:
        #: a check no step reached since (most, over unmeasured steps) is the same as its copy
        self._copies: dict[int, Check] = {}
        self._called: set[int] = set()
        for check in list(self.checks):
            self._run(check, lambda c: c.start(context))
        self._snap()

    def observe(self, step: StepView, measured: bool = True) -> None:
        """Feed one step; a step not after the last one seen is counted but not judged."""
        self.steps += 1
        if self.last_step is not None and step.step <= self.last_step:
            return
        self.last_step = step.step
        if measured:
            for check in list(self.checks):
                self._run(check, lambda c: c.observe(self.context, step))
        else:  # only the checks that look at unmeasured steps: the others' call does nothing
            for check in [c for c in self.checks if _sees_unmeasured(type(c))]:
                self._run(check, lambda c: c.observe_unmeasured(self.context, step))
        self._since += 1
        if self._since >= self.SNAPSHOT_EVERY:
            self._snap()

    def _snap(self) -> None:
        """A snapshot of the checks: a copy of each that was called since the last one, the
        last one's copy of the others (never changed after it is made: `rewind` copies it)."""
        self._since = 0
        if self._snapshots is None:
            return
        memo: dict[int, object] = {}  # one deepcopy's memo: what the checks share, copied once
        copies = {}
        for check in self.checks:
            held = self._copies.get(id(check))
            copies[id(check)] = (
                held if held is not None and id(check) not in self._called else copy.deepcopy(check, memo)
            )
        self._copies, self._called = copies, set()
        self._snapshots.append(_Snapshot([copies[id(c)] for c in self.checks], self.steps, self.last_step))

    def rewind(self, before: int) -> bool:
        """Go back to the state before step `before` (from the latest snapshot that is before it,
        whose later steps the caller feeds again); False, and the state unchanged, if no kept
        snapshot is that early. Nothing judged at or after `before`: nothing to do."""
        if self.last_step is None or before > self.last_step:
            return True
        kept = self._snapshots
        if not kept:
            return False
        ok = [i for i, s in enumerate(kept) if s.last_step is None or s.last_step < before]
        if not ok:
            return False
        for _ in range(len(kept) - 1 - ok[-1]):  # later copies hold the steps to judge again
            kept.pop()
        point = kept[-1]
        self.checks = copy.deepcopy(point.checks)  # the copy stays, for a later rewind to it
        self._copies = {id(live): held for live, held in zip(self.checks, point.checks)}
        self._called = set()
        self.steps, self.last_step, self._since = point.steps, point.last_step, 0
        return True

    def observe_data(self, data: StepData) -> None:
        self.observe_record(data.step, data.scalars, data.arrays)

    def observe_records(
        self, records: Sequence[tuple[int, Mapping[str, float], Mapping[str, bytes | np.ndarray]]]
    ) -> None:
        """`observe_record` of each (step, scalars, arrays) in turn, to the same state and
        findings: runs of consecutive measured steps (each after the last judged, none past the
        next snapshot) are decoded and judged as one `StepBatch` (`Check.observe_batch`), the
        other steps one by one."""
        count, i = len(self.context.params), 0
        while i < len(records):
            j, last = i, self.last_step
            room = self.SNAPSHOT_EVERY - self._since  # a snapshot falls after a batch, never inside
            while j < len(records) and j - i < room and "grad_norm" in records[j][2]:
                if last is not None and records[j][0] <= last:
                    break
                last = records[j][0]
                j += 1
            if j == i:
                j = self._observe_unmeasured(records, i)
                if j > i:
                    i = j
                    continue
            batch = StepBatch.decode(records[i:j], count) if j - i > 1 else None
            if batch is None:
                self.observe_record(*records[i])
                i += 1
                continue
            self.steps += len(batch)
            self.last_step = batch.views[-1].step
            judge = functools.partial(_judge_batch, self.context, batch)
            for check in list(self.checks):
                self._run(check, judge)
            self._since += len(batch)
            if self._since >= self.SNAPSHOT_EVERY:
                self._snap()
            i = j

    def _observe_unmeasured(
        self, records: Sequence[tuple[int, Mapping[str, float], Mapping[str, bytes | np.ndarray]]], i: int
    ) -> int:
        """Judge the run of consecutive unmeasured steps from `records[i]` (each after the last
        judged, none past the next snapshot) at once, to the state and findings `observe_record`
        of each would give; the index after them (`i` where there are fewer than two). A batch of
        the hook's unmeasured steps costs the checks nothing when none looks at unmeasured steps,
        and otherwise one `observe_unmeasured_batch` call each: per step, Python costs more than
        their work (docs/benchmarks.md)."""
        j, last = i, self.last_step
        room = self.SNAPSHOT_EVERY - self._since
        while j < len(records) and j - i < room and "grad_norm" not in records[j][2]:
            if last is not None and records[j][0] <= last:
                break
            last = records[j][0]
            j += 1
        if j - i < 2:
            return i
        seeing = [c for c in self.checks if _sees_unmeasured(type(c))]
        if seeing:
            steps = [(r[0], r[1]) for r in records[i:j]]
            for check in seeing:
                self._run(check, lambda c: c.observe_unmeasured_batch(self.context, steps))
        self.steps += j - i
        self.last_step = last
        self._since += j - i
        if self._since >= self.SNAPSHOT_EVERY:
            self._snap()
        return j

    def observe_record(self, step: int, scalars: Mapping[str, float], arrays: Mapping[str, bytes | np.ndarray]) -> None:
        """A stored or ingested step; one the hook did not measure (cheap facts only: no
        `grad_norm`) is seen by the checks as scalars only."""
        count = len(self.context.params)
        if "grad_norm" not in arrays:
            self.observe(StepView.unmeasured(step, scalars, count), measured=False)
        else:
            self.observe(StepView.of(step, scalars, arrays, count))

    def findings(self) -> list[Finding]:
        """Current findings, in the order they began."""
        found = [c.finding for c in self.checks if c.finding is not None]
        return sorted(found, key=lambda f: (f.first_step is not None, f.first_step or 0, f.code))

    def _run(self, check: Check, call: Callable[[Check], None]) -> None:
        self._called.add(id(check))
        try:
            call(check)
        except Exception:  # a broken check must not stop ingest nor the other checks
            log.exception("diagnostics: check %s failed; it is off for this run", check.code)
            self.checks.remove(check)


def _sees_unmeasured(cls: type[Check]) -> bool:
    """Whether a check's class judges unmeasured steps (Check.observe_unmeasured does nothing)."""
    return cls.observe_unmeasured is not Check.observe_unmeasured


def _judge_batch(context: RunContext, batch: StepBatch, check: Check) -> None:
    check.observe_batch(context, batch)


def _stored(f: Finding) -> StoredFinding:
    return StoredFinding(
        code=f.code,
        severity=f.severity,
        message=f.message,
        params=list(f.params),
        first_step=f.first_step,
        figure=None if f.figure is None else f.figure.to_dict(),
    )


def _from_stored(f: StoredFinding) -> Finding:
    return Finding.from_dict(
        {
            "code": f.code,
            "severity": f.severity,
            "message": f.message,
            "params": f.params,
            "first_step": f.first_step,
            "figure": f.figure,
        }
    )


class Diagnostics:
    """The findings of every run on a store. Thread-safe (ingest calls it from worker threads).

    Live state is kept for at most `max_runs` runs (least recently used go first; a run that
    comes back is diagnosed again from the store).

    `sole_writer=False` (`gradwatch serve --workers N`: several processes on one database): the
    findings of a running run are stored only by the process that holds its hook, since another
    worker's reads may be behind it and would overwrite newer findings with older ones; reads of
    a running run elsewhere are derived but not stored, and a run's findings are stored whole
    when it closes. A hook that moves between workers is caught up from the store (`open_run`).
    """

    def __init__(self, store: Store, max_runs: int = 64, *, sole_writer: bool = True) -> None:
        self.store = store
        self.max_runs = max_runs
        self.sole_writer = sole_writer
        self._runs: collections.OrderedDict[str, RunDiagnosis] = collections.OrderedDict()
        self._locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()

    # -- ingest ------------------------------------------------------------------------------

    def open_run(self, run_id: str, stored_steps: int | None = None) -> list[Finding]:
        """A hook connected for this run: have its state ready; its current findings.

        `stored_steps` is the run's stored step count: state held from earlier that is behind it
        (another process stored steps meanwhile, e.g. the worker that held the hook before) is
        caught up from the store first."""
        with self._run_lock(run_id):
            diag = self._ensure(run_id)
            if stored_steps is not None and stored_steps > diag.steps:
                self._catch_up(run_id, diag)
            return diag.findings()

    def observe(self, run_id: str, steps: Sequence[StepData], stored_before: int | None = None) -> list[Finding]:
        """Judge newly stored steps; store what changed; the run's current findings.

        `stored_before` is the run's stored step count before these: state held from earlier that
        is behind it (another worker stored steps meanwhile: a distributed job's run, whose ranks
        may stream to several) is caught up from the store first."""
        with self._run_lock(run_id):
            diag = self._ensure(run_id, replayed=steps)
            if stored_before is not None and diag.steps < stored_before:
                self._feed(run_id, diag, after=diag.last_step, skip={d.step for d in steps})
            diag.observe_records([(data.step, data.scalars, data.arrays) for data in steps])
            self._save(run_id, diag, mark=False)
            return diag.findings()

    def judge_late(self, run_id: str, earliest: int) -> list[Finding] | None:
        """Steps from `earliest` on got values late (the flight recorder's window before an
        incident, protocol.RESENT, whose norms the store added to steps first judged unmeasured),
        and the batch that brought them is stored: the checks keep windows and medians in step
        order and cannot take a step before their last one, so the run's diagnosis goes back to
        its snapshot before `earliest` and judges the stored steps from there again (and the
        batch's new ones), exactly as a diagnosis from the start would; the changed findings are
        stored; the run's current findings. None, with nothing changed, where the kept snapshots
        do not reach back to `earliest` (the caller has the run judged again whole: `rejudge`)."""
        with self._run_lock(run_id):
            with self._lock:
                held = self._runs.get(run_id)
            diag = self._ensure(run_id)  # none held: rebuilt from the store, late values and all
            if held is not None and not diag.rewind(earliest):
                return None
            try:
                self._feed(run_id, diag, after=diag.last_step, skip=set())
            except Exception:  # rewound but not caught up: derived again from the store next time
                self.forget(run_id)
                raise
            self._save(run_id, diag, mark=False)
            return diag.findings()

    def rejudge(self, run_id: str) -> list[Finding]:
        """The run diagnosed again whole from its stored steps, as a resumed run is (late values
        that `judge_late` cannot reach); the changed findings are stored; its current findings."""
        with self._run_lock(run_id):
            with self._lock:
                held = self._runs.get(run_id)
            diag = self._rebuild(run_id, save=False, snapshots=True)
            diag.saved = {} if held is None else held.saved
            self._keep(run_id, diag)
            self._save(run_id, diag, mark=False)
            return diag.findings()

    def close_run(self, run_id: str) -> None:
        """The run ended: record how far its findings go, and let its state go."""
        with self._run_lock(run_id):
            with self._lock:
                diag = self._runs.pop(run_id, None)
            if diag is not None:
                self._save(run_id, diag, replace=not self.sole_writer)

    def forget(self, run_id: str) -> None:
        """The run was deleted."""
        with self._lock:
            self._runs.pop(run_id, None)

    def current(self, run_id: str) -> list[Finding]:
        """The findings held in memory for a run (none if the server holds no state for it)."""
        with self._lock:
            diag = self._runs.get(run_id)
        return [] if diag is None else diag.findings()

    # -- reads -------------------------------------------------------------------------------

    def findings(self, run_id: str, *, steps: int, running: bool) -> list[Finding]:
        """A run's findings (`steps`: its stored step count), derived again if the store's are stale."""
        with self._run_lock(run_id):
            with self._lock:
                diag = self._runs.get(run_id)
            store = self.sole_writer or not running  # else its hook's worker stores them
            if diag is not None:
                if steps > diag.steps:  # written by another process (e.g. an import): catch up
                    self._catch_up(run_id, diag, save=store)
                return diag.findings()
            mark = self.store.get_diagnosis(run_id)
            if mark is not None and mark.version == RULES_VERSION and mark.steps >= steps:
                return [_from_stored(f) for f in self.store.get_findings(run_id)]
            diag = self._rebuild(run_id, save=store)
            if running:
                self._keep(run_id, diag)
            return diag.findings()

    # -- state -------------------------------------------------------------------------------

    def _run_lock(self, run_id: str) -> threading.Lock:
        with self._lock:
            return self._locks.setdefault(run_id, threading.Lock())

    def _ensure(self, run_id: str, replayed: Sequence[StepData] = ()) -> RunDiagnosis:
        """The run's state, rebuilt from the store if the server holds none."""
        with self._lock:
            diag = self._runs.get(run_id)
            if diag is not None:
                self._runs.move_to_end(run_id)
                return diag
        diag = self._rebuild(run_id, skip={d.step for d in replayed})
        self._keep(run_id, diag)
        return diag

    def _keep(self, run_id: str, diag: RunDiagnosis) -> None:
        with self._lock:
            self._runs[run_id] = diag
            self._runs.move_to_end(run_id)
            while len(self._runs) > self.max_runs:
                self._runs.popitem(last=False)  # its lock stays: another thread may hold it

    def _rebuild(
        self, run_id: str, skip: set[int] | None = None, *, save: bool = True, snapshots: bool | None = None
    ) -> RunDiagnosis:
        """Diagnose a run afresh from its stored steps (leaving out `skip`, which the caller feeds).
        Snapshots for `judge_late` are kept unless the hook says its flight recorder is off (a
        run that resends steps all the same gets them from its first `rejudge`), or the run is a
        distributed job's (its assembly does not judge late values)."""
        run = self.store.get_run(run_id)
        if run is None:
            raise UnknownRun(f"no run {run_id!r}")
        params = self.store.get_params(run_id)
        if snapshots is None:
            snapshots = run.kind == "run" and run.config.get("flight_recorder") is not False
        diag = RunDiagnosis(
            RunContext.of([(p.name, p.numel, p.dtype) for p in params], run.config), snapshots=snapshots
        )
        self._feed(run_id, diag, after=None, skip=skip or set())
        if save:
            self._save(run_id, diag, replace=True)
        return diag

    def _catch_up(self, run_id: str, diag: RunDiagnosis, *, save: bool = True) -> None:
        self._feed(run_id, diag, after=diag.last_step, skip=set())
        if save:
            self._save(run_id, diag)

    def _feed(self, run_id: str, diag: RunDiagnosis, after: int | None, skip: set[int]) -> None:
        desync = [k for k in self.store.series_names(run_id, "scalar") if k.startswith(DESYNC_PREFIX)]
        for chunk in self.store.iter_steps(run_id, metrics=METRICS, scalar_keys=(*SCALARS, *desync), after=after):
            diag.observe_records([(r.step, r.scalars, r.arrays) for r in chunk if r.step not in skip])

    def _save(self, run_id: str, diag: RunDiagnosis, *, mark: bool = True, replace: bool = False) -> None:
        """Store the findings that differ from the stored ones, and (with `mark`) how far they go.

        Live, the mark is written only with a change (and at close): a mark behind the run's
        steps just means that a server starting afresh derives the findings again.
        """
        found = diag.findings()
        changed = found if replace else [f for f in found if diag.saved.get(f.code) != f]
        if not changed and not mark and not replace:
            return
        done = DiagnosisMark(steps=diag.steps, last_step=diag.last_step, version=RULES_VERSION)
        try:
            self.store.save_findings(run_id, [_stored(f) for f in changed], done, replace=replace)
        except UnknownRun:
            self.forget(run_id)  # deleted meanwhile
            return
        diag.saved = {f.code: f for f in found}

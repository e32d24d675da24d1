"""The one interface every diagnostic implements (a check per finding code)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

from .data import RunContext, StepBatch, StepView
from .finding import Finding


class Check:
    """Reads a run's steps in order and holds at most one finding, of its `code`.

    A check is small and self-contained: its docstring says what evidence it uses and its
    thresholds are class attributes. `start` sees the run's `hello`; `observe` sees each measured
    step once, in step order, `observe_unmeasured` each other step (its scalars only); the engine
    gives runs of consecutive measured steps to `observe_batch`, which must leave the check as
    `observe` on each would (a test holds every check to it: tests/backend/test_diagnostics_batch.py). Either may set or update `finding`; the engine notices the change,
    stores it and tells the browsers and the hook. A finding, once made, is never withdrawn.
    """

    code: ClassVar[str]

    def __init__(self) -> None:
        self.finding: Finding | None = None

    def start(self, run: RunContext) -> None:
        """The run's hello has been seen (before any step)."""

    def observe(self, run: RunContext, step: StepView) -> None:
        """One measured step, in order; each step once."""

    def observe_unmeasured(self, run: RunContext, step: StepView) -> None:
        """One step the hook did not measure (`StepView.unmeasured`: scalars only), in order."""

    def observe_unmeasured_batch(self, run: RunContext, steps: Sequence[tuple[int, Mapping[str, float]]]) -> None:
        """Consecutive unmeasured steps, (step, scalars) in order: the same as `observe_unmeasured`
        on each in turn (the engine calls it only where the class overrides `observe_unmeasured`;
        a check that reads a few scalars may pass on the steps without them)."""
        for step in StepView.unmeasured_batch(steps, len(run.params)):
            self.observe_unmeasured(run, step)

    def observe_batch(self, run: RunContext, batch: StepBatch) -> None:
        """Consecutive measured steps, in order: the same as `observe` on each of them in turn,
        which is what it does unless the check knows a faster way to the same state and finding."""
        for step in batch.views:
            self.observe(run, step)

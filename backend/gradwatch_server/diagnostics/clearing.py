"""How `.grad` is cleared between steps: never (forgotten `zero_grad()`), on purpose after K
micro-batches (gradient accumulation), or by zero-filling instead of freeing.

All three read the hook's exact per-parameter counters (docs/protocol.md): `backward_passes`
(passes accumulated into `.grad` since the previous step) and `grad_clear` (0 not cleared,
1 set to None, 2 zero-filled; ABSENT on the first step and when nothing accumulated). Runs from
hooks that do not send them get none of these findings: nothing is guessed from norms.
"""

from __future__ import annotations

import numpy as np

from .check import Check
from .data import NONE, NOT_CLEARED, NOT_SEEN, SET_TO_NONE, ZERO, ZERO_FILLED, RunContext, StepBatch, StepView
from .finding import Figure, Finding, fmt_bytes, name_list, plural


class UnclearedGradients(Check):
    """`grad_accumulation_unbounded` (error): gradients pile up because `.grad` is never cleared.

    Evidence: at a step, a parameter whose `.grad` the step uses (status not `none`) has
    `grad_clear == 0`: this step's backward passes were added on top of the gradient an earlier
    step already used. It fires on the first such step (step 2 of a loop without `zero_grad()`).
    Figure: how many backward passes (batches) that gradient sums, counted since the last clear
    while every step is sampled; without that count the message says "earlier steps".
    """

    code = "grad_accumulation_unbounded"

    def __init__(self) -> None:
        super().__init__()
        self.held: np.ndarray | None = None  # backward passes summed in .grad, per parameter (NaN: unknown)
        self.prev_step: int | None = None

    def observe(self, run: RunContext, step: StepView) -> None:
        if step.passes_known is None or step.clear is None:
            return
        passes = step.passes_known
        consecutive = self.prev_step is not None and step.step == self.prev_step + 1
        if self.held is None:  # first step: nothing earlier to add to
            held = passes.copy() if step.step == 1 else np.full(len(passes), np.nan)
        else:
            before = self.held if consecutive else np.full(len(passes), np.nan)
            held = np.where(
                step.clear == NOT_CLEARED, before + passes, np.where(step.clear == NOT_SEEN, before, passes)
            )
        held[step.status == NONE] = 0
        self.held, self.prev_step = held, step.step
        piled = (step.clear == NOT_CLEARED) & (step.status != NONE)
        if not piled.any():
            return
        names = set(self.finding.params if self.finding else ()) | set(run.names(piled))
        if self.finding is not None:
            if len(names) > len(self.finding.params):  # more parameters found piling up
                ordered = tuple(n for n in run.params if n in names)
                self.finding = Finding(
                    self.code, "error", self.finding.message, ordered, self.finding.first_step, self.finding.figure
                )
            return
        counts = held[piled]
        batches = int(np.max(counts)) if counts.size and np.isfinite(counts).all() else None
        used = (
            f"step {step.step} used the sum of {batches} batches' gradients"
            if batches
            else f"step {step.step} used gradients summed over earlier steps"
        )
        with_grad = int((step.status != NONE).sum())
        if int(piled.sum()) == with_grad:
            message = (
                f"Gradients pile up across steps: .grad was never cleared, so {used}. "
                "Call optimizer.zero_grad() once per step."
            )
        else:
            message = (
                f"Gradients pile up across steps in {plural(int(piled.sum()), 'parameter')} "
                f"({name_list(run.names(piled))}): their .grad was not cleared, so {used}. "
                "Clear them once per step (zero_grad() on every optimizer that holds them)."
            )
        figure = (
            None
            if batches is None
            else Figure("backward passes summed in .grad", float(batches), "passes", str(batches), step.step)
        )
        self.finding = Finding(self.code, "error", message, run.names(piled), step.step, figure)

    def observe_batch(self, run: RunContext, batch: StepBatch) -> None:
        passes, clear, status = batch.stack("passes_known"), batch.stack("clear"), batch.stack("status")
        if (
            self.held is None
            or passes is None
            or clear is None
            or status is None
            or len(self.held) != passes.shape[1]
            or ((clear == NOT_CLEARED) | (clear == NOT_SEEN)).any()
        ):
            super().observe_batch(run, batch)
            return
        # every .grad cleared at every step: nothing piles up, and what `.grad` holds after the
        # batch is its last step's passes
        held = passes[-1].copy()
        held[status[-1] == NONE] = 0
        self.held, self.prev_step = held, batch.views[-1].step


class GradAccumulation(Check):
    """`grad_accumulation` (info): K micro-batches are accumulated per step on purpose.

    Evidence: a step where parameters got K > 1 backward passes since the previous step and their
    `.grad` was cleared before the first of them (`grad_clear` 1 or 2): intentional gradient
    accumulation, not a mistake. K is the largest such count of the step; the figure keeps the
    range seen so far ("4", or "2 to 4" when the last micro-batch group is short).
    """

    code = "grad_accumulation"

    def __init__(self) -> None:
        super().__init__()
        self.k_min: int | None = None
        self.k_max: int | None = None

    def observe(self, run: RunContext, step: StepView) -> None:
        if step.passes_known is None or step.clear is None:
            return
        passes = step.passes_known
        cleared = ((step.clear == SET_TO_NONE) | (step.clear == ZERO_FILLED)) & (passes > 1)
        if not cleared.any():
            return
        assert step.passes is not None  # passes_known is made from it (StepView.of)
        k = int(np.nanmax(step.passes[cleared]))
        if self.k_min is not None and self.k_max is not None and self.k_min <= k <= self.k_max:
            return
        self.k_min = k if self.k_min is None else min(self.k_min, k)
        self.k_max = k if self.k_max is None else max(self.k_max, k)
        text = str(self.k_max) if self.k_min == self.k_max else f"{self.k_min} to {self.k_max}"
        message = (
            f"Gradient accumulation: each optimizer step sums {text} backward passes (micro-batches) "
            f"into .grad and clears it after the step, which is intended. The step uses their sum: "
            f"their mean when each micro-batch's loss is scaled by 1/{self.k_max} (as the Hugging Face "
            f"Trainer, accelerate and nanoGPT do); if your loop does not scale it, the step is "
            f"{self.k_max} times larger than one batch's mean."
        )
        first = self.finding.first_step if self.finding else step.step
        self.finding = Finding(
            self.code,
            "info",
            message,
            (),
            first,
            Figure("backward passes per step", float(self.k_max), "passes", text, step.step),
        )

    def observe_batch(self, run: RunContext, batch: StepBatch) -> None:
        passes, clear = batch.stack("passes_known"), batch.stack("clear")
        if passes is not None and clear is not None and passes.shape == clear.shape:
            if not (((clear == SET_TO_NONE) | (clear == ZERO_FILLED)) & (passes > 1)).any():
                return  # no step accumulated: each would return at once
        super().observe_batch(run, batch)


class ZeroFilledGradBuffers(Check):
    """`zero_filled_grad_buffers` (warning): `zero_grad(set_to_none=False)` keeps buffers allocated.

    Evidence: `grad_clear == 2` (a `.grad` was zero-filled in place between two steps instead of
    being set to None). Figure: the bytes those buffers hold between steps: the zero-filled
    parameters' sizes, or the step's `mem/zero_grad_bytes` (buffers still all-zero when the
    optimizer stepped) if larger; the largest seen so far.
    """

    code = "zero_filled_grad_buffers"

    def observe(self, run: RunContext, step: StepView) -> None:
        if step.clear is None:
            return
        filled = step.clear == ZERO_FILLED
        if not filled.any():
            return
        held = float(run.bytes_per_param[filled | (step.status == ZERO)].sum())
        held = max(held, step.scalar("mem/zero_grad_bytes") or 0.0)
        before = self.finding
        names = set(before.params if before else ()) | set(run.names(filled))
        if (
            before is not None
            and before.figure is not None
            and held <= before.figure.value
            and len(names) == len(before.params)
        ):
            return
        at: int | None = step.step  # the step at which the figure holds
        if before is not None and before.figure is not None and before.figure.value >= held:
            held, at = before.figure.value, before.figure.step
        message = (
            f"zero_grad(set_to_none=False) keeps {fmt_bytes(held)} of gradient buffers allocated between "
            "steps, zero-filled instead of freed; call zero_grad() with the default set_to_none=True "
            "to free them."
        )
        self.finding = Finding(
            self.code,
            "warning",
            message,
            tuple(n for n in run.params if n in names),
            before.first_step if before else step.step,
            Figure("bytes held between steps", held, "bytes", fmt_bytes(held), at),
        )

    def observe_batch(self, run: RunContext, batch: StepBatch) -> None:
        clear = batch.stack("clear")
        if clear is not None and not (clear == ZERO_FILLED).any():
            return  # no buffer zero-filled: each step would return at once
        super().observe_batch(run, batch)

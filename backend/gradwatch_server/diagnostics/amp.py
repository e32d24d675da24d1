"""Mixed precision: steps that a `torch.amp.GradScaler` skipped."""

from __future__ import annotations

import math

from .check import Check
from .data import RunContext, StepView
from .finding import Figure, Finding, fmt_num


class AmpSkippedSteps(Check):
    """`amp_skipped_steps` (info, or warning when many): GradScaler skipped optimizer steps.

    Evidence: the hook's `amp/skipped_steps` scalar (steps skipped so far; a skipped step never
    calls `optimizer.step()`, so it is counted on the next step that runs) and `amp/scale`.
    A few skips while the scale settles after the start are normal: `info`. It becomes a
    `warning` once at least `MANY` (10) steps were skipped and they are at least `SHARE` (20%)
    of the steps attempted (skipped + run): gradients keep overflowing. Figure: steps skipped.
    """

    code = "amp_skipped_steps"
    MANY = 10
    SHARE = 0.2

    def observe(self, run: RunContext, step: StepView) -> None:
        skipped = step.scalar("amp/skipped_steps")
        if skipped is None or not math.isfinite(skipped) or skipped <= 0:
            return
        count = int(skipped)
        if self.finding is not None and self.finding.figure is not None and count <= self.finding.figure.value:
            return
        attempted = step.step + count
        many = count >= self.MANY and count >= self.SHARE * attempted
        scale = step.scalar("amp/scale")
        at = "" if scale is None else f" (scale now {fmt_num(scale)})"
        if many:
            message = (
                f"GradScaler skipped {count} of {attempted} optimizer steps because the gradients kept "
                f"overflowing{at}; look for NaN or Inf in the loss, lower the learning rate, or train "
                "in bfloat16."
            )
        else:
            message = (
                f"GradScaler skipped {count} optimizer step{'s' if count != 1 else ''} because the "
                f"gradients overflowed{at}; a few skips while the scale settles are normal, and need no fix."
            )
        first = self.finding.first_step if self.finding else step.step
        self.finding = Finding(
            self.code,
            "warning" if many else "info",
            message,
            (),
            first,
            Figure(
                "skipped steps",
                float(count),
                "steps",
                f"{count}{'' if scale is None else ' · scale ' + fmt_num(scale)}",
                step.step,
            ),
        )

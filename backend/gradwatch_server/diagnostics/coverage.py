"""Which parameters take part in training: some are in no optimizer, some in the optimizer
never get a gradient, and some steps run with no gradient at all."""

from __future__ import annotations

import numpy as np

from .check import Check
from .data import NONE, ZERO, RunContext, StepBatch, StepView
from .finding import Finding, name_list, plural


class ParamNotInOptimizer(Check):
    """`param_not_in_optimizer` (warning): a `requires_grad` parameter of the model is in no param group.

    Evidence: the hook's `hello` lists them in `run.config.unoptimized_params` (it compares
    `model.named_parameters()` with the optimizer's groups, so it needs `watch(model=...)`).
    Such a parameter gets gradients but is never updated. A warning, not an error: fine-tuning
    only a head without freezing the rest looks the same, and is only wasteful.
    No step: the finding is known before the first one.
    """

    code = "param_not_in_optimizer"

    def start(self, run: RunContext) -> None:
        names = run.config_names("unoptimized_params")
        if not names:
            return
        n = len(names)
        message = (
            f"{plural(n, 'parameter')} of the model ({name_list(names)}) "
            f"require{'s' if n == 1 else ''} gradients but {'is' if n == 1 else 'are'} in no optimizer "
            f"param group, so {'it gets' if n == 1 else 'they get'} gradients but never "
            f"{'changes' if n == 1 else 'change'}; add {'it' if n == 1 else 'them'} to the optimizer, "
            "or set requires_grad=False to freeze on purpose."
        )
        self.finding = Finding(self.code, "warning", message, names, None)


class ParamNeverGetsGrad(Check):
    """`param_never_gets_grad` (warning): a parameter in the optimizer whose `.grad` stays None.

    Evidence: its `grad_status` is `none` at each of the first `SAMPLES` sampled steps (10):
    the loss does not depend on it (an unused branch, or a graph detached before it). Parameters
    the hook reports as frozen (`run.config.frozen_params`, requires_grad=False) are left out,
    and so is the case where no parameter has a gradient (that is `step_without_grad`).
    """

    code = "param_never_gets_grad"
    SAMPLES = 10

    def __init__(self) -> None:
        super().__init__()
        self.never: np.ndarray | None = None
        self.seen = 0
        self.first_step: int | None = None

    def observe(self, run: RunContext, step: StepView) -> None:
        if self.seen >= self.SAMPLES:
            return
        none = step.status == NONE
        self.never = none if self.never is None else self.never & none
        self.first_step = step.step if self.first_step is None else self.first_step
        self.seen += 1
        if self.seen < self.SAMPLES:
            return
        frozen = set(run.config_names("frozen_params"))
        never = self.never & np.array([n not in frozen for n in run.params], dtype=bool)
        if not never.any() or self.never.all():
            return
        names = run.names(never)
        n = len(names)
        message = (
            f"{plural(n, 'parameter')} in the optimizer ({name_list(names)}) got no gradient in the first "
            f"{self.SAMPLES} steps: the loss does not depend on {'it' if n == 1 else 'them'} (an unused "
            f"branch or a detached graph); use {'it' if n == 1 else 'them'} in the forward pass, or leave "
            f"{'it' if n == 1 else 'them'} out of the model and the optimizer."
        )
        self.finding = Finding(self.code, "warning", message, names, self.first_step)


class StepWithoutGrad(Check):
    """`step_without_grad` (error): `optimizer.step()` ran with no gradient at all.

    Evidence: a step at which every parameter's `.grad` is None, or (with the hook's
    `backward_passes`) no backward pass reached any parameter since the previous step and
    every `.grad` is None or all zeros. The step updated nothing: `step()` came before
    `backward()`, or `zero_grad()` ran between them.
    """

    code = "step_without_grad"

    def observe(self, run: RunContext, step: StepView) -> None:
        if self.finding is not None or not len(step.status):
            return
        if (step.status == NONE).all():
            held = "every .grad was None"
        elif (
            step.passes_known is not None
            and not (step.passes_known > 0).any()
            and ((step.status == NONE) | (step.status == ZERO)).all()
        ):
            held = "no backward pass since the previous step, every .grad was zero"
        else:
            return
        message = (
            f"optimizer.step() ran at step {step.step} with no gradient at all ({held}), so it updated "
            "nothing; call loss.backward() before optimizer.step(), and zero_grad() before backward() "
            "or after step(), never between them."
        )
        self.finding = Finding(self.code, "error", message, (), step.step)

    def observe_batch(self, run: RunContext, batch: StepBatch) -> None:
        if self.finding is not None:
            return
        status = batch.stack("status")
        known = [v.passes_known is not None for v in batch.views]
        passes = batch.stack("passes_known") if all(known) else None
        if (
            status is not None
            and status.shape[1]
            and (passes is not None and passes.shape == status.shape or not any(known))
        ):
            empty = (status == NONE).all(axis=1)
            if passes is not None:
                empty |= ~(passes > 0).any(axis=1) & ((status == NONE) | (status == ZERO)).all(axis=1)
            if not empty.any():
                return  # no step without a gradient: each would return
        super().observe_batch(run, batch)

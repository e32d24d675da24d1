"""Diagnostics: the classic gradient and optimizer mistakes, found in a run's telemetry.

One small check per finding code (docs/diagnostics.md), each documenting its evidence and
thresholds:

    clearing.py   grad_accumulation_unbounded, grad_accumulation, zero_filled_grad_buffers
    coverage.py   param_not_in_optimizer, param_never_gets_grad, step_without_grad
    values.py     nonfinite_grad, exploding_grad, vanishing_grad
    amp.py        amp_skipped_steps
    ranks.py      rank_desync (distributed jobs)
    spikes.py     grad_norm_spike, large_update, adam_epsilon_regime, loss_spike (instabilities)

The checks read `StepView`s (data.py) and know nothing of storage or the network; the engine
(engine.py) feeds them live steps and stored ones alike, and keeps the findings in the store.
"""

from .check import Check
from .data import RunContext, StepView
from .engine import CHECKS, RULES_VERSION, Diagnostics, RunDiagnosis
from .finding import Figure, Finding

CODES = tuple(check.code for check in CHECKS)

__all__ = [
    "CHECKS",
    "CODES",
    "RULES_VERSION",
    "Check",
    "Diagnostics",
    "Figure",
    "Finding",
    "RunContext",
    "RunDiagnosis",
    "StepView",
]

"""One step of a `gradwatch.measure.Probe` measured the way the watcher measures it, for tests
that drive a Probe without a watcher: `begin` and `read_grads` before the optimizer step,
`read_state` and `finish` after it (one optimizer: every parameter at once)."""

from __future__ import annotations

from typing import Any

import numpy as np

from gradwatch.measure import Probe, Snapshot


def before_step(probe: Probe, step: int) -> None:
    """Start measuring `step` and read every gradient, as the step will use them."""
    probe.begin(step)
    probe.read_grads()


def after_step(
    probe: Probe, extra_scalars: dict[str, Any], host_metrics: dict[str, np.ndarray] | None = None
) -> Snapshot | None:
    """Read every parameter and optimizer state as the step left them, then finish the step."""
    probe.read_state()
    return probe.finish(extra_scalars, host_metrics)

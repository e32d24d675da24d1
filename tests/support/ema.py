"""TensorBoard's smoothing written out step by step: the oracle of every smoothing test."""

from __future__ import annotations

import math


def reference_ema(values: list[float], weight: float, missing: list[bool] | None = None) -> list[float]:
    """Debiased EMA: each finite value updates last = w*last + (1-w)*y and shows last/(1-w^n);
    a non-finite value (or one marked `missing`) is shown as it is and stays out of the average."""
    out, last, n = [], 0.0, 0
    for i, y in enumerate(values):
        if not math.isfinite(y) or (missing is not None and missing[i]):
            out.append(y)
            continue
        last = last * weight + (1 - weight) * y
        n += 1
        out.append(last / (1 - weight**n))
    return out

"""TensorBoard's smoothing: a debiased exponential moving average (pure numpy, no I/O).

For weight w in [0, 1), each finite value y updates ``last = w * last + (1 - w) * y`` and shows
``last / (1 - w ** n)``, n the finite values so far: the first points are not pulled towards 0.
A non-finite value is shown as it is and does not enter the average (a NaN stays visible, and
does not turn the rest of the curve into NaN). The series endpoints smooth the raw series from
the run's first step, then cut the window and downsample: smoothing a downsampled series would
average bucket means, not steps.
"""

from __future__ import annotations

import math

import numpy as np

#: Largest w ** -k a chunk may hold (float64 goes to 1.8e308): the chunk length follows from w.
_MAX_SCALE = 1e150


def ema(values: np.ndarray, weight: float, missing: np.ndarray | None = None) -> np.ndarray:
    """The debiased EMA of `values` (1-D) with `weight`; entries where `missing` is true (values
    that do not exist) and non-finite ones are returned unchanged and skipped by the average.

    Vectorised in chunks: within a chunk, ``last_j = w^(j+1) * last_-1 + (1-w) * w^j *
    cumsum(y_k * w^-k)``, the chunk short enough that w^-k stays far from overflow.
    """
    if not 0.0 <= weight < 1.0:
        raise ValueError(f"smoothing weight must be in [0, 1), not {weight}")
    v = np.asarray(values, dtype=np.float64)
    out = v.copy()
    use = np.isfinite(v) if missing is None else np.isfinite(v) & ~missing
    y = v[use]
    if weight == 0.0 or not len(y):
        return out
    length = max(1, min(4096, int(math.log(_MAX_SCALE) / -math.log(weight)))) if weight > 0 else len(y)
    smoothed = np.empty(len(y))
    last = 0.0
    for a in range(0, len(y), length):
        seg = y[a : a + length]
        j = np.arange(len(seg), dtype=np.float64)
        down = weight**j
        cur = weight * down * last + (1.0 - weight) * down * np.cumsum(seg / down)
        smoothed[a : a + len(seg)] = cur
        last = float(cur[-1])
    debias = 1.0 - weight ** np.arange(1, len(y) + 1, dtype=np.float64)
    out[use] = smoothed / debias
    return out


def ema_columns(columns: np.ndarray, weight: float, missing: np.ndarray | None = None) -> np.ndarray:
    """`ema` of each column of a steps x k array."""
    out = np.empty(columns.shape, dtype=np.float64)
    for j in range(columns.shape[1]):
        out[:, j] = ema(columns[:, j], weight, None if missing is None else missing[:, j])
    return out

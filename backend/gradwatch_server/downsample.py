"""Bucketing long series for charts without hiding what matters (pure numpy, no I/O).

Steps are cut into consecutive buckets of nearly equal count. Each bucket keeps its mean of
finite values and its extremes, and a non-finite value is never averaged away: NaN or +Inf shows
in the bucket's max, -Inf in its min, so a spike or a blow-up survives any zoom level.

Arrays are indexed by step along axis 0; a second axis (one column per parameter) is reduced
column by column. `missing` marks values that do not exist (ABSENT): they are ignored, and a
bucket with nothing else is reported as empty (null in the API).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def bucket_starts(n: int, buckets: int) -> np.ndarray:
    """Start index of each bucket when `n` items are cut into at most `buckets` runs."""
    if buckets < 1:
        raise ValueError("buckets must be at least 1")
    if n <= buckets:
        return np.arange(n, dtype=np.int64)
    return (np.arange(buckets, dtype=np.int64) * n) // buckets


@dataclass(frozen=True)
class Summary:
    """Per-bucket statistics; `empty` is true where a bucket has no value at all."""

    mean: np.ndarray
    min: np.ndarray
    max: np.ndarray
    empty: np.ndarray


def _present(values: np.ndarray, missing: np.ndarray | None) -> np.ndarray:
    return np.ones(values.shape, dtype=bool) if missing is None else ~missing


def _count(mask: np.ndarray, starts: np.ndarray) -> np.ndarray:
    return np.add.reduceat(mask.astype(np.int64), starts, axis=0)


def summarize(values: np.ndarray, starts: np.ndarray, missing: np.ndarray | None = None) -> Summary:
    """Mean of finite values, min and max per bucket, non-finite values kept (see module doc)."""
    v = np.asarray(values, dtype=np.float64)
    present = _present(v, missing)
    nan = np.isnan(v) & present
    finite = np.isfinite(v) & present
    ordered = present & ~nan  # finite or +-Inf: values that compare

    n_finite = _count(finite, starts)
    total = np.add.reduceat(np.where(finite, v, 0.0), starts, axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(n_finite > 0, total / np.maximum(n_finite, 1), np.nan)

    has_ordered = _count(ordered, starts) > 0
    has_nan = _count(nan, starts) > 0
    low = np.minimum.reduceat(np.where(ordered, v, np.inf), starts, axis=0)
    high = np.maximum.reduceat(np.where(ordered, v, -np.inf), starts, axis=0)
    low = np.where(has_ordered, low, np.nan)
    high = np.where(has_ordered & ~has_nan, high, np.nan)
    empty = ~(has_ordered | has_nan)
    return Summary(mean=mean, min=low, max=high, empty=empty)


def extreme(op: np.ufunc, x: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """`op.reduceat(x, starts, axis=0)` for min or max (where repeating a value changes
    nothing), by gathering each bucket into a row of equal width, a short bucket repeating its
    last value: numpy's reduceat along the first axis is several times slower, and a heatmap
    reduces every parameter at once.
    Buckets longer than twice the mean (a long window's first bucket: raw steps beside blocks)
    are cut into runs of that width, reduced, then merged, so the gather stays about 3 x len(x)."""
    sizes = np.diff(np.append(starts, len(x)))
    if not len(sizes):
        return op.reduceat(x, starts, axis=0)
    width = max(2, -(-2 * len(x) // len(sizes)))
    if sizes.max() <= width:
        return _gather(op, x, starts, sizes)
    cuts = -(-sizes // width)  # runs per bucket
    head = np.cumsum(cuts) - cuts  # each bucket's first run
    runs = np.repeat(starts, cuts) + width * (np.arange(cuts.sum()) - np.repeat(head, cuts))
    return extreme(op, _gather(op, x, runs, np.diff(np.append(runs, len(x)))), head)


def _gather(op: np.ufunc, x: np.ndarray, starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    rows = starts[:, None] + np.minimum(np.arange(int(sizes.max())), sizes[:, None] - 1)
    reduced: np.ndarray = op.reduce(x[rows], axis=1)
    return reduced


def peak(values: np.ndarray, starts: np.ndarray, missing: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per bucket the value of largest magnitude, NaN winning over everything.

    Returns (peaks, empty). For non-negative metrics such as norms this is the bucket's maximum.
    """
    v = np.asarray(values, dtype=np.float64)
    present = _present(v, missing)
    nan = np.isnan(v) & present
    ordered = present & ~nan
    low = extreme(np.minimum, np.where(ordered, v, np.inf), starts)
    high = extreme(np.maximum, np.where(ordered, v, -np.inf), starts)
    out = np.where(np.abs(low) > np.abs(high), low, high)
    has_nan = extreme(np.maximum, nan, starts)
    out = np.where(has_nan, np.nan, out)
    empty = ~(has_nan | extreme(np.maximum, ordered, starts))
    return out, empty


def highest_code(codes: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Per bucket the highest grad_status code (nonfinite > nonzero > zero > none)."""
    return extreme(np.maximum, np.asarray(codes), starts)

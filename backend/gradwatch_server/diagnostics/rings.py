"""Per-series ring buffers of the last `width` values (a row each: `values`, `pos`, `count`), as
the checks keep their windows, and what a batch of steps does to them at once.

A step pushes a value into some rows (a `kept` mask). Over a batch of steps (rows of `new`),
each series' values before a step are its kept values before the batch, then the batch's kept
ones before that step: a row of `line`, read through a sliding window, is exactly the ring as
that step found it (the same values; a window's order does not matter to a median, a minimum
or a maximum), so a batch is judged in a few numpy calls instead of a few per step.
"""

from __future__ import annotations

import numpy as np


def kept_before(kept: np.ndarray) -> np.ndarray:
    """Per step (row) and series (column): how many of the batch's values the series kept before it."""
    return np.asarray(np.cumsum(kept, axis=0) - kept)


def line(values: np.ndarray, pos: np.ndarray, new: np.ndarray, kept: np.ndarray, before: np.ndarray) -> np.ndarray:
    """Each series' last `width` kept values, oldest first (NaN first where fewer were ever
    kept: the ring's unfilled slots), then the batch's kept ones in order (NaN after them): an
    (series x (width + steps)) array whose window of `width` from column `before[i, s]` is
    what series `s` held before step `i`."""
    width = values.shape[1]
    order = (pos[:, None] - width + np.arange(width)[None, :]) % width
    out = np.full((values.shape[0], width + new.shape[0]), np.nan)
    out[:, :width] = values[np.arange(len(values))[:, None], order]
    i, s = np.nonzero(kept)
    out[s, width + before[i, s]] = new[i, s]
    return out


def windows(
    values: np.ndarray,
    pos: np.ndarray,
    new: np.ndarray,
    kept: np.ndarray,
    before: np.ndarray,
    i: np.ndarray,
    s: np.ndarray,
) -> np.ndarray:
    """The windows that series `s` held before steps `i` (pairs of indices), one a row."""
    width = values.shape[1]
    view = np.lib.stride_tricks.sliding_window_view(line(values, pos, new, kept, before), width, axis=1)
    return np.asarray(view[s, before[i, s]])


def floors(least: np.ndarray, new: np.ndarray, kept: np.ndarray, ufunc: np.ufunc = np.fmin) -> np.ndarray:
    """Per step and series: `ufunc` (fmin or fmax) of the series' values before the batch
    (`least`, one a series) and the batch's kept values before the step. Each window the step
    found holds a subset of those, so this bounds its least (greatest) value from below (above):
    a value clear of the bound is clear of the window's own, in floating point too."""
    prior = np.where(kept, new, np.nan)
    with np.errstate(invalid="ignore"):
        return np.asarray(ufunc.accumulate(np.vstack([least[None, :], prior[:-1]]), axis=0))


def append(
    values: np.ndarray,
    pos: np.ndarray,
    count: np.ndarray,
    new: np.ndarray,
    kept: np.ndarray,
    before: np.ndarray | None = None,
) -> None:
    """Push each step's kept values (rows of `new` where `kept`) in turn, in place: as many
    one-step pushes leave the ring (`before`: `kept_before(kept)`, where the caller has it).
    Only each series' last `width` are written (they overwrite all before them), so no slot is
    written twice."""
    width = values.shape[1]
    before = kept_before(kept) if before is None else before
    total = before[-1] + kept[-1] if len(kept) else np.zeros_like(count)
    i, s = np.nonzero(kept & (before >= total[None, :] - width))
    values[s, (pos[s] + before[i, s]) % width] = new[i, s]
    pos[:] = (pos + total) % width
    count += total

"""The spread of a per-parameter metric across the parameters at each step (or bucket of steps):
min, quartiles, median and max, the shape of the whole network's gradients at a glance.

At a step, the statistics are those of the parameters' finite values (a parameter without a
value there, ABSENT, or with a non-finite one stays out; `nonfinite` counts the latter). Over a
bucket of steps, each parameter counts with its bucket mean (of finite values): read from the
raw rows over a short window, from the stored step blocks over a long one (charts.py), so the
cost follows the points, not the steps. A bucket of one step is that step, value for value.
"""

from __future__ import annotations

import warnings

import numpy as np

from . import blocks, charts, downsample
from .jsonvalues import float_list
from .models import Spread
from .protocol import absent_mask
from .store import Store

QUANTILES = (0.0, 0.25, 0.5, 0.75, 1.0)


def spread(
    store: Store,
    run_id: str,
    count: int,
    metric: str,
    start: int | None,
    end: int | None,
    max_points: int,
    raw_rows: int = charts.RAW_ROWS,
) -> Spread:
    known = store.series_names(run_id, "param")
    if metric not in known or metric == "grad_status":
        listed = ", ".join(m for m in known[:20] if m != "grad_status") or "none yet"
        raise charts.NotFound(f"run {run_id!r} has no float parameter metric {metric!r} (it has: {listed})")
    found = charts.long_window(store, run_id, metric, None, count, start, end, max_points, raw_rows, blocks.group)
    if found is not None:
        pieces = blocks.concat(found, count)
        means = blocks.summary(pieces).mean
        # An empty piece has low +inf and high -inf: only high +inf or low -inf is an infinity of the data.
        odd = (pieces.nan > 0) | (pieces.high == np.inf) | (pieces.low == -np.inf)
        step, downsampled, nonfinite = pieces.first, True, odd.sum(axis=1)
    else:
        steps, rows = store.metric_rows(run_id, metric, start, end)
        missing = absent_mask(rows)
        bad = ~np.isfinite(rows) & ~missing
        if len(steps) > max_points:
            starts = downsample.bucket_starts(len(steps), max_points)
            means = downsample.summarize(rows, starts, missing).mean
            nonfinite = (np.add.reduceat(bad.astype(np.int64), starts, axis=0) > 0).sum(axis=1)
            step, downsampled = steps[starts], True
        else:
            means = np.where(missing | bad, np.nan, rows.astype(np.float64))
            step, downsampled, nonfinite = steps, False, bad.sum(axis=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a step where no parameter has a value: NaN
        stats = np.nanquantile(means, QUANTILES, axis=1) if len(means) else np.empty((len(QUANTILES), 0))
    empty = np.isnan(stats[0])
    lists = [float_list(row, empty) for row in stats]
    return Spread(
        metric=metric,
        downsampled=downsampled,
        step=[int(s) for s in step],
        params=[int(n) for n in np.sum(~np.isnan(means), axis=1)],
        nonfinite=[int(n) for n in nonfinite],
        min=lists[0],
        q25=lists[1],
        median=lists[2],
        q75=lists[3],
        max=lists[4],
    )

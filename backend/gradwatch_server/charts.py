"""Chart payloads: store reads, downsampled, as the API's JSON (docs/api.md, Series, Heatmap).

Each function is what one chart asks for; the routes only parse parameters and call them.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

from . import downsample
from .jsonvalues import JsonFloat, float_list
from .models import Heatmap, ParamSeries, ParamSeriesPublic, Series
from .protocol import GRAD_STATUS, absent_mask
from .store import Param, Store

#: Rows of a metric read at once for a heatmap: bounds memory to this many x parameters.
HEATMAP_CHUNK_ROWS = 4096


class NotFound(LookupError):
    """The run has no such series or parameter; the message names what exists."""


def _missing(values: np.ndarray) -> np.ndarray | None:
    """ABSENT entries of float32 per-parameter values; status codes have none."""
    return absent_mask(values) if values.dtype.kind == "f" else None


def _require(name: str, known: Sequence[str], what: str, run_id: str) -> None:
    if name not in known:
        listed = ", ".join(known[:20]) or "none yet"
        raise NotFound(f"run {run_id!r} has no {what} {name!r} (it has: {listed})")


Points = tuple[list[JsonFloat], list[JsonFloat] | None, list[JsonFloat] | None]


def _points(steps: np.ndarray, columns: np.ndarray, missing: np.ndarray | None,
            max_points: int) -> tuple[list[int], bool, list[Points]]:
    """Steps and, per column of `columns` (steps x k), its (value, min, max) lists."""
    if len(steps) <= max_points:
        return steps.tolist(), False, [
            (float_list(columns[:, j], None if missing is None else missing[:, j]), None, None)
            for j in range(columns.shape[1])
        ]
    starts = downsample.bucket_starts(len(steps), max_points)
    s = downsample.summarize(columns, starts, missing)
    return steps[starts].tolist(), True, [
        (float_list(s.mean[:, j], s.empty[:, j]), float_list(s.min[:, j], s.empty[:, j]),
         float_list(s.max[:, j], s.empty[:, j]))
        for j in range(columns.shape[1])
    ]


def scalar_series(store: Store, run_id: str, key: str, start: int | None, end: int | None,
                  max_points: int) -> Series:
    _require(key, store.series_names(run_id, "scalar"), "scalar", run_id)
    steps, values = store.scalar_series(run_id, key, start, end)
    step, downsampled, [(value, low, high)] = _points(steps, values.reshape(-1, 1), None, max_points)
    return Series(key=key, downsampled=downsampled, step=step, value=value, min=low, max=high)


def top_indices(values: np.ndarray, top: int, order: Literal["asc", "desc"]) -> list[int]:
    """The `top` parameters by value: NaN ranks above +Inf in "desc", last in "asc"; ABSENT never."""
    missing = _missing(values)
    candidates = np.flatnonzero(~missing) if missing is not None else np.arange(len(values))
    v = values[candidates].astype(np.float64)
    nan = np.isnan(v)
    if order == "desc":
        ranked = np.lexsort((-np.where(nan, np.inf, v), ~nan))
    else:
        ranked = np.lexsort((np.where(nan, np.inf, v), nan))
    return [int(i) for i in candidates[ranked[:top]]]


def param_series(store: Store, run_id: str, params: list[Param], metric: str, names: Sequence[str],
                 top: int, order: Literal["asc", "desc"], start: int | None, end: int | None,
                 max_points: int) -> ParamSeriesPublic:
    _require(metric, store.series_names(run_id, "param"), "parameter metric", run_id)
    by_name = {p.name: p for p in params}
    if names:
        for name in names:
            _require(name, list(by_name), "parameter", run_id)
        chosen = [by_name[n].index for n in dict.fromkeys(names)]
    else:
        last = store.last_metric_row(run_id, metric, start, end)
        chosen = [] if last is None else top_indices(last[1], top, order)
    steps, columns = store.metric_columns(run_id, metric, chosen, start, end)
    step, downsampled, points = _points(steps, columns, _missing(columns), max_points)
    series = [ParamSeries(param=params[i].name, index=i, value=value, min=low, max=high)
              for i, (value, low, high) in zip(chosen, points)]
    return ParamSeriesPublic(metric=metric, downsampled=downsampled, step=step, series=series)


def heatmap(store: Store, run_id: str, params: list[Param], metric: str, start: int | None,
            end: int | None, max_steps: int, chunk_rows: int = HEATMAP_CHUNK_ROWS) -> Heatmap:
    """Parameters x step buckets: each cell the bucket's peak (highest code for grad_status).

    The metric is read a few thousand steps at a time, whole buckets per read, so memory stays
    bounded however long the run.
    """
    _require(metric, store.series_names(run_id, "param"), "parameter metric", run_id)
    all_steps = store.metric_steps(run_id, metric, start, end)
    starts = downsample.bucket_starts(len(all_steps), max_steps)
    first_steps = all_steps[starts]
    columns: list[list[int | JsonFloat]] = [[] for _ in params]
    for lo, hi in _bucket_chunks(starts, len(all_steps), chunk_rows):
        last_row = starts[hi] - 1 if hi < len(starts) else len(all_steps) - 1
        steps, rows = store.metric_rows(run_id, metric, int(first_steps[lo]), int(all_steps[last_row]))
        local = np.searchsorted(steps, first_steps[lo:hi])
        if metric == GRAD_STATUS:
            cells = downsample.highest_code(rows, local)
            for i in range(rows.shape[1]):
                columns[i].extend(cells[:, i].tolist())
        else:
            cells, empty = downsample.peak(rows, local, absent_mask(rows))
            for i in range(rows.shape[1]):
                columns[i].extend(float_list(cells[:, i], empty[:, i]))
    return Heatmap(metric=metric, params=[p.name for p in params], step=first_steps.tolist(), z=columns,
                   downsampled=len(starts) < len(all_steps))


def _bucket_chunks(starts: np.ndarray, n: int, chunk_rows: int) -> list[tuple[int, int]]:
    """Consecutive bucket ranges [lo, hi) of about `chunk_rows` rows, at least one bucket each."""
    chunks, lo = [], 0
    ends = np.append(starts[1:], n)
    while lo < len(starts):
        hi = int(np.searchsorted(ends, starts[lo] + chunk_rows, side="right"))
        hi = max(hi, lo + 1)
        chunks.append((lo, hi))
        lo = hi
    return chunks

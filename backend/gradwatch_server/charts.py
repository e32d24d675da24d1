"""Chart payloads: store reads, downsampled, as the API's JSON (docs/api.md, Series, Heatmap).

Each function is what one chart asks for; the routes only parse parameters and call them.

A series (a parameter metric, or a scalar) over a window of at most `RAW_ROWS` (or 16 x
max_points) stored steps is read raw and cut into buckets of equal counts of stored steps. Over a longer window the buckets
are aligned runs of steps (a multiple of a block size, blocks.bucket_width) read from the stored
step blocks, so the cost follows the number of points, not of steps (tests/bench/storage.py: one
parameter over 10^6 steps went from 4.2 s to a few tens of ms). Both keep each bucket's min,
max, NaN and Inf exactly and its mean to float64 rounding; a window with no more stored steps
than points is read raw, bit for bit.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Literal

import numpy as np

from . import blocks, downsample
from .jsonvalues import JsonFloat, float_list
from .models import Heatmap, ParamSeries, ParamSeriesPublic, Series
from .protocol import GRAD_STATUS, absent_mask
from .store import Param, Store

#: Rows of a metric read at once for a heatmap: bounds memory to this many x parameters.
HEATMAP_CHUNK_ROWS = 4096

#: Summaries (parameters x pieces) read at once over a long window: bounds memory to this many
#: x 40 bytes.
BLOCK_CHUNK_VALUES = 1 << 20

#: A window of at most this many stored steps (or 16 x the points asked for, if more) is read raw:
#: a few thousand rows read fast, and short runs keep buckets of equal step counts.
RAW_ROWS = 4096


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


def _wall_times(store: Store, run_id: str, step: list[int]) -> dict[str, Any]:
    """`time` (each point's wall time; null for a step not stored) and `time0` (the run's first
    stored step's), for `with_time`: compare aligns runs by time - time0."""
    times, first = store.step_times(run_id, step)
    return {"time": float_list(times, np.isnan(times)), "time0": first}


def scalar_series(store: Store, run_id: str, key: str, start: int | None, end: int | None,
                  max_points: int, with_time: bool = False, raw_rows: int = RAW_ROWS) -> Series:
    _require(key, store.series_names(run_id, "scalar"), "scalar", run_id)
    found = _long_window(store, run_id, key, None, 1, start, end, max_points, raw_rows, kind="scalar")
    if found is not None:
        s = blocks.summary(blocks.concat(found, 1))
        step, downsampled = [int(f) for p in found for f in p.first], True
        value, low, high = (float_list(s.mean[:, 0], s.empty[:, 0]), float_list(s.min[:, 0], s.empty[:, 0]),
                            float_list(s.max[:, 0], s.empty[:, 0]))
    else:
        steps, values = store.scalar_series(run_id, key, start, end)
        step, downsampled, [(value, low, high)] = _points(steps, values.reshape(-1, 1), None, max_points)
    extra = _wall_times(store, run_id, step) if with_time else {}
    return Series(key=key, downsampled=downsampled, step=step, value=value, min=low, max=high, **extra)


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
                 max_points: int, with_time: bool = False, raw_rows: int = RAW_ROWS) -> ParamSeriesPublic:
    _require(metric, store.series_names(run_id, "param"), "parameter metric", run_id)
    by_name = {p.name: p for p in params}
    if names:
        for name in names:
            _require(name, list(by_name), "parameter", run_id)
        chosen = [by_name[n].index for n in dict.fromkeys(names)]
    else:
        last = store.last_metric_row(run_id, metric, start, end)
        chosen = [] if last is None else top_indices(last[1], top, order)
    found = _long_window(store, run_id, metric, chosen, len(chosen), start, end, max_points, raw_rows)
    if found is not None:
        s = blocks.summary(blocks.concat(found, len(chosen)))
        step, downsampled = [int(f) for p in found for f in p.first], True
        points: list[Points] = [
            (float_list(s.mean[:, j], s.empty[:, j]), float_list(s.min[:, j], s.empty[:, j]),
             float_list(s.max[:, j], s.empty[:, j])) for j in range(len(chosen))]
    else:
        steps, columns = store.metric_columns(run_id, metric, chosen, start, end)
        step, downsampled, points = _points(steps, columns, _missing(columns), max_points)
    series = [ParamSeries(param=params[i].name, index=i, value=value, min=low, max=high)
              for i, (value, low, high) in zip(chosen, points)]
    extra = _wall_times(store, run_id, step) if with_time else {}
    return ParamSeriesPublic(metric=metric, downsampled=downsampled, step=step, series=series, **extra)


def heatmap(store: Store, run_id: str, params: list[Param], metric: str, start: int | None,
            end: int | None, max_steps: int, chunk_rows: int = HEATMAP_CHUNK_ROWS,
            raw_rows: int = RAW_ROWS) -> Heatmap:
    """Parameters x step buckets: each cell the bucket's peak (highest code for grad_status).

    The metric is read a few thousand steps at a time, whole buckets per read, so memory stays
    bounded however long the run.
    """
    _require(metric, store.series_names(run_id, "param"), "parameter metric", run_id)
    found = _long_window(store, run_id, metric, None, len(params), start, end, max_steps, raw_rows)
    if found is not None:
        return Heatmap.model_construct(metric=metric, params=[p.name for p in params], downsampled=True,
                                       step=[int(f) for p in found for f in p.first],
                                       z=_heatmap_cells(metric, found, len(params)))
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
    # model_construct: the cells are ours and already JSON values; validating a million of them
    # again took 60 ms of a 1,000 x 1,000 heatmap (tests/bench/storage.py).
    return Heatmap.model_construct(metric=metric, params=[p.name for p in params], step=first_steps.tolist(),
                                   z=columns, downsampled=len(starts) < len(all_steps))


def _heatmap_cells(metric: str, found: list[blocks.Pieces], count: int) -> list[list[int | JsonFloat]]:
    columns: list[list[int | JsonFloat]] = [[] for _ in range(count)]
    for pieces in found:
        if metric == GRAD_STATUS:
            codes = blocks.highest_code(pieces)
            for i in range(count):
                columns[i].extend(codes[:, i].tolist())
        else:
            cells, empty = blocks.peak(pieces)
            for i in range(count):
                columns[i].extend(float_list(cells[:, i], empty[:, i]))
    return columns


def _long_window(store: Store, run_id: str, name: str, indices: Sequence[int] | None, count: int,
                 start: int | None, end: int | None, max_points: int, raw_rows: int,
                 kind: str = "param") -> list[blocks.Pieces] | None:
    """The window in at most `max_points` aligned buckets built from the stored step blocks, a
    chunk of buckets per list item, for the parameters `indices` (all `count` when None) of a
    parameter metric, or for a scalar (`kind="scalar"`); None when it holds few enough stored
    steps to be read raw (see the module docstring)."""
    bounds = store.series_bounds(run_id, name, start, end, kind)
    if bounds is None:
        return None
    limit = max(raw_rows, blocks.SIZES[0] * max_points, max_points)
    if store.series_count(run_id, name, *bounds, kind) <= limit:
        return None
    plan = blocks.bucket_width(*bounds, max_points)
    assert plan is not None  # steps are distinct: the span is at least the count
    return list(_bucketed(store, run_id, name, indices, count, kind, *bounds, *plan))


def _bucketed(store: Store, run_id: str, name: str, indices: Sequence[int] | None, count: int, kind: str,
              lo: int, hi: int, width: int, size: int) -> Iterator[blocks.Pieces]:
    """Buckets of `width` steps over [lo, hi] from blocks of at most `size` steps, a chunk of
    whole buckets per store read (about BLOCK_CHUNK_VALUES summaries)."""
    pieces = max(1, BLOCK_CHUNK_VALUES // max(1, count))
    span = width * max(1, pieces * size // width)
    a = lo
    while a <= hi:
        b = min(hi, (a // span + 1) * span - 1)
        yield blocks.group(store.series_pieces(run_id, name, a, b, size, indices, kind), width)
        a = b + 1


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

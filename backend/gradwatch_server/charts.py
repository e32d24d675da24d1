"""Chart payloads: store reads, downsampled, as the API's JSON (docs/api.md, Series, Heatmap).

Each function is what one chart asks for; the routes only parse parameters and call them.

A series (a parameter metric, or a scalar) over a window of at most `RAW_ROWS` (or 16 x
max_points) stored steps is read raw and cut into buckets of equal counts of stored steps. Over a longer window the buckets
are aligned runs of steps (a multiple of a block size, blocks.bucket_width) read from the stored
step blocks, so the cost follows the number of points, not of steps (docs/design.md, Step
blocks). Both keep each bucket's min,
max, NaN and Inf exactly and its mean to float64 rounding; a window with no more stored steps
than points is read raw, bit for bit.

A smoothed series (`smooth > 0`) is the EMA of the raw series from the run's first step, then
windowed and downsampled as above: it reads every stored step up to `end`, so it is served only
while those are at most `SMOOTH_ROWS`; above, the request is refused (`TooLong`, a 422) rather
than answered with an approximation or read without bound.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import numpy as np

from . import blocks, downsample, smoothing
from .jsonvalues import JsonFloat, float_list, word
from .models import Heatmap, ParamSeries, ParamSeriesPublic, Series
from .protocol import GRAD_STATUS, absent_mask
from .store import Param, Store

#: Rows of a metric read at once for a heatmap: bounds memory to this many x parameters.
HEATMAP_CHUNK_ROWS = 4096

#: Summaries (parameters x stretches) read at once over a long window: bounds memory to this many
#: x 40 bytes.
BLOCK_CHUNK_VALUES = 1 << 20

#: A window of at most this many stored steps (or 16 x the points asked for, if more) is read raw:
#: a few thousand rows read fast, and short runs keep buckets of equal step counts.
RAW_ROWS = 4096

#: A smoothed series reads every raw row from the run's first step to `end`: above this many
#: stored steps the request is refused (TooLong), so one request's cost stays bounded.
SMOOTH_ROWS = 100_000

#: How a heatmap's cells are written: JSON lists, or base64 float32 (docs/api.md, Heatmap).
Encoding = Literal["json", "f32"]

#: The f32 encoding's NaN, and its cell without a value (quiet NaNs, told apart by their bits).
NAN_BITS = 0x7FC00000
EMPTY_BITS = 0x7FC00001

R = TypeVar("R")


class NotFound(LookupError):
    """The run has no such series or parameter; the message names what exists."""


class TooLong(ValueError):
    """A smoothed series would read more raw rows than its limit; the message says what to ask instead."""


def _check_smooth_rows(store: Store, run_id: str, name: str, end: int | None, kind: str, limit: int | None) -> None:
    """Raise TooLong when the series has more than `limit` (None: SMOOTH_ROWS) stored steps up to
    `end` (the rows a smoothed answer reads): counted from the block index, a few small queries."""
    limit = SMOOTH_ROWS if limit is None else limit
    bounds = store.series_bounds(run_id, name, None, end, kind)
    if bounds is None or bounds[1] - bounds[0] < limit:
        return
    count = store.series_count(run_id, name, *bounds, kind)
    if count > limit:
        upto = "the last" if end is None else f"end={end}"
        raise TooLong(
            f"smooth: {name!r} has {count} stored steps from the run's first to {upto}, more than "
            f"the {limit} a smoothed series may read (the average starts at the first step); ask "
            "without smooth (a downsampled series keeps each bucket's min and max) or with an earlier end"
        )


def _missing(values: np.ndarray) -> np.ndarray | None:
    """ABSENT entries of float32 per-parameter values; status codes have none."""
    return absent_mask(values) if values.dtype.kind == "f" else None


def _require(name: str, known: Sequence[str], what: str, run_id: str) -> None:
    if name not in known:
        listed = ", ".join(known[:20]) or "none yet"
        raise NotFound(f"run {run_id!r} has no {what} {name!r} (it has: {listed})")


Points = tuple[list[JsonFloat], list[JsonFloat] | None, list[JsonFloat] | None]


def _points(
    steps: np.ndarray, columns: np.ndarray, missing: np.ndarray | None, max_points: int
) -> tuple[list[int], bool, list[Points]]:
    """Steps and, per column of `columns` (steps x k), its (value, min, max) lists."""
    if len(steps) <= max_points:
        return (
            steps.tolist(),
            False,
            [
                (float_list(columns[:, j], None if missing is None else missing[:, j]), None, None)
                for j in range(columns.shape[1])
            ],
        )
    starts = downsample.bucket_starts(len(steps), max_points)
    s = downsample.summarize(columns, starts, missing)
    return (
        steps[starts].tolist(),
        True,
        [
            (
                float_list(s.mean[:, j], s.empty[:, j]),
                float_list(s.min[:, j], s.empty[:, j]),
                float_list(s.max[:, j], s.empty[:, j]),
            )
            for j in range(columns.shape[1])
        ],
    )


def _wall_times(store: Store, run_id: str, step: list[int]) -> dict[str, Any]:
    """`time` (each point's wall time; null for a step not stored) and `time0` (the run's first
    stored step's), for `with_time`: compare aligns runs by time - time0."""
    times, first = store.step_times(run_id, step)
    return {"time": float_list(times, np.isnan(times)), "time0": first}


def scalar_series(
    store: Store,
    run_id: str,
    key: str,
    start: int | None,
    end: int | None,
    max_points: int,
    with_time: bool = False,
    raw_rows: int = RAW_ROWS,
    smooth: float = 0.0,
    smooth_rows: int | None = None,
) -> Series:
    _require(key, store.series_names(run_id, "scalar"), "scalar", run_id)
    low: list[JsonFloat] | None
    high: list[JsonFloat] | None
    if smooth > 0:
        _check_smooth_rows(store, run_id, key, end, "scalar", smooth_rows)
        steps, raw = store.scalar_series(run_id, key, None, end)  # from the first step: the average needs them
        steps, [values] = _from_start(steps, [smoothing.ema(raw, smooth)], start)
        step, downsampled, [(value, low, high)] = _points(steps, values.reshape(-1, 1), None, max_points)
        extra = _wall_times(store, run_id, step) if with_time else {}
        return Series(key=key, downsampled=downsampled, step=step, value=value, min=low, max=high, **extra)
    found = long_window(store, run_id, key, None, 1, start, end, max_points, raw_rows, blocks.group, kind="scalar")
    if found is not None:
        s = blocks.summary(blocks.concat(found, 1))
        step, downsampled = [int(f) for p in found for f in p.first], True
        value, low, high = (
            float_list(s.mean[:, 0], s.empty[:, 0]),
            float_list(s.min[:, 0], s.empty[:, 0]),
            float_list(s.max[:, 0], s.empty[:, 0]),
        )
    else:
        steps, values = store.scalar_series(run_id, key, start, end)
        step, downsampled, [(value, low, high)] = _points(steps, values.reshape(-1, 1), None, max_points)
    extra = _wall_times(store, run_id, step) if with_time else {}
    return Series(key=key, downsampled=downsampled, step=step, value=value, min=low, max=high, **extra)


def _from_start(steps: np.ndarray, arrays: list[np.ndarray], start: int | None) -> tuple[np.ndarray, list[np.ndarray]]:
    """The steps from `start` on, and those rows of `arrays` (a smoothed series is read from the
    run's first step, then cut)."""
    if start is None:
        return steps, arrays
    keep = steps >= start
    return steps[keep], [a[keep] for a in arrays]


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


def param_series(
    store: Store,
    run_id: str,
    params: list[Param],
    metric: str,
    names: Sequence[str],
    top: int,
    order: Literal["asc", "desc"],
    start: int | None,
    end: int | None,
    max_points: int,
    with_time: bool = False,
    raw_rows: int = RAW_ROWS,
    smooth: float = 0.0,
    smooth_rows: int | None = None,
) -> ParamSeriesPublic:
    _require(metric, store.series_names(run_id, "param"), "parameter metric", run_id)
    by_name = {p.name: p for p in params}
    if names:
        for name in names:
            _require(name, list(by_name), "parameter", run_id)
        chosen = [by_name[n].index for n in dict.fromkeys(names)]
    else:
        last = store.last_metric_row(run_id, metric, start, end)
        chosen = [] if last is None else top_indices(last[1], top, order)
    found = (
        None
        if smooth > 0
        else long_window(store, run_id, metric, chosen, len(chosen), start, end, max_points, raw_rows, blocks.group)
    )
    points: list[Points]
    if smooth > 0:
        _check_smooth_rows(store, run_id, metric, end, "param", smooth_rows)
        steps, columns = store.metric_columns(run_id, metric, chosen, None, end)
        missing = _missing(columns)
        if missing is None:
            missing = np.zeros(columns.shape, dtype=bool)
        steps, [smoothed, missing] = _from_start(
            steps, [smoothing.ema_columns(columns, smooth, missing), missing], start
        )
        step, downsampled, points = _points(steps, smoothed, missing, max_points)
    elif found is not None:
        s = blocks.summary(blocks.concat(found, len(chosen)))
        step, downsampled = [int(f) for p in found for f in p.first], True
        points = [
            (
                float_list(s.mean[:, j], s.empty[:, j]),
                float_list(s.min[:, j], s.empty[:, j]),
                float_list(s.max[:, j], s.empty[:, j]),
            )
            for j in range(len(chosen))
        ]
    else:
        steps, columns = store.metric_columns(run_id, metric, chosen, start, end)
        step, downsampled, points = _points(steps, columns, _missing(columns), max_points)
    series = [
        ParamSeries(param=params[i].name, index=i, value=value, min=low, max=high)
        for i, (value, low, high) in zip(chosen, points)
    ]
    extra = _wall_times(store, run_id, step) if with_time else {}
    return ParamSeriesPublic(metric=metric, downsampled=downsampled, step=step, series=series, **extra)


def heatmap(
    store: Store,
    run_id: str,
    params: list[Param],
    metric: str,
    start: int | None,
    end: int | None,
    max_steps: int,
    chunk_rows: int = HEATMAP_CHUNK_ROWS,
    raw_rows: int = RAW_ROWS,
    encoding: Encoding = "json",
) -> Heatmap:
    """Parameters x step buckets: each cell the bucket's peak (highest code for grad_status),
    as JSON lists (`z`) or, with `encoding="f32"`, as base64 float32 (`z_f32`, docs/api.md).

    The cells are built as arrays and written out once, the f32 form without a list; most of
    the time goes to reading the block rows.
    """
    _require(metric, store.series_names(run_id, "param"), "parameter metric", run_id)
    grid = _grid(store, run_id, metric, len(params), start, end, max_steps, chunk_rows, raw_rows)
    fields: dict[str, Any] = {"z": None, "z_f32": _f32_cells(grid)} if encoding == "f32" else {"z": _json_cells(grid)}
    # model_construct: the cells are ours and already JSON values; validating a million of them
    # again would cost more than building them.
    return Heatmap.model_construct(
        metric=metric, params=[p.name for p in params], step=grid.step.tolist(), downsampled=grid.downsampled, **fields
    )


@dataclass(frozen=True)
class Grid:
    """A heatmap's cells before they are written out: parameters x step buckets."""

    step: np.ndarray  # int64: each bucket's first stored step
    cells: np.ndarray  # float64 peaks (each a stored float32), or uint8 grad_status codes
    empty: np.ndarray | None  # bool: the bucket has no value (ABSENT only); None for codes
    downsampled: bool


#: Buckets x parameters of a stretch of steps: (first steps, cells, empty or None), as in Grid.
Cells = tuple[np.ndarray, np.ndarray, np.ndarray | None]


def _grid(
    store: Store,
    run_id: str,
    metric: str,
    count: int,
    start: int | None,
    end: int | None,
    max_steps: int,
    chunk_rows: int,
    raw_rows: int,
) -> Grid:
    """The window's buckets from the step blocks over a long window, else from the raw rows, a
    few thousand steps at a time (whole buckets per read), so memory stays bounded however long
    the run."""
    reduce = _bucket_codes if metric == GRAD_STATUS else _bucket_peaks
    found = long_window(store, run_id, metric, None, count, start, end, max_steps, raw_rows, reduce)
    if found is not None:
        return _join_cells(found, count, downsampled=True)
    all_steps = store.metric_steps(run_id, metric, start, end)
    starts = downsample.bucket_starts(len(all_steps), max_steps)
    first_steps = all_steps[starts]
    chunks: list[Cells] = []
    for lo, hi in _bucket_chunks(starts, len(all_steps), chunk_rows):
        last_row = starts[hi] - 1 if hi < len(starts) else len(all_steps) - 1
        steps, rows = store.metric_rows(run_id, metric, int(first_steps[lo]), int(all_steps[last_row]))
        local = np.searchsorted(steps, first_steps[lo:hi])
        if metric == GRAD_STATUS:
            chunks.append((first_steps[lo:hi], downsample.highest_code(rows, local), None))
        else:
            chunks.append((first_steps[lo:hi], *downsample.peak(rows, local, absent_mask(rows))))
    return _join_cells(chunks, count, downsampled=len(starts) < len(all_steps))


def _bucket_peaks(stretches: blocks.Stretches, width: int) -> Cells:
    starts = blocks.breaks(stretches.first // width)
    return (stretches.first[starts], *blocks.peak(stretches, starts))


def _bucket_codes(stretches: blocks.Stretches, width: int) -> Cells:
    starts = blocks.breaks(stretches.first // width)
    return stretches.first[starts], blocks.highest_code(stretches, starts), None


def _join_cells(chunks: list[Cells], count: int, downsampled: bool) -> Grid:
    """The chunks' buckets side by side, transposed to parameters x buckets."""
    if not chunks:
        return Grid(np.empty(0, np.int64), np.empty((count, 0)), np.empty((count, 0), bool), downsampled)
    masks = [c[2] for c in chunks if c[2] is not None]
    return Grid(
        step=np.concatenate([c[0] for c in chunks]),
        cells=np.concatenate([c[1] for c in chunks]).T,
        empty=np.concatenate(masks).T if masks else None,
        downsampled=downsampled,
    )


def _json_cells(grid: Grid) -> list[list[int | JsonFloat]]:
    """The cells as JSON lists: numbers as they are, then the few others (NaN, ±Inf, empty) fixed."""
    rows: list[list[int | JsonFloat]] = grid.cells.tolist()
    if grid.empty is None:
        return rows
    odd = grid.empty | ~np.isfinite(grid.cells)
    for i, j in zip(*(a.tolist() for a in np.nonzero(odd))):
        rows[i][j] = None if grid.empty[i, j] else word(float(grid.cells[i, j]))
    return rows


def _f32_cells(grid: Grid) -> str:
    """The cells as base64 of little-endian float32, row-major, exactly as `_json_cells` gives
    them: every peak is a stored float32 and every code a small integer, so the conversion is
    exact; a NaN becomes NAN_BITS (whatever payload it was stored with), an empty cell EMPTY_BITS."""
    out = grid.cells.astype("<f4", order="C")
    bits = out.view("<u4")
    bits[np.isnan(out)] = NAN_BITS
    if grid.empty is not None:
        bits[grid.empty] = EMPTY_BITS
    return base64.b64encode(out.tobytes()).decode("ascii")


def long_window(
    store: Store,
    run_id: str,
    name: str,
    indices: Sequence[int] | None,
    count: int,
    start: int | None,
    end: int | None,
    max_points: int,
    raw_rows: int,
    reduce: Callable[[blocks.Stretches, int], R],
    kind: str = "param",
) -> list[R] | None:
    """Shared by every chart that reads a long window from the blocks (series, heatmap, spread):
    the window in at most `max_points` aligned buckets built from the stored step blocks, a
    chunk of buckets per list item (what `reduce` makes of its stretches and the bucket width), for
    the parameters `indices` (all `count` when None) of a parameter metric, or for a scalar
    (`kind="scalar"`); None when it holds few enough stored steps to be read raw (see the module
    docstring)."""
    bounds = store.series_bounds(run_id, name, start, end, kind)
    if bounds is None:
        return None
    limit = max(raw_rows, blocks.SIZES[0] * max_points, max_points)
    # Steps are distinct: a span of no more steps than the limit holds no more (no count needed).
    if bounds[1] - bounds[0] < limit or store.series_count(run_id, name, *bounds, kind) <= limit:
        return None
    plan = blocks.bucket_width(*bounds, max_points)
    assert plan is not None  # steps are distinct: the span is at least the count
    return [
        reduce(stretches, plan[0])
        for stretches in _stretches(store, run_id, name, indices, count, kind, *bounds, *plan)
    ]


def _stretches(
    store: Store,
    run_id: str,
    name: str,
    indices: Sequence[int] | None,
    count: int,
    kind: str,
    lo: int,
    hi: int,
    width: int,
    size: int,
) -> Iterator[blocks.Stretches]:
    """Stretches of [lo, hi] from blocks of at most `size` steps, a chunk of whole buckets of
    `width` steps per store read (about BLOCK_CHUNK_VALUES summaries)."""
    stretches = max(1, BLOCK_CHUNK_VALUES // max(1, count))
    span = width * max(1, stretches * size // width)
    a = lo
    while a <= hi:
        b = min(hi, (a // span + 1) * span - 1)
        yield store.series_stretches(run_id, name, a, b, size, indices, kind)
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

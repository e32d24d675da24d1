"""Step blocks: per-parameter summaries of aligned runs of steps, so that long windows read fast
(pure numpy, no I/O; the store keeps them, charts.py reads them).

Block `k` of size `S` summarizes the stored steps in [k*S, (k+1)*S) of one series (a parameter
metric, for every parameter; or a scalar): the min and max of the values that compare (finite and
±Inf), the sum and count of the finite ones, and the count of NaNs (ABSENT is not counted). That
is what `downsample.summarize` and `downsample.peak` need, and it merges exactly: a bucket made of
blocks has the min, max, NaN flag and finite count of its raw values, and their mean to float64
rounding. Sizes are `SIZES` (16 to 16384, each 4x the last). Values at full resolution never come
from blocks: charts.py reads short windows raw. A block is written once closed (the run has a
stored step at or after its end), in the transaction that stores the steps that close it; each
row holds `PART` parameters so that reading one parameter loads little.
Why, and what it costs: docs/design.md, Step blocks; docs/benchmarks.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import downsample

#: Steps per block, smallest first; each divides the next.
SIZES = (16, 64, 256, 1024, 4096, 16384)

#: Parameters per stored block row.
PART = 64

#: One parameter's summary in a stored block (little-endian, packed: 20 bytes).
RECORD = np.dtype([("min", "<f4"), ("max", "<f4"), ("sum", "<f8"), ("finite", "<u2"), ("nan", "<u2")])

#: A scalar's summary in a stored block: the same, with float64 extremes (28 bytes).
SCALAR_RECORD = np.dtype([("min", "<f8"), ("max", "<f8"), ("sum", "<f8"), ("finite", "<u2"), ("nan", "<u2")])

#: Kinds of series that have blocks (as in `series_names.kind`), and their records.
RECORDS = {"param": RECORD, "scalar": SCALAR_RECORD}

#: Segment kinds of `cover`: raw steps, or stored blocks of a size.
RAW = 0


@dataclass
class Stretches:
    """Summaries of stretches of stored steps (each a block, or one raw step), in step order; the
    per-parameter arrays have one column per parameter read."""

    first: np.ndarray  # int64 (n,): first stored step
    rows: np.ndarray  # int64 (n,): stored steps
    low: np.ndarray  # float32 (n, k), float64 for scalars: min of the values that compare; +inf if none
    high: np.ndarray  # the same: max of them; -inf if none
    total: np.ndarray  # float64 (n, k): sum of the finite values
    finite: np.ndarray  # int32 (n, k): count of finite values
    nan: np.ndarray  # int32 (n, k): count of NaNs

    def __len__(self) -> int:
        return len(self.first)


FIELDS = ("first", "rows", "low", "high", "total", "finite", "nan")


def empty(width: int, dtype: type = np.float32) -> Stretches:
    return Stretches(
        np.empty(0, np.int64),
        np.empty(0, np.int64),
        np.empty((0, width), dtype),
        np.empty((0, width), dtype),
        np.empty((0, width)),
        np.empty((0, width), np.int32),
        np.empty((0, width), np.int32),
    )


def from_values(
    steps: np.ndarray,
    values: np.ndarray,
    missing: np.ndarray | None,
    size: int | None = None,
    dtype: type = np.float32,
    starts: np.ndarray | None = None,
) -> Stretches:
    """Stretches of raw steps: `values` (steps x parameters, float32 or uint8 codes, or float64
    scalars with `dtype`; steps ascending) with `missing` marking ABSENT; one stretch per step, per
    block of `size` steps, or per group of rows beginning at the indices `starts`."""
    steps = np.asarray(steps, dtype=np.int64)
    v: np.ndarray = np.asarray(values, dtype=dtype)  # uint8 codes are exact in float32
    if starts is None and size is None:
        starts = np.arange(len(steps))
    elif starts is None:
        starts = breaks(steps // size)
    if not len(steps):
        return empty(v.shape[1] if v.ndim == 2 else 0, dtype)
    nan = np.isnan(v)  # ABSENT is a NaN: not ordered, not finite, and taken out of the NaNs here
    finite = np.isfinite(v)
    ordered = ~nan
    if missing is not None:
        nan &= ~missing
    return Stretches(
        first=steps[starts],
        rows=np.diff(np.append(starts, len(steps))),
        low=_reduce(np.minimum, np.where(ordered, v, v.dtype.type(np.inf)), starts),
        high=_reduce(np.maximum, np.where(ordered, v, v.dtype.type(-np.inf)), starts),
        total=_reduce(np.add, np.where(finite, v, v.dtype.type(0)), starts, np.float64),
        finite=_reduce(np.add, finite, starts, np.int32),
        nan=_reduce(np.add, nan, starts, np.int32),
    )


def breaks(labels: np.ndarray) -> np.ndarray:
    """Indices where a run of equal labels begins."""
    return np.flatnonzero(np.diff(labels, prepend=labels[:1] - 1)) if len(labels) else np.empty(0, np.int64)


def _reduce(op: np.ufunc, x: np.ndarray, starts: np.ndarray, dtype: type | None = None) -> np.ndarray:
    """`op.reduceat(x, starts, axis=0)`, faster where it matters: numpy's reduceat along the first
    axis is an order of magnitude slower than a plain reduction, and ingest reduces one block at
    a time; a group of one row is the row itself. Float sums always
    take reduceat: a plain reduction may add pairwise, and a block must come out bit for bit the
    same whichever batch of blocks it was computed in (ingest, or migration 0004's backfill).
    Many groups of a min or max (a long window's buckets) are gathered into rows instead
    (downsample.extreme). Figures: docs/benchmarks.md."""
    if len(starts) == len(x):
        return x.astype(dtype or x.dtype, copy=False)
    if len(starts) <= 8 and not (op is np.add and np.dtype(dtype or x.dtype).kind == "f"):
        ends = [*starts[1:], len(x)]
        return np.stack([op.reduce(x[a:b], axis=0, dtype=dtype) for a, b in zip(starts, ends)])
    if dtype is None and op in (np.minimum, np.maximum):
        return downsample.extreme(op, x, starts)
    return op.reduceat(x, starts, axis=0, dtype=dtype)


def from_records(first: np.ndarray, rows: np.ndarray, records: np.ndarray) -> Stretches:
    """Stretches from stored blocks: `records` is (blocks x parameters) of `RECORD` or `SCALAR_RECORD`."""
    extreme = records.dtype["min"].newbyteorder("=")
    return Stretches(
        first=np.asarray(first, dtype=np.int64),
        rows=np.asarray(rows, dtype=np.int64),
        low=records["min"].astype(extreme),
        high=records["max"].astype(extreme),
        total=records["sum"].astype(np.float64),
        finite=records["finite"].astype(np.int32),
        nan=records["nan"].astype(np.int32),
    )


def to_records(stretches: Stretches, record: np.dtype = RECORD) -> np.ndarray:
    """The stored form of stretches (each one a block): (blocks x parameters) of `record`."""
    out = np.empty(stretches.low.shape, dtype=record)
    out["min"], out["max"], out["sum"] = stretches.low, stretches.high, stretches.total
    out["finite"], out["nan"] = stretches.finite, stretches.nan
    return out


def concat(parts: list[Stretches], width: int) -> Stretches:
    """Stretches of consecutive stretches, joined in the order given."""
    parts = [p for p in parts if len(p)]
    if not parts:
        return empty(width)
    if len(parts) == 1:
        return parts[0]
    return Stretches(*(np.concatenate([getattr(p, f) for p in parts]) for f in FIELDS))


def merge(stretches: Stretches, starts: np.ndarray) -> Stretches:
    """Consecutive stretches merged into groups beginning at the indices `starts`."""
    if len(starts) == len(stretches):
        return stretches
    return Stretches(
        first=stretches.first[starts],
        rows=np.add.reduceat(stretches.rows, starts),
        low=_reduce(np.minimum, stretches.low, starts),
        high=_reduce(np.maximum, stretches.high, starts),
        total=_reduce(np.add, stretches.total, starts),
        finite=_reduce(np.add, stretches.finite, starts),
        nan=_reduce(np.add, stretches.nan, starts),
    )


def group(stretches: Stretches, width: int) -> Stretches:
    """Merge stretches into the aligned buckets [j*width, (j+1)*width) they fall in (a stretch never
    straddles one: its blocks are aligned on a size that divides `width`)."""
    if not len(stretches):
        return stretches
    return merge(stretches, breaks(stretches.first // width))


def summary(stretches: Stretches) -> downsample.Summary:
    """What `downsample.summarize` gives for the raw values of each stretch."""
    has_ordered = stretches.low <= stretches.high
    has_nan = stretches.nan > 0
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(stretches.finite > 0, stretches.total / np.maximum(stretches.finite, 1), np.nan)
    return downsample.Summary(
        mean=mean,
        min=np.where(has_ordered, stretches.low.astype(np.float64), np.nan),
        max=np.where(has_ordered & ~has_nan, stretches.high.astype(np.float64), np.nan),
        empty=~(has_ordered | has_nan),
    )


def peak(stretches: Stretches, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """What `downsample.peak` gives for the raw values of the groups of stretches beginning at the
    indices `starts`: (peaks, empty). Only the extremes and NaN counts are merged: a heatmap
    needs no sums, and merging them would triple the cost."""
    low, high = _reduce(np.minimum, stretches.low, starts), _reduce(np.maximum, stretches.high, starts)
    has_nan = _reduce(np.maximum, stretches.nan > 0, starts)
    out = np.where(np.abs(low) > np.abs(high), low, high).astype(np.float64)
    out = np.where(has_nan, np.nan, out)
    return out, ~(has_nan | (low <= high))


def highest_code(stretches: Stretches, starts: np.ndarray) -> np.ndarray:
    """What `downsample.highest_code` gives for grad_status codes, per group of stretches as in
    `peak` (0 for a group without any)."""
    low, high = _reduce(np.minimum, stretches.low, starts), _reduce(np.maximum, stretches.high, starts)
    return np.where(low <= high, high, 0).astype(np.uint8)


# -- which blocks ----------------------------------------------------------------------------


def closed(size: int, last_step: int | None) -> int:
    """Blocks of `size` numbered below this are closed (the run has a step at or after their end)."""
    return 0 if last_step is None else last_step // size


def dirty(new_steps: list[int], before: int | None, after: int) -> dict[int, list[int]]:
    """Per size, the closed blocks to (re)compute after storing `new_steps`, the run's last
    step going from `before` to `after`: those the new steps land in, and the one that held the
    last step (closed now if the run moved past its end). Blocks in between hold no step: every
    stored step was at most `before`."""
    touched = set(new_steps) | ({before} if before is not None else set())
    found = {}
    for size in SIZES:
        limit = closed(size, after)
        found[size] = sorted({s // size for s in touched if s // size < limit})
    return found


def bucket_width(lo: int, hi: int, max_points: int) -> tuple[int, int] | None:
    """(steps per bucket, block size to read) for stored steps lo..hi in at most `max_points`
    buckets aligned on multiples of the width; None when buckets would be narrower than the
    smallest block (read raw steps: at most SIZES[0] x max_points of them)."""
    ideal = (hi - lo + 1) / max_points
    if ideal < SIZES[0]:
        return None
    size = max(s for s in SIZES if s <= ideal)
    width = size * math.ceil(ideal / size)
    while hi // width - lo // width + 1 > max_points:
        width += size
    return width, size


def cover(lo: int, hi: int, last_step: int | None, size: int) -> list[tuple[int, int, int]]:
    """Steps lo..hi as segments, in step order: (S, first block, last block) for closed blocks
    of size S <= `size` lying wholly inside, (RAW, first step, last step) for the rest."""
    out: list[tuple[int, int, int]] = []
    levels = [s for s in SIZES if s <= size]

    def split(a: int, b: int, level: int) -> None:
        if a > b:
            return
        if level < 0:
            out.append((RAW, a, b))
            return
        s = levels[level]
        k0 = -(-a // s)
        k1 = min((b + 1) // s - 1, closed(s, last_step) - 1)
        if k0 > k1:
            split(a, b, level - 1)
            return
        split(a, k0 * s - 1, level - 1)
        out.append((s, k0, k1))
        split((k1 + 1) * s, b, level - 1)

    split(lo, hi, len(levels) - 1)
    return out

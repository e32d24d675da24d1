"""Reads of one series over a window of steps: a scalar, a parameter metric (all parameters or a
few), and the summaries (blocks and raw steps) that serve the long windows of charts.py.

A series is a parameter metric (`kind` "param", one value per parameter) or a scalar ("scalar",
`name` its key).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from sqlalchemy import Connection, and_, func, or_, select

from .. import blocks
from ..protocol import array_dtype
from ..schema import metric_blocks, param_metrics, rank_steps, runs
from ..schema import scalars as scalars_table
from . import rank_rows as _rank_rows
from .blocks_sql import raw_stretches, stored_stretches
from .rows import joined, metric_where, plain_rows, window
from .values import scalar_columns


def scalar_series(
    conn: Connection, run_id: str, key: str, start: int | None, end: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """(steps, float64 values) of one scalar in [start, end], by step."""
    s = scalars_table.c
    rows = plain_rows(
        conn,
        select(s.step, s.value, s.special)
        .where(s.run_id == run_id, s.key == key, *window(s.step, start, end))
        .order_by(s.step),
    )
    found, values = scalar_columns(rows)
    # a rank's run: its steps since migration 0010 are packed rows (kept for the recent window)
    packed = _rank_rows.scalar_series(conn, run_id, key, window(rank_steps.c.step, start, end))
    return _rank_rows.merge_series(found, values, *packed)


def metric_steps(conn: Connection, run_id: str, metric: str, start: int | None, end: int | None) -> np.ndarray:
    """The steps at which a parameter metric is stored, in [start, end]."""
    found = (
        conn.execute(
            select(param_metrics.c.step)
            .where(*metric_where(run_id, metric), *window(param_metrics.c.step, start, end))
            .order_by(param_metrics.c.step)
        )
        .scalars()
        .all()
    )
    return np.array(found, dtype=np.int64)


def metric_rows(
    conn: Connection, run_id: str, metric: str, start: int | None, end: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """(steps, array of shape steps x parameters) of one metric in [start, end]."""
    rows = plain_rows(
        conn,
        select(param_metrics.c.step, param_metrics.c.data)
        .where(*metric_where(run_id, metric), *window(param_metrics.c.step, start, end))
        .order_by(param_metrics.c.step),
    )
    dtype = "<" + array_dtype(metric)
    width = len(rows[0][1]) // np.dtype(dtype).itemsize if rows else 0
    matrix = np.frombuffer(joined(rows, 1), dtype=dtype).reshape(len(rows), width)
    return np.array([r[0] for r in rows], dtype=np.int64), matrix


def last_metric_row(
    conn: Connection, run_id: str, metric: str, start: int | None, end: int | None
) -> tuple[int, np.ndarray] | None:
    """The metric's array at the last stored step in [start, end]."""
    row = conn.execute(
        select(param_metrics.c.step, param_metrics.c.data)
        .where(*metric_where(run_id, metric), *window(param_metrics.c.step, start, end))
        .order_by(param_metrics.c.step.desc())
        .limit(1)
    ).one_or_none()
    if row is None:
        return None
    return row.step, np.frombuffer(row.data, dtype="<" + array_dtype(metric))


def metric_columns(
    conn: Connection, run_id: str, metric: str, indices: Sequence[int], start: int | None, end: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """(steps, array of shape steps x len(indices)): a few parameters, read as blob slices."""
    dtype = np.dtype("<" + array_dtype(metric))
    size = dtype.itemsize
    slices = [func.substr(param_metrics.c.data, i * size + 1, size).label(f"c{n}") for n, i in enumerate(indices)]
    rows = plain_rows(
        conn,
        select(param_metrics.c.step, *slices)
        .where(*metric_where(run_id, metric), *window(param_metrics.c.step, start, end))
        .order_by(param_metrics.c.step),
    )
    matrix = np.frombuffer(joined(rows, 1), dtype=dtype).reshape(len(rows), len(indices))
    return np.array([r[0] for r in rows], dtype=np.int64), matrix


def series_bounds(
    conn: Connection, run_id: str, name: str, start: int | None, end: int | None, kind: str
) -> tuple[int, int] | None:
    """The first and last steps at which a series is stored in [start, end]."""
    table = param_metrics if kind == "param" else scalars_table
    where = [
        table.c.run_id == run_id,
        (table.c.metric if kind == "param" else table.c.key) == name,
        *window(table.c.step, start, end),
    ]
    # two queries: each is one index probe
    lo = conn.execute(select(func.min(table.c.step)).where(*where)).scalar()
    hi = conn.execute(select(func.max(table.c.step)).where(*where)).scalar()
    return None if lo is None or hi is None else (int(lo), int(hi))


def series_count(conn: Connection, run_id: str, name: str, lo: int, hi: int, kind: str) -> int:
    """How many steps of a series are stored in [lo, hi], counted from the closed blocks that
    cover it and from the raw rows of the rest: three small queries whatever the span."""
    table = param_metrics if kind == "param" else scalars_table
    named = (table.c.metric if kind == "param" else table.c.key) == name
    c = metric_blocks.c
    last = conn.execute(select(runs.c.last_step).where(runs.c.id == run_id)).scalar()
    segments = blocks.cover(lo, hi, last, blocks.SIZES[-1])
    raw = [table.c.step.between(a, b) for size, a, b in segments if size == blocks.RAW]
    stored = [and_(c.size == size, c.block.between(a, b)) for size, a, b in segments if size != blocks.RAW]
    total = 0
    if raw:
        total += conn.execute(
            select(func.count()).select_from(table).where(table.c.run_id == run_id, named, or_(*raw))
        ).scalar_one()
    if stored:  # every block has a part 0 (a run without parameters has no param blocks)
        total += conn.execute(
            select(func.coalesce(func.sum(c.step_count), 0)).where(
                c.run_id == run_id, c.kind == kind, c.metric == name, c.part == 0, or_(*stored)
            )
        ).scalar_one()
    return int(total)


def series_stretches(
    conn: Connection, run_id: str, name: str, lo: int, hi: int, size: int, indices: Sequence[int] | None, kind: str
) -> blocks.Stretches:
    """Summaries covering steps [lo, hi] of a series, in step order: its closed blocks of at
    most `size` steps lying wholly inside, and single raw steps elsewhere (blocks.cover), for
    the parameters `indices` or all of them (a scalar has one column)."""
    run = conn.execute(select(runs.c.last_step, runs.c.param_count).where(runs.c.id == run_id)).one_or_none()
    width = (
        1 if kind == "scalar" else len(indices) if indices is not None else (run.param_count if run is not None else 0)
    )
    if run is None:
        return blocks.empty(width)
    found = [
        raw_stretches(conn, run_id, kind, name, a, b, indices)
        if size_ == blocks.RAW
        else stored_stretches(conn, run_id, kind, name, size_, a, b, indices)
        for size_, a, b in blocks.cover(lo, hi, run.last_step, size)
    ]
    return blocks.concat(found, width)

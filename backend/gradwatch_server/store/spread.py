"""The per-rank scalars of a job's recent steps, for the spread across its ranks (rank_spread.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from sqlalchemy import Connection, func, or_, select

from ..schema import runs, scalars

#: The per-rank memory scalars: a CUDA device's allocated bytes (the lowest device a rank
#: reports), else the process's resident set.
CUDA_ALLOCATED = "mem/cuda:%/allocated"
RSS = "mem/rss_bytes"
MEMORY = "memory"


def rank_scalars(conn: Connection, job: str, key: str, window: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rank, step, value) of `key` in the job's ranks' runs over the last `window` steps any
    rank stored (`memory`: each rank's memory scalar), as arrays; non-finite values as NaN."""
    last = conn.execute(select(func.max(runs.c.last_step)).where(runs.c.parent_id == job)).scalar()
    if last is None:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)
    keys = or_(scalars.c.key.like(CUDA_ALLOCATED), scalars.c.key == RSS) if key == MEMORY else scalars.c.key == key
    rows: Sequence[Any] = conn.execute(
        select(runs.c.rank, scalars.c.step, scalars.c.key, scalars.c.value)
        .join(runs, runs.c.id == scalars.c.run_id)
        .where(runs.c.parent_id == job, keys, scalars.c.step > last - window)
        .order_by(runs.c.rank, scalars.c.step, scalars.c.key)
    ).all()
    if key == MEMORY:
        rows = _memory_rows(rows)
    rank = np.fromiter((r[0] for r in rows), np.int64, len(rows))
    step = np.fromiter((r[1] for r in rows), np.int64, len(rows))
    value = np.array([np.nan if r[3] is None else r[3] for r in rows], dtype=np.float64)
    return rank, step, value


def _memory_rows(rows: Sequence[Any]) -> list[Any]:
    """One row per (rank, step): the lowest CUDA device's allocated bytes, else the resident set."""
    best: dict[tuple[int, int], tuple[int, Any]] = {}
    for r in rows:
        order = int(r[2].split(":")[1].split("/")[0]) if r[2] != RSS else 1 << 30
        at = (r[0], r[1])
        if at not in best or order < best[at][0]:
            best[at] = (order, r)
    return [best[at][1] for at in sorted(best)]

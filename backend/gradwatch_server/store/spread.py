"""The per-rank figures of a job's recent steps, for the spread across its ranks (rank_spread.py),
read from the ranks' step summaries (rank_summaries: kept for the whole job, where a rank's own
scalars are kept only for a recent window)."""

from __future__ import annotations

import numpy as np
from sqlalchemy import Connection, func, select

from ..schema import rank_summaries, runs

#: The spread's metrics and the summary column each reads ("memory": a rank's lowest CUDA
#: device's allocated bytes, else its resident set; store/jobs.py `summary`).
COLUMNS = {
    "time/step_s": rank_summaries.c.step_s,
    "time/before_backward_s": rank_summaries.c.before_backward_s,
    "memory": rank_summaries.c.memory_bytes,
    "grad_norm_total": rank_summaries.c.local_norm,
}


def rank_scalars(conn: Connection, job: str, key: str, window: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rank, step, value) of `key` (a COLUMNS name) in the job's rank summaries over the last
    `window` steps any rank's summary has, as arrays; a value not sent (or not finite) as NaN."""
    column = COLUMNS[key]
    ranks = select(runs.c.id, runs.c.rank).where(runs.c.parent_id == job).subquery()
    s = rank_summaries.c
    last = conn.execute(select(func.max(s.step)).join(ranks, ranks.c.id == s.run_id)).scalar()
    if last is None:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)
    rows = conn.execute(
        select(ranks.c.rank, s.step, column)
        .join(ranks, ranks.c.id == s.run_id)
        .where(s.step > last - window)
        .order_by(ranks.c.rank, s.step)
    ).all()
    rank = np.fromiter((r[0] for r in rows), np.int64, len(rows))
    step = np.fromiter((r[1] for r in rows), np.int64, len(rows))
    value = np.array([np.nan if r[2] is None else r[2] for r in rows], dtype=np.float64)
    return rank, step, value

"""The spread of a per-rank figure across a job's ranks (rank_spread.py): its quantiles at each
step, written by the assembly from the ranks' step summaries (`rank_spread`, a row per job, metric
and step), and the ranks' own values over the window's last steps, for the outlier ranks, read
from the summaries (rank_steps' summary columns, rank_summaries' before migration 0010: kept for
the whole job, where a rank's own scalars are kept only for a recent window).

Why a table of quantiles: a window of 300 steps of a 1,024-rank job is 307,200 summaries, about
1.5 s to read and sort per request on a small machine, where 300 rows of quantiles read in a few
milliseconds. The outliers are judged on the window's last steps holding at most OUTLIER_VALUES
rank values (16 steps at 1,024 ranks, the whole window of a small job): a rank's median over
them tells a straggler as well, at a bounded cost.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import Connection, delete, insert, select

from ..jobs.rank_spread import QUANTILES, step_quantiles
from ..schema import rank_spread, runs, steps
from .rank_rows import summaries

#: The spread's metrics and the summary column each reads ("memory": a rank's lowest CUDA
#: device's allocated bytes, else its resident set; rank_rows.summary_values).
COLUMNS = {
    "time/step_s": "step_s",
    "time/before_backward_s": "before_backward_s",
    "memory": "memory_bytes",
    "grad_norm_total": "local_norm",
}
#: Rank values the outliers are judged on at most: the window's last steps up to this many.
OUTLIER_VALUES = 16_384
_EDGES = ("lo", "p5", "p50", "p95", "hi")
assert len(_EDGES) == len(QUANTILES)


@dataclass(frozen=True)
class SpreadRows:
    """A metric's spread over a job's window: per step (`steps`) the quantiles across its ranks
    (`quantiles[k]`: QUANTILES[k], NaN where the step has no finite value), and the ranks' values
    over the window's last steps (`rank`, `step`, `value`: NaN where not sent), for the outliers."""

    steps: np.ndarray
    quantiles: np.ndarray
    rank: np.ndarray
    step: np.ndarray
    value: np.ndarray

    @staticmethod
    def empty() -> SpreadRows:
        i, f = np.zeros(0, np.int64), np.zeros(0)
        return SpreadRows(i, np.zeros((len(QUANTILES), 0)), i, i, f)


def spread_rows(job: str, summaries: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The `rank_spread` rows of the steps of `summaries` (rank_summaries rows, as the assembly
    inserts them: a value not sent or not finite is None): per step and metric, the count of
    finite values and their quantiles."""
    by_step: dict[int, list[Mapping[str, Any]]] = {}
    for s in summaries:
        by_step.setdefault(int(s["step"]), []).append(s)
    out: list[dict[str, Any]] = []
    for step, found in sorted(by_step.items()):
        for metric, column in COLUMNS.items():
            values = np.array([np.nan if s[column] is None else s[column] for s in found], np.float64)
            out.append(_row(job, metric, step, values))
    return out


def _row(job: str, metric: str, step: int, values: np.ndarray) -> dict[str, Any]:
    finite = values[np.isfinite(values)]
    return {
        "run_id": job,
        "metric": metric,
        "step": step,
        "count": len(finite),
        **dict(zip(_EDGES, step_quantiles(finite), strict=True)),
    }


def write_spread(conn: Connection, job: str, summaries: Sequence[Mapping[str, Any]]) -> None:
    """Store the spread of the steps of `summaries`, every rank's summary of them (the assembly's
    transaction: the summaries' own insert)."""
    rows = spread_rows(job, summaries)
    if rows:
        conn.execute(insert(rank_spread), rows)


def rewrite_spread(conn: Connection, job: str, wanted: Sequence[int]) -> None:
    """Compute again the spread of the job's steps `wanted` from every summary they have now (a
    partial step completed: the late ranks' summaries were just added)."""
    if not wanted:
        return
    conn.execute(delete(rank_spread).where(rank_spread.c.run_id == job, rank_spread.c.step.in_(wanted)))
    table = summaries()
    s = table.c
    found = conn.execute(
        select(s.step, *(s[c] for c in COLUMNS.values()))
        .select_from(table.join(runs, runs.c.id == s.run_id))
        .where(runs.c.parent_id == job, s.step.in_(wanted))
    ).all()
    write_spread(conn, job, [r._asdict() for r in found])


def read_spread(conn: Connection, job: str, key: str, window: int, outlier_values: int = OUTLIER_VALUES) -> SpreadRows:
    """`key`'s spread (a COLUMNS name) over the job's last `window` steps: its `rank_spread` rows,
    computed from the summaries for steps that have none (assembled before migration 0008), and
    the ranks' values over the window's last steps holding at most `outlier_values` of them."""
    job_row = conn.execute(select(runs.c.last_step, runs.c.world_size).where(runs.c.id == job)).one_or_none()
    if job_row is None or job_row.last_step is None:
        return SpreadRows.empty()
    last, after = int(job_row.last_step), int(job_row.last_step) - window
    r = rank_spread.c
    stored = {
        int(row.step): [np.nan if v is None else v for v in row[1:]]
        for row in conn.execute(
            select(r.step, *(r[e] for e in _EDGES)).where(r.run_id == job, r.metric == key, r.step > after)
        )
    }
    have = list(conn.execute(select(steps.c.step).where(steps.c.run_id == job, steps.c.step > after)).scalars())
    missing = sorted(int(s) for s in have if s not in stored)
    if missing:
        rank, step, value = rank_values(conn, job, key, missing[0] - 1, missing[-1])
        for s in np.unique(step).tolist():
            if s in missing:
                row = _row(job, key, s, value[step == s])
                stored[s] = [np.nan if row[e] is None else row[e] for e in _EDGES]
    ordered = sorted(stored)
    quantiles = np.array([stored[s] for s in ordered], np.float64).T.reshape(len(QUANTILES), len(ordered))
    recent = max(1, outlier_values // max(1, job_row.world_size or 1))
    rank, step, value = rank_values(conn, job, key, max(after, last - recent), last)
    return SpreadRows(np.array(ordered, np.int64), quantiles, rank, step, value)


def rank_values(
    conn: Connection, job: str, key: str, after: int, last: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rank, step, value) of `key` in the job's rank summaries of steps `after`+1..`last`, by
    rank and step, as arrays; a value not sent (or not finite) as NaN."""
    table = summaries()
    s = table.c
    rows = conn.execute(
        select(runs.c.rank, s.step, s[COLUMNS[key]])
        .select_from(table.join(runs, runs.c.id == s.run_id))
        .where(runs.c.parent_id == job, s.step > after, s.step <= last)
        .order_by(runs.c.rank, s.step)
    ).all()
    rank = np.fromiter((r[0] for r in rows), np.int64, len(rows))
    step = np.fromiter((r[1] for r in rows), np.int64, len(rows))
    value = np.array([np.nan if r[2] is None else r[2] for r in rows], dtype=np.float64)
    return rank, step, value

"""A distributed job's partial steps as ranges (docs/api.md, Ranks): the steps of the job's run
assembled without some rank, grouped by the database. The writes belong to the assembly (store/jobs.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from sqlalchemy import Connection, func, select

from ..schema import partial_steps, steps


@dataclass(frozen=True)
class PartialRange:
    """Consecutive stored steps of a job's run (no complete step between them) assembled without
    the same ranks: steps `first`..`last`, `steps` of them, without the ranks `missing`."""

    first: int
    last: int
    steps: int
    missing: list[int]


def partial_ranges(conn: Connection, run_id: str) -> list[PartialRange]:
    """The job's partial steps grouped into ranges, in step order.

    "Consecutive" is among the run's stored steps (a run sampled every 10 steps has 10, 20, 30
    in one range): each stored step is numbered in order, and partial steps whose number minus
    their number among the steps missing the same ranks is equal form one range (gaps and
    islands), computed by the database in one pass over the run's steps.
    """
    numbered = (
        select(
            steps.c.step,
            partial_steps.c.missing,
            func.row_number().over(order_by=steps.c.step).label("i"),
        )
        .select_from(
            steps.outerjoin(
                partial_steps, (partial_steps.c.run_id == steps.c.run_id) & (partial_steps.c.step == steps.c.step)
            )
        )
        .where(steps.c.run_id == run_id)
        .subquery()
    )
    islands = (
        select(
            numbered.c.step,
            numbered.c.missing,
            (numbered.c.i - func.row_number().over(partition_by=numbered.c.missing, order_by=numbered.c.step)).label(
                "island"
            ),
        )
        .where(numbered.c.missing.is_not(None))
        .subquery()
    )
    first = func.min(islands.c.step)
    rows = conn.execute(
        select(first, func.max(islands.c.step), func.count(), islands.c.missing)
        .group_by(islands.c.missing, islands.c.island)
        .order_by(first)
    ).all()
    return [PartialRange(int(a), int(b), int(n), sorted(int(r) for r in json.loads(m))) for a, b, n, m in rows]

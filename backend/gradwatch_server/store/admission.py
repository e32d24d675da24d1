"""A crowd of one job's rank hellos opened in one transaction (a job's start: 1,024 hellos).

`open_ranks` does what `jobs.open_rank` does for each hello, with a few statements for the whole
batch instead of eight per hello: the job's row is locked, created or checked once; each hello is
checked against it (its digest against the job's, else row by row); the new ranks' runs are
inserted together and read back together. A hello refused (ParamsMismatch) is refused before it
writes anything, so the others of its batch go on.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, delete, insert, select, update

from ..protocol import Hello
from ..schema import deleted_runs, runs
from .jobs import OpenedRank, check_params
from .param_lists import ParamLists
from .records import OpenedRun, ParamsMismatch
from .runs import open_run, run_details, run_row, to_run

#: Most ranks' runs one statement inserts or reads (bound parameters stay well within limits).
CHUNK = 500


def open_ranks(
    conn: Connection, hellos: Sequence[Hello], now: float, lists: ParamLists
) -> list[OpenedRank | ParamsMismatch]:
    """Open the runs of `hellos`, ranks of one job, and the job's run; per hello, what its
    `open_rank` would have returned, or the ParamsMismatch it would have raised."""
    job_id = hellos[0].dist.job if hellos[0].dist is not None else ""
    out: list[OpenedRank | ParamsMismatch | None] = [None] * len(hellos)
    job = _lock_job(conn, job_id)
    created_by: int | None = None
    ok: list[int] = []
    for i, hello in enumerate(hellos):
        dist = hello.dist
        assert dist is not None and dist.job == job_id
        try:
            if job is None:
                open_run(conn, hello, now, run_id=job_id, world_size=dist.world_size)
                job, created_by = _lock_job(conn, job_id), i
                assert job is not None
            else:
                if job.kind != "job":
                    raise ParamsMismatch(
                        f"run {job_id!r} exists and is not a distributed job's run; give the job another run id"
                    )
                if job.world_size != dist.world_size:
                    raise ParamsMismatch(
                        f"job {job_id!r} has world_size {job.world_size}; rank {dist.rank} says {dist.world_size}"
                    )
                if hello.params_digest is None or hello.params_digest != lists.job_digest(conn, job_id, job.created_at):
                    check_params(conn, job_id, dist.rank, hello)
        except ParamsMismatch as exc:
            out[i] = exc
            continue
        ok.append(i)
    if not ok:
        return [o for o in out if o is not None]
    assert job is not None
    resumed = created_by is None and job.status != "running"
    if resumed:
        conn.execute(update(runs).where(runs.c.id == job_id).values(status="running", finished_at=None, updated_at=now))

    ids = [hellos[i].run.id for i in ok]
    existing: dict[str, str] = {}
    for lo in range(0, len(ids), CHUNK):
        for r in conn.execute(
            select(runs.c.id, runs.c.status).where(runs.c.id.in_(ids[lo : lo + CHUNK])).with_for_update()
        ):
            existing[r.id] = r.status
    new: dict[str, int] = {}  # a rank's run id -> the hello that creates it (a rank twice: the first)
    for i in ok:
        hello = hellos[i]
        pieces = json.dumps(hello.rank_pieces().model_dump(), separators=(",", ":"))
        run_id = hello.run.id
        if run_id in existing or run_id in new:
            conn.execute(
                update(runs)
                .where(runs.c.id == run_id)
                .values(status="running", finished_at=None, updated_at=now, pieces=pieces)
            )
            continue
        new[run_id] = i
    rows = []
    for run_id, i in new.items():
        dist = hellos[i].dist
        assert dist is not None
        rows.append(run_row(hellos[i], now, run_id, job_id, dist.rank, dist.world_size, None))
        rows[-1]["pieces"] = json.dumps(hellos[i].rank_pieces().model_dump(), separators=(",", ":"))
    new_ids = list(new)
    for lo in range(0, len(rows), CHUNK):
        conn.execute(delete(deleted_runs).where(deleted_runs.c.id.in_(new_ids[lo : lo + CHUNK])))
        conn.execute(insert(runs), rows[lo : lo + CHUNK])

    unique = list(dict.fromkeys(ids))
    opened = {}
    for lo in range(0, len(unique), CHUNK):
        part = unique[lo : lo + CHUNK]
        tags, counts = run_details(conn, part)
        for r in conn.execute(select(runs).where(runs.c.id.in_(part))):
            opened[r.id] = to_run(r, tags, counts)
    parent = to_run(conn.execute(select(runs).where(runs.c.id == job_id)).one(), *run_details(conn, [job_id]))
    first = ok[0]
    for i in ok:
        run_id = hellos[i].run.id
        created = new.get(run_id) == i
        out[i] = OpenedRank(
            rank=OpenedRun(run=opened[run_id], created=created, resumed_from=None if created else existing.get(run_id)),
            job=parent,
            job_created=i == created_by,
            job_resumed=resumed and i == first,
        )
    return [o for o in out if o is not None]


def _lock_job(conn: Connection, job_id: str) -> Any:
    return conn.execute(
        select(runs.c.status, runs.c.world_size, runs.c.kind, runs.c.created_at)
        .where(runs.c.id == job_id)
        .with_for_update()
    ).one_or_none()

"""Runs: open (create or resume from a `hello`), close, crash, rename and tag, delete, list, and
choose what `gradwatch gc` collects; with their parameters, groups and series names."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import ColumnElement, Connection, bindparam, delete, func, insert, or_, select, update

from ..protocol import Hello, Pieces
from ..schema import deleted_runs, findings, groups, params, run_tags, runs, series_names
from .records import (
    SEVERITIES,
    Group,
    OpenedRun,
    Param,
    ParamsMismatch,
    Run,
    UnknownRun,
    no_findings,
)
from .rows import plain_rows
from .values import shape

_LOCK_RUN = (
    select(runs.c.last_seq, runs.c.status, runs.c.last_step, runs.c.steps, runs.c.kind)
    .where(runs.c.id == bindparam("run_id"))
    .with_for_update()
)  # built once: it runs for every stored batch


def lock_run(conn: Connection, run_id: str) -> Any:
    """The run's row, locked for this transaction (FOR UPDATE on PostgreSQL)."""
    row = conn.execute(_LOCK_RUN, {"run_id": run_id}).one_or_none()
    if row is None:
        raise UnknownRun(f"no run {run_id!r}")
    return row


def open_run(
    conn: Connection,
    hello: Hello,
    now: float,
    *,
    run_id: str | None = None,
    parent_id: str | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    pieces: Pieces | None = None,
) -> OpenedRun:
    """Create the run of a `hello`, or resume it (same parameter names, same order).

    `run_id` stands for the hello's run id (a job's run, opened from a rank's hello); a rank's
    run has `parent_id`, `rank` and `world_size`, and `pieces`: it keeps no parameter rows (its
    job's stand for them, checked by the caller) but its pieces of them (local_numel, counted,
    in runs.pieces); a job's run has `world_size` only.
    """
    info = hello.run
    run_id = info.id if run_id is None else run_id
    pieces_json = None if pieces is None else json.dumps(pieces.model_dump(), separators=(",", ":"))
    existing = conn.execute(
        select(runs.c.status, runs.c.kind).where(runs.c.id == run_id).with_for_update()
    ).one_or_none()
    if existing is not None and world_size is None and existing.kind != "run":
        raise ParamsMismatch(
            f"run {run_id!r} is a distributed job's run: only its ranks write to it (a hello with "
            '"dist"); give this run another id'
        )
    if existing is not None and pieces is not None:
        conn.execute(
            update(runs)
            .where(runs.c.id == run_id)
            .values(status="running", finished_at=None, updated_at=now, pieces=pieces_json)
        )
    elif existing is not None:
        stored = (
            conn.execute(select(params.c.name).where(params.c.run_id == run_id).order_by(params.c.idx)).scalars().all()
        )
        sent = [p.name for p in hello.params]
        if stored != sent:
            raise ParamsMismatch(_describe_mismatch(run_id, list(stored), sent))
        conn.execute(update(runs).where(runs.c.id == run_id).values(status="running", finished_at=None, updated_at=now))
    else:
        conn.execute(delete(deleted_runs).where(deleted_runs.c.id == run_id))  # here again: not deleted
        conn.execute(insert(runs).values(**run_row(hello, now, run_id, parent_id, rank, world_size, pieces_json)))
        if hello.params and pieces is None:
            conn.execute(
                insert(params),
                [
                    {
                        "run_id": run_id,
                        "idx": i,
                        "name": p.name,
                        "shape": json.dumps(p.shape),
                        "numel": p.numel,
                        "dtype": p.dtype,
                        "group_idx": p.group,
                        "optimizer_idx": p.optimizer,
                        "local_numel": None,
                        "counted": None,
                    }
                    for i, p in enumerate(hello.params)
                ],
            )
        if hello.groups and pieces is None:
            conn.execute(
                insert(groups),
                [
                    {
                        "run_id": run_id,
                        "optimizer_idx": g.optimizer,
                        "idx": g.index,
                        "name": g.name,
                        "hparams": json.dumps(g.hparams, allow_nan=False),
                    }
                    for g in hello.groups
                ],
            )
    run = to_run(conn.execute(select(runs).where(runs.c.id == run_id)).one(), *run_details(conn, [run_id]))
    return OpenedRun(run=run, created=existing is None, resumed_from=None if existing is None else existing.status)


def run_row(
    hello: Hello,
    now: float,
    run_id: str,
    parent_id: str | None,
    rank: int | None,
    world_size: int | None,
    pieces_json: str | None,
) -> dict[str, Any]:
    """The `runs` row of a run created from `hello` (open_run's arguments)."""
    info = hello.run
    return {
        "id": run_id,
        "name": info.name or (run_id if parent_id is None else parent_id),
        "project": info.project or "default",
        "status": "running",
        "created_at": info.started_at,
        "updated_at": now,
        "finished_at": None,
        "last_seq": 0,
        "steps": 0,
        "last_step": None,
        "param_count": len(hello.params),
        "param_numel": sum(p.numel for p in hello.params),
        "optimizer": info.optimizer,
        "config": json.dumps(info.config, allow_nan=False),
        "hook_version": info.hook_version,
        "parent_id": parent_id,
        "rank": rank,
        "world_size": world_size,
        "kind": "rank" if parent_id is not None else "job" if world_size is not None else "run",
        "pieces": pieces_json,
    }


def close_run(conn: Connection, run_id: str, seq: int, status: str, now: float) -> bool:
    """Apply a `close` message; False if it was applied already. A close resent with the run's
    last seq to a run that is running again (its hook reconnected before the close's ack came, and
    the hello resumed the run) sets its status again: the close was the last message committed."""
    run = lock_run(conn, run_id)
    if seq < run.last_seq or (seq == run.last_seq and run.status != "running"):
        return False
    conn.execute(
        update(runs)
        .where(runs.c.id == run_id)
        .values(
            last_seq=seq,
            status=status,
            finished_at=now,
            updated_at=now,
        )
    )
    return True


def mark_crashed(conn: Connection, run_id: str, idle_since: float, now: float) -> bool:
    """Mark a run crashed if it is running and unchanged since `idle_since`; True if so."""
    result = conn.execute(
        update(runs)
        .where(runs.c.id == run_id, runs.c.status == "running", runs.c.updated_at <= idle_since)
        .values(status="crashed", updated_at=now)
    )
    return result.rowcount > 0


def set_status(conn: Connection, run_id: str, status: str, finished_at: float | None, now: float) -> None:
    conn.execute(update(runs).where(runs.c.id == run_id).values(status=status, finished_at=finished_at, updated_at=now))


def update_run(conn: Connection, run_id: str, name: str | None, tags: Sequence[str] | None) -> bool:
    """Rename a run and/or replace its tags (None: unchanged); False if there is no such run.

    `updated_at` is left alone: it is when the run's data last changed (it ends a crashed
    run's duration and times crash detection), and a label is not data.
    """
    if conn.execute(select(runs.c.id).where(runs.c.id == run_id).with_for_update()).one_or_none() is None:
        return False
    if name is not None:
        conn.execute(update(runs).where(runs.c.id == run_id).values(name=name))
    if tags is not None:
        conn.execute(delete(run_tags).where(run_tags.c.run_id == run_id))
        unique = list(dict.fromkeys(tags))
        if unique:
            conn.execute(insert(run_tags), [{"run_id": run_id, "tag": t, "position": i} for i, t in enumerate(unique)])
    return True


def delete_run(conn: Connection, run_id: str, now: float) -> bool:
    """Delete a run and everything stored for it: every table's rows reference the run with ON
    DELETE CASCADE, on an index that starts with run_id. The id is kept in `deleted_runs` (with
    the time), so that it can be told from one never stored. A distributed job's run takes its
    ranks' runs with it (their parent_id cascades), and their ids are kept too."""
    ranks = list(conn.execute(select(runs.c.id).where(runs.c.parent_id == run_id)).scalars())
    if conn.execute(delete(runs).where(runs.c.id == run_id)).rowcount == 0:
        return False
    gone = [run_id, *ranks]
    conn.execute(delete(deleted_runs).where(deleted_runs.c.id.in_(gone)))
    conn.execute(insert(deleted_runs), [{"id": i, "deleted_at": now} for i in gone])
    return True


def deleted_at(conn: Connection, run_id: str) -> float | None:
    """When the run `run_id` was deleted (Unix seconds), or None: never stored, or stored now."""
    found = conn.execute(select(deleted_runs.c.deleted_at).where(deleted_runs.c.id == run_id)).scalar()
    return None if found is None else float(found)


def runs_to_collect(
    conn: Connection, created_before: float | None, status: str | None, project: str | None
) -> list[Run]:
    """The runs `gradwatch gc` may delete, oldest first: never a running one (it is being
    written), never a rank's run (deleting its job's run deletes it), and only those created before `created_before` (Unix seconds), of `status`
    and of `project`, for each one given."""
    where: list[ColumnElement[bool]] = [
        runs.c.status != "running",
        runs.c.kind != "rank",
    ]  # ranks' runs go with their job's
    if created_before is not None:
        where.append(runs.c.created_at < created_before)
    if status is not None:
        where.append(runs.c.status == status)
    if project is not None:
        where.append(runs.c.project == project)
    return [to_run(r) for r in conn.execute(select(runs).where(*where).order_by(runs.c.created_at, runs.c.id)).all()]


def get_run(conn: Connection, run_id: str) -> Run | None:
    row = conn.execute(select(runs).where(runs.c.id == run_id)).one_or_none()
    return None if row is None else to_run(row, *run_details(conn, [run_id]))


def list_runs(
    conn: Connection, project: str | None, q: str | None, status: str | None, tag: str | None, limit: int, offset: int
) -> tuple[list[Run], int]:
    """Matching runs, newest first, and how many match in all; each with its tags and
    findings counts (two more queries for the page, not two per run). A rank's run of a
    distributed job is never listed: its job's run stands for it."""
    where: list[ColumnElement[bool]] = [runs.c.kind != "rank"]
    if project is not None:
        where.append(runs.c.project == project)
    if status is not None:
        where.append(runs.c.status == status)
    if tag is not None:
        where.append(runs.c.id.in_(select(run_tags.c.run_id).where(run_tags.c.tag == tag)))
    if q:
        where.append(or_(runs.c.name.icontains(q, autoescape=True), runs.c.project.icontains(q, autoescape=True)))
    count = conn.execute(select(func.count()).select_from(runs).where(*where)).scalar_one()
    rows = conn.execute(
        select(runs).where(*where).order_by(runs.c.created_at.desc(), runs.c.id).limit(limit).offset(offset)
    ).all()
    details = run_details(conn, [r.id for r in rows])
    return [to_run(r, *details) for r in rows], count


def running_run_ids(conn: Connection) -> list[str]:
    """The running runs a hook streams to: a job's run is left out (its ranks' runs stand for it)."""
    return list(conn.execute(select(runs.c.id).where(runs.c.status == "running", runs.c.kind != "job")).scalars())


def get_params(conn: Connection, run_id: str) -> list[Param]:
    """The run's parameters by index; plain rows, and each distinct shape decoded once (the run
    page asks for them several times). A rank's run that shares its job's rows (runs.pieces)
    gets the job's, with its own pieces."""
    c = params.c
    rows = plain_rows(
        conn,
        select(c.idx, c.name, c.shape, c.numel, c.dtype, c.group_idx, c.optimizer_idx, c.local_numel, c.counted)
        .where(c.run_id == run_id)
        .order_by(c.idx),
    )
    found = [
        Param(
            index=r[0],
            name=r[1],
            shape=list(shape(r[2])),
            numel=r[3],
            dtype=r[4],
            group=r[5],
            optimizer=r[6],
            local_numel=r[7],
            counted=None if r[8] is None else bool(r[8]),
        )
        for r in rows
    ]
    if found:
        return found
    shared = _shares(conn, run_id)
    if shared is None:
        return found
    job, pieces = shared
    job_params = get_params(conn, job)
    flags = pieces.counted_flags(len(job_params))
    local = pieces.local_numel
    return [
        Param(
            index=p.index,
            name=p.name,
            shape=p.shape,
            numel=p.numel,
            dtype=p.dtype,
            group=p.group,
            optimizer=p.optimizer,
            local_numel=p.numel if local is None else local[i],
            counted=flags[i],
        )
        for i, p in enumerate(job_params)
    ]


def _shares(conn: Connection, run_id: str) -> tuple[str, Pieces] | None:
    """(its job, its pieces) for a rank's run that shares its job's parameter rows, else None."""
    row = conn.execute(select(runs.c.parent_id, runs.c.pieces).where(runs.c.id == run_id)).one_or_none()
    if row is None or row.pieces is None or row.parent_id is None:
        return None
    return row.parent_id, Pieces.model_construct(**json.loads(row.pieces))


def shared_pieces(conn: Connection, run_ids: Sequence[str]) -> dict[str, tuple[list[bool], list[bool]]]:
    """Of the rank runs among `run_ids` that share their job's parameter rows (runs.pieces): per
    run, whether each of its pieces counts and whether each is the whole tensor."""
    out: dict[str, tuple[list[bool], list[bool]]] = {}
    numels: dict[str, list[int]] = {}
    for lo in range(0, len(run_ids), 512):
        for r in conn.execute(
            select(runs.c.id, runs.c.parent_id, runs.c.pieces).where(
                runs.c.id.in_(run_ids[lo : lo + 512]), runs.c.pieces.is_not(None)
            )
        ):
            if r.parent_id not in numels:
                numels[r.parent_id] = list(
                    conn.execute(
                        select(params.c.numel).where(params.c.run_id == r.parent_id).order_by(params.c.idx)
                    ).scalars()
                )
            numel = numels[r.parent_id]
            given = json.loads(r.pieces)
            counted = given["counted"]
            local = given["local_numel"]
            out[r.id] = (
                list(counted) if isinstance(counted, list) else [bool(counted)] * len(numel),
                [True] * len(numel) if local is None else [a == b for a, b in zip(local, numel)],
            )
    return out


def get_groups(conn: Connection, run_id: str) -> list[Group]:
    """The run's param groups (a rank's run that shares its job's parameter rows: the job's)."""
    rows = conn.execute(
        select(groups).where(groups.c.run_id == run_id).order_by(groups.c.optimizer_idx, groups.c.idx)
    ).all()
    if not rows:
        shared = _shares(conn, run_id)
        if shared is not None:
            return get_groups(conn, shared[0])
    return [Group(optimizer=r.optimizer_idx, index=r.idx, name=r.name, hparams=json.loads(r.hparams)) for r in rows]


def get_series_names(conn: Connection, run_id: str, kind: str) -> list[str]:
    """Sorted names of a run's scalar series (`kind="scalar"`) or parameter metrics ("param")."""
    names = (
        conn.execute(select(series_names.c.name).where(series_names.c.run_id == run_id, series_names.c.kind == kind))
        .scalars()
        .all()
    )
    # Sorted here, not by ORDER BY: code-point order on every database, whatever the collation
    # of a PostgreSQL server (en_US sorts "alpha" before "Zeta"; SQLite and Python after).
    return sorted(names)


def to_run(
    row: Any, tags: Mapping[str, list[str]] | None = None, counts: Mapping[str, dict[str, int]] | None = None
) -> Run:
    data = row._asdict()
    data.pop("pieces", None)  # a rank's pieces of its job's parameters: get_params reads them
    data["config"] = json.loads(data["config"])
    data["tags"] = list((tags or {}).get(data["id"], []))
    data["findings"] = dict((counts or {}).get(data["id"]) or no_findings())
    return Run(**data)


def run_details(conn: Connection, run_ids: Sequence[str]) -> tuple[dict[str, list[str]], dict[str, dict[str, int]]]:
    """The tags and the findings counts of these runs: two queries, whatever their number."""
    if not run_ids:
        return {}, {}
    tags: dict[str, list[str]] = {}
    for r in conn.execute(
        select(run_tags.c.run_id, run_tags.c.tag)
        .where(run_tags.c.run_id.in_(run_ids))
        .order_by(run_tags.c.run_id, run_tags.c.position)
    ):
        tags.setdefault(r.run_id, []).append(r.tag)
    counts: dict[str, dict[str, int]] = {}
    for r in conn.execute(
        select(findings.c.run_id, findings.c.severity, func.count().label("n"))
        .where(findings.c.run_id.in_(run_ids))
        .group_by(findings.c.run_id, findings.c.severity)
    ):
        if r.severity in SEVERITIES:
            counts.setdefault(r.run_id, no_findings())[r.severity] = int(r.n)
    return tags, counts


def _describe_mismatch(run_id: str, stored: list[str], sent: list[str]) -> str:
    if len(stored) != len(sent):
        detail = f"it has {len(stored)} parameters, the hello lists {len(sent)}"
    else:
        i = next(i for i, (a, b) in enumerate(zip(stored, sent)) if a != b)
        detail = f"parameter {i} is {stored[i]!r}, the hello says {sent[i]!r}"
    return (
        f"run {run_id!r} already exists with different parameters ({detail}); "
        "start a new run (another run id) for a changed model"
    )

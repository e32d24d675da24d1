"""Distributed jobs: open a rank's run and its job's run from a rank's `hello`, and assemble the
ranks' stored steps into the job's run (docs/protocol.md, "Distributed training").

Each rank streams into its own run `JOB.rRANK` through the ordinary ingest path; `assemble`
then writes into the job's run `JOB`, through the same `write_steps` as any run, every step
that every waited-for rank has and the job's run lacks, in step order (the combination itself:
jobs/assemble.py). A step stored without a lost rank (`partial_steps`) is assembled again, in place,
once every rank it missed has stored it (a dead rank's spool replayed by `gradwatch sync`, a
rank that was only slow): the job's values become exact and the step is no longer partial. It runs in one transaction that first locks the job's row (FOR UPDATE on
PostgreSQL; SQLite has one writer), so ranks that land on different workers never assemble a
step twice.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sqlalchemy import ColumnElement, Connection, bindparam, delete, func, insert, select, update

from .. import tails
from ..jobs import assemble as _assemble
from ..jobs.memory import JobMemory
from ..protocol import Hello
from ..schema import param_metrics, params, partial_steps, rank_steps, runs, scalars, steps
from . import rank_rows as _rank_rows
from . import spread as _spread
from .param_lists import ParamLists
from .records import OpenedRun, ParamsMismatch, Run, StepData, StoredStep
from .rows import plain_rows
from .runs import open_run, shared_pieces, to_run
from .steps import NotifyInTransaction, SeriesName, Written, write_steps
from .values import decode_scalars

#: Most steps one assembly reads per rank (the caller asks again while `more`).
ASSEMBLE_CHUNK = 512
#: Steps of its slowest waited rank one assembly looks at beyond the job's last (the caller asks
#: again while `more`): each rank's stored steps are read in that range only. Reading every step
#: after the job's last made a job that fell behind read ranks x steps behind per assembly, so
#: the lag fed itself (at 1,024 ranks a quarter of the server's CPU).
LOOKAHEAD = 16


#: Steps behind the job's last one whose per-parameter rows each rank's run keeps whole: the
#: Ranks view's recent window. Before it, a rank's per-parameter rows are kept only where they
#: tell what the job's global row cannot: its steps of a `rank_desync` (the job's step has
#: `dist/desync/rR` scalars) and those the job still misses a rank on (a partial step is
#: assembled again from them). Its scalars go with them; its summary (rank_summaries) stays.
RANK_WINDOW = 100
#: Rank rows are pruned in one statement per this many assembled steps.
PRUNE_EVERY = 25


@dataclass(frozen=True)
class OpenedRank:
    """What a rank's hello did: its own run (`rank`), and its job's (`job`: created with this
    hello, or `job_resumed` from a status other than running)."""

    rank: OpenedRun
    job: Run
    job_created: bool
    job_resumed: bool


@dataclass
class Assembly:
    """What one `assemble` did: the steps it stored in the job's run, whether more may be ready
    (ask again), and the job's new status if it changed (every rank closed or lost)."""

    steps: list[StepData] = field(default_factory=list)
    partial: dict[int, list[int]] = field(default_factory=dict)
    #: partial steps assembled again now that their missing ranks sent them (not in `steps`:
    #: they were stored, judged and sent to browsers before)
    completed: list[int] = field(default_factory=list)
    more: bool = False
    status: str | None = None
    steps_before: int = 0  # the job's run's stored steps before these
    written: Written | None = None
    last_step: int | None = None  # the job's run's last step after this assembly
    #: a rank waited for has not said hello yet: no step can be ready until it does (or is lost)
    unheard: bool = False


@dataclass
class _Rank:
    rank: int
    run_id: str | None  # None: this rank never said hello
    status: str | None
    last_step: int | None
    heard: float | None  # server time it last wrote (its run's updated_at); None: never said hello

    def behind(self, step: int | None) -> bool:
        return step is not None and (self.last_step is None or self.last_step < step)


def open_rank(conn: Connection, hello: Hello, now: float, lists: ParamLists) -> OpenedRank:
    """Open a rank's run and its job's run (the first hello of any rank creates the job's run
    from its own name, project, config, parameters and groups). A rank whose parameters
    (names, shapes) or world size differ from the job's is refused, saying which; one whose
    `params_digest` is its job's is not compared row by row. The rank's run shares the job's
    parameter rows and keeps its own pieces (runs.pieces)."""
    dist = hello.dist
    assert dist is not None
    job = conn.execute(
        select(runs.c.status, runs.c.world_size, runs.c.kind, runs.c.created_at)
        .where(runs.c.id == dist.job)
        .with_for_update()
    ).one_or_none()
    if job is not None:
        if job.kind != "job":
            raise ParamsMismatch(
                f"run {dist.job!r} exists and is not a distributed job's run; give the job another run id"
            )
        if job.world_size != dist.world_size:
            raise ParamsMismatch(
                f"job {dist.job!r} has world_size {job.world_size}; rank {dist.rank} says {dist.world_size}"
            )
        if hello.params_digest is None or hello.params_digest != lists.job_digest(conn, dist.job, job.created_at):
            check_params(conn, dist.job, dist.rank, hello)
        if job.status != "running":
            conn.execute(
                update(runs).where(runs.c.id == dist.job).values(status="running", finished_at=None, updated_at=now)
            )
    else:
        open_run(conn, hello, now, run_id=dist.job, world_size=dist.world_size)
    rank = open_run(
        conn, hello, now, parent_id=dist.job, rank=dist.rank, world_size=dist.world_size, pieces=hello.rank_pieces()
    )
    parent = to_run(conn.execute(select(runs).where(runs.c.id == dist.job)).one())
    return OpenedRank(
        rank=rank,
        job=parent,
        job_created=job is None,
        job_resumed=job is not None and job.status != "running",
    )


def check_params(conn: Connection, job: str, rank: int, hello: Hello) -> None:
    stored = [
        (r.name, json.loads(r.shape))
        for r in conn.execute(
            select(params.c.name, params.c.shape).where(params.c.run_id == job).order_by(params.c.idx)
        )
    ]
    sent = [(p.name, list(p.shape)) for p in hello.params]
    if stored == sent:
        return
    differ: list[str] = []
    known, given = dict(stored), dict(sent)
    for name, shape in sent:
        if name not in known:
            differ.append(f"{name!r} is not in the job")
        elif known[name] != shape:
            differ.append(f"{name!r} has shape {shape}, the job's is {known[name]}")
    differ += [f"{name!r} is missing" for name, _ in stored if name not in given]
    if not differ:
        differ.append("the parameters are in another order")
    more = f" (and {len(differ) - 5} more)" if len(differ) > 5 else ""
    raise ParamsMismatch(f"rank {rank}'s parameters differ from those of job {job!r}: " + "; ".join(differ[:5]) + more)


def _ranks(conn: Connection, job: str, world_size: int) -> list[_Rank]:
    found = {
        r.rank: _Rank(r.rank, r.id, r.status, r.last_step, r.updated_at)
        for r in conn.execute(
            select(runs.c.id, runs.c.rank, runs.c.status, runs.c.last_step, runs.c.updated_at).where(
                runs.c.parent_id == job
            )
        )
    }
    return [found.get(r) or _Rank(r, None, None, None, None) for r in range(world_size)]


def _lost_ranks(
    ranks: Sequence[_Rank], now: float, rank_timeout: float, since: float, memory: JobMemory | None = None
) -> set[int]:
    """The job's lost ranks (`_lost`), in one pass: how far the others got is, for every rank,
    the furthest rank's last step, or the second furthest's for the furthest itself (a pass per
    rank over the others was a million comparisons a read of a silent 1,024-rank job)."""
    furthest = sorted(((r.last_step, r.rank) for r in ranks if r.last_step is not None), reverse=True)[:2]
    closed = all(o.status not in (None, "running") for o in ranks if o.run_id is not None)

    def others(rank: int) -> int | None:
        return next((step for step, r in furthest if r != rank), None)

    return {r.rank for r in ranks if _lost(r, others(r.rank), closed, now, rank_timeout, since, memory)}


def _lost(
    rank: _Rank,
    others: int | None,
    closed: bool,
    now: float,
    rank_timeout: float,
    since: float,
    memory: JobMemory | None = None,
) -> bool:
    """A running rank (or one that never said hello) that sent nothing for `rank_timeout` while
    another rank is ahead (`others`: the furthest other rank's last step); or one that never said
    hello, once every rank that did has closed (`closed`: nobody is left to be ahead of it, a job
    that watched rank 0 only).

    Silence counts from its last write, or from `since` if later: when this server process first
    saw the job. Nothing is written while the server is down, so after a restart every rank gets
    a full `rank_timeout` to come back and replay its spool. A rank is also heard of when it last
    sent a frame to the asking process (`memory`), and now while its hello or steps wait on that
    process's writer: a crowd of hellos or a writer behind makes ranks slow, not silent."""
    heard = since if rank.heard is None else max(rank.heard, since)
    here = None if memory is None else memory.heard.last(rank.rank, now)
    heard = heard if here is None else max(heard, here)
    if rank.status not in (None, "running") or now - heard < rank_timeout:
        return False
    if rank.behind(others):
        return True
    return rank.run_id is None and closed


def _pieces_info(
    conn: Connection, run_ids: Sequence[str], memory: JobMemory
) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
    """Per rank's run, whether each parameter's piece counts; and which parameters are the
    full tensor on every rank (DDP replicas: `rank_desync` applies to those). A rank's run
    keeps its parameters (a resuming hello must list the same), so each is read once into
    `memory`."""
    todo = [r for r in run_ids if r not in memory.counted]
    counted: dict[str, list[bool]] = {}
    full: dict[str, list[bool]] = {}
    for lo in range(0, len(todo), ASSEMBLE_CHUNK):
        for r in conn.execute(
            select(params.c.run_id, params.c.numel, params.c.local_numel, params.c.counted)
            .where(params.c.run_id.in_(todo[lo : lo + ASSEMBLE_CHUNK]))
            .order_by(params.c.run_id, params.c.idx)
        ):
            counted.setdefault(r.run_id, []).append(r.counted is None or bool(r.counted))
            full.setdefault(r.run_id, []).append(r.local_numel is None or r.local_numel == r.numel)
    for run_id, (flags, whole) in shared_pieces(conn, [r for r in todo if r not in counted]).items():
        counted[run_id], full[run_id] = flags, whole
    for run_id in counted:
        memory.counted[run_id] = np.array(counted[run_id], dtype=bool)
        memory.full[run_id] = np.array(full[run_id], dtype=bool)
    known = tuple(r for r in run_ids if r in memory.full)
    if memory.replicated is None or memory.replicated[0] != known:  # once per set of ranks, not per step
        memory.replicated = (known, np.logical_and.reduce([memory.full[r] for r in known]) if known else None)
    return {r: memory.counted[r] for r in known}, memory.replicated[1]


def _rank_steps(
    conn: Connection, wanted: dict[int, tuple[str, Sequence[int]]], memory: JobMemory
) -> dict[int, list[StoredStep]]:
    """Per rank, its steps `wanted` (rank -> its run and the steps, sorted), every series: from
    `memory` where it holds them (the ranks connected to this process), the others read back
    from their runs all at once (`_read`)."""
    out: dict[int, list[StoredStep]] = {}
    missing: dict[str, list[int]] = {}
    of_run: dict[str, int] = {}
    for rank, (run_id, steps_) in wanted.items():
        mine = out.setdefault(rank, [])
        for s in steps_:
            sent = memory.take(rank, s)
            if sent is None:
                missing.setdefault(run_id, []).append(s)
                of_run[run_id] = rank
            else:
                mine.append(
                    StoredStep(
                        step=s, seq=0, time=sent.time, scalars=sent.scalars, arrays=sent.arrays, digest=sent.digest
                    )
                )
    if missing:
        for run_id, records in _read(conn, missing, _legacy(conn, memory)).items():
            out[of_run[run_id]] = sorted([*out[of_run[run_id]], *records], key=lambda r: r.step)
    return out


def _legacy(conn: Connection, memory: JobMemory) -> bool:
    """Whether the job's ranks have steps stored before migration 0010 (asked once per job)."""
    if memory.legacy is None:
        memory.legacy = _rank_rows.legacy_ranks(conn, list(memory.rank_runs))
    return memory.legacy


def _read(conn: Connection, wanted: dict[str, list[int]], legacy: bool = True) -> dict[str, list[StoredStep]]:
    """Ranks' stored steps `wanted` (run -> steps), every series and a replica's digest, in one
    query per table per ASSEMBLE_CHUNK runs: their `rank_steps` rows, their arrays, and (`legacy`)
    their rows of before migration 0010. With `serve --workers N` an assembly reads back every
    step of the ranks connected to the other workers: read rank by rank, that would cost a
    worker more than its own frames."""
    records: dict[str, dict[int, StoredStep]] = {r: {} for r in wanted}
    ids = sorted(wanted)
    if not ids:
        return {}
    lo = min(min(w) for w in wanted.values())
    hi = max(max(w) for w in wanted.values())
    want = {(r, s) for r, w in wanted.items() for s in w}
    heads, c, p = _rank_rows.step_heads(legacy).c, scalars.c, param_metrics.c
    for at in range(0, len(ids), ASSEMBLE_CHUNK):
        chunk = ids[at : at + ASSEMBLE_CHUNK]
        for r in conn.execute(
            select(heads.run_id, heads.step, heads.seq, heads.time).where(
                heads.run_id.in_(chunk), heads.step.between(lo, hi)
            )
        ):
            if (r.run_id, r.step) in want:
                records[r.run_id][r.step] = StoredStep(step=r.step, seq=r.seq, time=r.time)
        if legacy:
            rows = conn.execute(
                select(c.run_id, c.key, c.step, c.value, c.special).where(c.run_id.in_(chunk), c.step.between(lo, hi))
            ).all()
            for row, value in zip(rows, decode_scalars(rows).tolist()):
                record = records[row.run_id].get(row.step)
                if record is not None:
                    record.scalars[row.key] = value
        for a in conn.execute(
            select(p.run_id, p.metric, p.step, p.data, p.dtype).where(p.run_id.in_(chunk), p.step.between(lo, hi))
        ):
            record = records[a.run_id].get(a.step)
            if record is not None:
                record.arrays[a.metric] = np.frombuffer(a.data, dtype="<" + a.dtype)
        _rank_rows.fill_runs(conn, chunk, records, lo, hi)
    return {r: [found[s] for s in sorted(found)] for r, found in records.items()}


def assemble(
    conn: Connection,
    job: str,
    now: float,
    rank_timeout: float,
    since: float,
    known: set[SeriesName],
    run_tails: tails.Tails,
    notify: NotifyInTransaction | None,
    late: Sequence[int] = (),
    memory: JobMemory | None = None,
) -> Assembly:
    """Store in the job's run the steps ready to assemble (at most ASSEMBLE_CHUNK), mark those
    missing a rank in `partial_steps`, and once every rank has closed or is lost (and nothing is
    left), set the job's status: finished if every rank that said hello finished, else crashed.
    `late`: steps a rank has just stored; those that were partial and are complete now are
    assembled again (`_complete`).

    A rank is last heard of when its run was last written (server time), or at `since` if later
    (one that never said hello, at `since`): when the caller's process first saw the job (server
    time: the job's `created_at` is the hook's clock)."""
    parent: Any = conn.execute(
        select(runs.c.status, runs.c.world_size, runs.c.last_seq, runs.c.last_step, runs.c.steps, runs.c.kind)
        .where(runs.c.id == job)
        .with_for_update()
    ).one_or_none()
    done = Assembly()
    if parent is None or parent.kind != "job":
        return done
    memory = JobMemory() if memory is None else memory
    done.steps_before = parent.steps
    ranks = _ranks(conn, job, parent.world_size)
    lost = _lost_ranks(ranks, now, rank_timeout, since, memory)
    waited = [r for r in ranks if r.status in (None, "running") and r.rank not in lost]
    done.unheard = any(r.run_id is None for r in waited)
    present = [r for r in ranks if r.run_id is not None]
    have: dict[int, list[int]] = {}
    bound: int | None = None
    memory.rank_runs = [r.run_id for r in present if r.run_id is not None]
    legacy = _legacy(conn, memory)
    horizon = _horizon(conn, waited, parent.last_step, legacy)
    after = _steps_after(conn, memory.rank_runs, parent.last_step, horizon, legacy)
    if horizon is not None and horizon[1]:  # its slowest rank has more beyond: only steps up to here
        bound = horizon[0]
    for r in present:
        found = after[r.run_id] if r.run_id is not None else []
        have[r.rank] = found
        if len(found) == ASSEMBLE_CHUNK:  # this rank has more beyond: only steps up to here are known
            bound = found[-1] if bound is None else min(bound, found[-1])
    candidates = sorted({s for found in have.values() for s in found if bound is None or s <= bound})
    sets = {rank: set(found) for rank, found in have.items()}
    ready: list[int] = []
    gone = {r.rank for r in ranks} - {r.rank for r in waited}  # asked of these, no arrays will come
    for s in candidates:
        if not all(s in sets.get(r.rank, ()) or (r.last_step is not None and r.last_step > s) for r in waited):
            break
        _recall(conn, s, present, sets, memory)
        if memory.waits_on(s, gone):  # a replica's digest differs from rank 0's: its arrays are asked for
            break
        ready.append(s)
    if ready:
        _write(
            conn,
            job,
            parent.world_size,
            parent.last_seq,
            ready,
            present,
            sets,
            now,
            known,
            run_tails,
            notify,
            done,
            memory,
        )
        memory.forget_through(ready[-1])
    done.last_step = max([*ready, *([] if parent.last_step is None else [parent.last_step])], default=None)
    if done.last_step is not None:
        _prune(conn, job, [r.run_id for r in present if r.run_id is not None], done.last_step, memory)
    done.more = bool(ready) and len(ready) == len(candidates) and bound is not None
    if late:
        _complete(conn, job, parent.world_size, late, present, now, known, run_tails, done, memory)
    if not done.more and not waited and len(ready) == len(candidates):
        # Ranks that never said hello were lost waiting (a user who watched rank 0 only): the job
        # finished if every rank that did connect finished; its steps stay partial.
        status = "finished" if all(r.status == "finished" for r in present) else "crashed"
        if parent.status != status:
            conn.execute(update(runs).where(runs.c.id == job).values(status=status, finished_at=now, updated_at=now))
            done.status = status
    return done


def _recall(
    conn: Connection, step: int, present: Sequence[_Rank], sets: dict[int, set[int]], memory: JobMemory
) -> None:
    """Before a digest comparison of `step`: where the memory lacks rank 0's piece or a replica's
    digest (stored before a restart, or through another worker), read them back into it, so that
    a digest stored durably (rank_steps) is compared as one just received. Nothing is read when
    the memory holds every rank's piece of the step (a job on one process, no restart)."""
    runs_of = {r.rank: r.run_id for r in present if r.run_id is not None and step in sets.get(r.rank, ())}
    absent = memory.absent(step, list(runs_of))
    if not absent:
        return
    ids = [runs_of[r] for r in absent]
    digests = {
        run_id
        for lo in range(0, len(ids), ASSEMBLE_CHUNK)
        for run_id in conn.execute(
            select(rank_steps.c.run_id).where(
                rank_steps.c.run_id.in_(ids[lo : lo + ASSEMBLE_CHUNK]),
                rank_steps.c.step == step,
                rank_steps.c.digest.is_not(None),
            )
        ).scalars()
    }
    if not digests and not memory.has_digest(step):
        return
    legacy = _legacy(conn, memory)
    wanted = {runs_of[rank]: [step] for rank in absent if rank == 0 or runs_of[rank] in digests}
    read = _read(conn, wanted, legacy)
    for rank in absent:
        for record in read.get(runs_of[rank], ()):
            memory.recall(rank, record)


def _horizon(
    conn: Connection, waited: Sequence[_Rank], after: int | None, legacy: bool = True
) -> tuple[int, bool] | None:
    """The last step this assembly may find ready, and whether more may be ready beyond it: a
    step is ready only once every waited rank has it or is past it, so none is beyond the
    slowest waited rank's last step, nor (now) beyond its LOOKAHEAD-th step after `after`.
    None: no rank is waited for (every step left is assembled, ASSEMBLE_CHUNK at a time)."""
    if not waited:
        return None
    slowest = min(waited, key=lambda r: -1 if r.last_step is None else r.last_step)
    if slowest.run_id is None or slowest.last_step is None:  # it never said hello or stored a step
        return (-1 if after is None else after), False
    heads = _rank_rows.step_heads(legacy)
    query = select(heads.c.step).where(heads.c.run_id == slowest.run_id)
    if after is not None:
        query = query.where(heads.c.step > after)
    far = conn.execute(query.order_by(heads.c.step).limit(1).offset(LOOKAHEAD - 1)).scalar_one_or_none()
    if far is None or far >= slowest.last_step:
        return slowest.last_step, False
    return int(far), True


def _steps_after(
    conn: Connection,
    run_ids: Sequence[str],
    after: int | None,
    horizon: tuple[int, bool] | None = None,
    legacy: bool = True,
) -> dict[str, list[int]]:
    """Each run's first ASSEMBLE_CHUNK stored steps after step `after` (None: from its first)
    up to the `horizon`'s step, sorted: one query per ASSEMBLE_CHUNK runs (a query per rank cost
    a large job's assembly more than its combination)."""
    out: dict[str, list[int]] = {r: [] for r in run_ids}
    heads = _rank_rows.step_heads(legacy)
    for lo in range(0, len(run_ids), ASSEMBLE_CHUNK):
        where: list[ColumnElement[bool]] = [heads.c.run_id.in_(run_ids[lo : lo + ASSEMBLE_CHUNK])]
        if after is not None:
            where.append(heads.c.step > after)
        if horizon is not None:
            where.append(heads.c.step <= horizon[0])
        order = func.row_number().over(partition_by=heads.c.run_id, order_by=heads.c.step).label("n")
        numbered = select(heads.c.run_id, heads.c.step, order).where(*where).subquery()
        query = (
            select(numbered.c.run_id, numbered.c.step)
            .where(numbered.c.n <= ASSEMBLE_CHUNK)
            .order_by(numbered.c.run_id, numbered.c.step)
        )
        for run_id, step in plain_rows(conn, query):
            out[run_id].append(step)
    return out


def _write(
    conn: Connection,
    job: str,
    world_size: int,
    last_seq: int,
    ready: Sequence[int],
    present: Sequence[_Rank],
    sets: dict[int, set[int]],
    now: float,
    known: set[SeriesName],
    run_tails: tails.Tails,
    notify: NotifyInTransaction | None,
    done: Assembly,
    memory: JobMemory,
    summarize: dict[int, list[int]] | None = None,
) -> None:
    """Combine and store the steps `ready`, and each combined rank step's summary (`summarize`:
    only those of these ranks, by step; None: every rank's)."""
    run_ids = [r.run_id for r in present if r.run_id is not None]
    by_rank = {r.rank: r.run_id for r in present if r.run_id is not None}
    counted, replicated = _pieces_info(conn, run_ids, memory)
    by_step: dict[int, list[_assemble.RankStep]] = {s: [] for s in ready}
    wanted = {r.rank: [s for s in ready if s in sets.get(r.rank, ())] for r in present if r.run_id is not None}
    records = _rank_steps(conn, {rank: (by_rank[rank], w) for rank, w in wanted.items() if w}, memory)
    for r in present:
        if r.run_id is None:
            continue
        for record in records.get(r.rank, ()):
            by_step[record.step].append(
                _assemble.RankStep(
                    r.rank,
                    record.time,
                    record.scalars,
                    record.arrays,
                    counted[r.run_id],
                    record.digest if not _assemble.measured(record.arrays) else None,
                )
            )
    batch: list[StepData] = []
    missing: dict[int, list[int]] = {}
    for i, s in enumerate(ready):
        pieces = by_step[s]
        step = _assemble.combine(pieces)
        if replicated is not None:
            step = _assemble.with_desync(step, pieces, replicated)
        batch.append(
            StepData(seq=last_seq + i + 1, step=s, time=step.time, scalars=step.scalars, arrays=step.raw_arrays())
        )
        absent = sorted(set(range(world_size)) - set(step.ranks))
        if absent:
            missing[s] = absent
    done.written = write_steps(conn, job, batch, now, known, run_tails, notify)
    done.steps = [d for d, new in zip(batch, done.written.stored) if new]
    # the ranks' summaries are their rank_steps rows, stored with their frames: here, their spread
    rows = [
        summary(by_rank[p.rank], s, p)
        for d in done.steps
        for s in [d.step]
        for p in by_step[s]
        if summarize is None or p.rank in summarize.get(s, ())
    ]
    if rows and _legacy(conn, memory):  # steps stored before 0010 have no rank_steps row to hold it
        _rank_rows.keep_legacy_summaries(conn, rows)
    if rows:
        if summarize is None:  # every rank's summary of these steps: their spread across ranks
            _spread.write_spread(conn, job, rows)
        else:  # late ranks of partial steps: the spread of those steps with every rank now
            _spread.rewrite_spread(conn, job, sorted({r["step"] for r in rows}))
    done.partial = {d.step: missing[d.step] for d in done.steps if d.step in missing}
    if done.partial:
        conn.execute(
            insert(partial_steps),
            [{"run_id": job, "step": s, "missing": json.dumps(m)} for s, m in done.partial.items()],
        )
    _drop_unmeasured(conn, done, by_step, by_rank)


#: The per-parameter metric a measured step has (an unmeasured one: passes and clears only).
MEASURED = "grad_norm"


def _drop_unmeasured(
    conn: Connection, done: Assembly, by_step: dict[int, list[_assemble.RankStep]], by_rank: dict[int, str]
) -> None:
    """Delete the ranks' per-parameter rows of the steps just stored that the job did not measure
    (with every=N, a rank's passes and clears): they tell nothing that the job's row (their
    combination) and the rank's summary do not, so a rank's unmeasured step keeps its summary
    and, for the recent window, its scalars. In the assembly's transaction: the job's row is
    committed with it. A partial step's are kept (it is assembled again from them)."""
    rows = [
        {"r": by_rank[p.rank], "m": m, "s": d.step}
        for d in done.steps
        if MEASURED not in d.arrays and d.step not in done.partial
        for p in by_step[d.step]
        if MEASURED not in p.arrays
        for m in p.arrays
    ]
    if rows:
        c = param_metrics.c
        conn.execute(
            delete(param_metrics).where(
                c.run_id == bindparam("r"), c.metric == bindparam("m"), c.step == bindparam("s")
            ),
            rows,
        )


def summary(run_id: str, step: int, piece: _assemble.RankStep) -> dict[str, Any]:
    """A rank step's summary as a row (rank_rows.summary_values: step time, time before backward,
    memory, local total gradient norm; None where not sent or not finite)."""
    step_s, before_backward_s, memory, local_norm = _rank_rows.summary_values(piece.scalars)
    return {
        "run_id": run_id,
        "step": step,
        "time": piece.time,
        "step_s": step_s,
        "before_backward_s": before_backward_s,
        "memory_bytes": memory,
        "local_norm": local_norm,
    }


def _prune(conn: Connection, job: str, run_ids: Sequence[str], last_step: int, memory: JobMemory) -> None:
    """Delete the ranks' per-parameter rows and scalars of the steps more than RANK_WINDOW behind
    the job's last step (their summaries stay), but those of its partial steps and of its
    `rank_desync` steps (RANK_WINDOW), at
    most once per PRUNE_EVERY steps, in the assembly's transaction: what the job's run stores
    is committed with it."""
    lo, hi = memory.pruned_through, last_step - RANK_WINDOW
    if hi - lo < PRUNE_EVERY or not run_ids:
        return
    partial = select(partial_steps.c.step).where(partial_steps.c.run_id == job, partial_steps.c.step.between(lo, hi))
    desync = select(scalars.c.step).where(
        scalars.c.run_id == job, scalars.c.key.startswith(_assemble.DESYNC_PREFIX), scalars.c.step.between(lo, hi)
    )
    for at in range(0, len(run_ids), ASSEMBLE_CHUNK):
        chunk = run_ids[at : at + ASSEMBLE_CHUNK]
        for table in (param_metrics, scalars) if _legacy(conn, memory) else (param_metrics,):
            conn.execute(
                delete(table).where(
                    table.c.run_id.in_(chunk),
                    table.c.step > lo,
                    table.c.step <= hi,
                    table.c.step.not_in(partial),
                    table.c.step.not_in(desync),
                )
            )
        _rank_rows.prune(conn, chunk, lo, hi, (partial, desync))
    memory.pruned_through = hi


def _complete(
    conn: Connection,
    job: str,
    world_size: int,
    late: Sequence[int],
    present: Sequence[_Rank],
    now: float,
    known: set[SeriesName],
    run_tails: tails.Tails,
    done: Assembly,
    memory: JobMemory,
) -> None:
    """Assemble again those of the job's partial steps among `late` (steps a rank has just
    stored) that every rank they missed has stored by now: their rows in the job's run are
    replaced, in this transaction, and their closed blocks recomputed (write_steps; the run's new
    last seq retires any tail kept of it). Browsers are not sent them again: a page loaded from
    now on reads the new values."""
    wanted = sorted(set(late))
    rows: list[Any] = []
    for lo in range(0, len(wanted), ASSEMBLE_CHUNK):
        rows += conn.execute(
            select(partial_steps.c.step, partial_steps.c.missing).where(
                partial_steps.c.run_id == job, partial_steps.c.step.in_(wanted[lo : lo + ASSEMBLE_CHUNK])
            )
        ).all()
    if not rows:
        return
    lo, hi = min(r.step for r in rows), max(r.step for r in rows)
    heads = _rank_rows.step_heads(_legacy(conn, memory))
    sets = {
        r.rank: set(
            conn.execute(select(heads.c.step).where(heads.c.run_id == r.run_id, heads.c.step.between(lo, hi))).scalars()
        )
        for r in present
        if r.run_id is not None
    }
    complete = sorted(
        int(r.step) for r in rows if all(r.step in sets.get(int(rank), ()) for rank in json.loads(r.missing))
    )
    if not complete:
        return
    for table in (steps, scalars, param_metrics, partial_steps):
        conn.execute(delete(table).where(table.c.run_id == job, table.c.step.in_(complete)))
    conn.execute(update(runs).where(runs.c.id == job).values(steps=runs.c.steps - len(complete)))
    last_seq = conn.execute(select(runs.c.last_seq).where(runs.c.id == job)).scalar_one()
    again = Assembly()
    late_ranks = {int(r.step): [int(x) for x in json.loads(r.missing)] for r in rows}  # the others' are stored
    _write(
        conn, job, world_size, last_seq, complete, present, sets, now, known, run_tails, None, again, memory, late_ranks
    )
    done.completed = [d.step for d in again.steps]
    if again.written is not None:
        if done.written is not None:
            again.written.names |= done.written.names
        done.written = again.written


def running_jobs(conn: Connection) -> list[str]:
    """The jobs' runs that are running (their ranks may still send, or be lost)."""
    return list(conn.execute(select(runs.c.id).where(runs.c.status == "running", runs.c.kind == "job")).scalars())


def rank_runs(conn: Connection, job: str) -> list[Run]:
    """The runs of a job's ranks, by rank."""
    return [to_run(r) for r in conn.execute(select(runs).where(runs.c.parent_id == job).order_by(runs.c.rank))]


@dataclass(frozen=True)
class RankSummaries:
    """Rank step summaries as arrays, one entry per (rank, step) stored, by rank then step; NaN
    where a value was not sent (or not finite)."""

    rank: np.ndarray  # int32
    step: np.ndarray  # int64
    time: np.ndarray  # float64, and the four below
    step_s: np.ndarray
    before_backward_s: np.ndarray
    memory_bytes: np.ndarray
    local_norm: np.ndarray

    @staticmethod
    def empty() -> RankSummaries:
        f = np.zeros(0)
        return RankSummaries(np.zeros(0, np.int32), np.zeros(0, np.int64), f, f, f, f, f)


def rank_summaries(conn: Connection, job: str, first: int | None = None, last: int | None = None) -> RankSummaries:
    """The job's rank step summaries in steps `first`..`last` (either None: unbounded): one
    query, read as plain rows into arrays."""
    table = _rank_rows.summaries()
    s = table.c
    where = [runs.c.parent_id == job]
    if first is not None:
        where.append(s.step >= first)
    if last is not None:
        where.append(s.step <= last)
    rows = conn.execute(
        select(runs.c.rank, s.step, s.time, s.step_s, s.before_backward_s, s.memory_bytes, s.local_norm)
        .select_from(table.join(runs, runs.c.id == s.run_id))
        .where(*where)
        .order_by(runs.c.rank, s.step)
    ).all()
    if not rows:
        return RankSummaries.empty()
    cols = list(zip(*rows))
    floats = [np.array([np.nan if v is None else v for v in c], dtype=np.float64) for c in cols[2:]]
    return RankSummaries(np.array(cols[0], np.int32), np.array(cols[1], np.int64), *floats)


def lost_ranks(
    conn: Connection,
    job: str,
    now: float,
    rank_timeout: float,
    since: float | None = None,
    memory: JobMemory | None = None,
) -> list[int]:
    """The job's ranks that are lost now (`_lost`, the assembly's rule), silence counted from
    `since` at the earliest: when the asking process first saw the job (None: the job's start,
    the hook's clock); `memory`: what that process heard of the ranks."""
    parent = conn.execute(
        select(runs.c.world_size, runs.c.created_at).where(runs.c.id == job, runs.c.kind == "job")
    ).one_or_none()
    if parent is None or parent.world_size is None:
        return []
    ranks = _ranks(conn, job, parent.world_size)
    floor = parent.created_at if since is None else since
    return sorted(_lost_ranks(ranks, now, rank_timeout, floor, memory))

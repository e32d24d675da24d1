"""Steps: store step messages (idempotently, with their series names and blocks), and read
stored steps back whole (exports, the diagnostics replay, another worker's batch)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sqlalchemy import BindParameter, Connection, Engine, bindparam, case, func, insert, or_, select, update

from .. import tails
from ..protocol import array_dtype
from ..schema import param_metrics, runs, series_names, steps
from ..schema import scalars as scalars_table
from . import rank_rows as _rank_rows
from .blocks_sql import update_blocks
from .records import StepData, StoredStep, UnknownRun
from .rows import insert_plain
from .runs import get_series_names, lock_run
from .values import decode_scalars, encode_scalar

#: Given the steps a transaction stores, the PostgreSQL NOTIFY (channel, payload) to send in that
#: same transaction, or None: listeners then learn of steps exactly when, and in the order, they
#: are committed (relay.py, `serve --workers N`).
NotifyInTransaction = Callable[[Sequence[StepData]], tuple[str, str] | None]

#: A series name the store knows is stored: (run id, kind, name).
SeriesName = tuple[str, str, str]


#: The statements every stored batch runs, built once: building one costs more than SQLite's
#: work on it (a rank's frame of a large job is stored in a transaction of its own).
_STORED_STEPS = select(steps.c.step).where(
    steps.c.run_id == bindparam("run_id"), steps.c.step.in_(bindparam("steps", expanding=True))
)
_TOP: BindParameter[int] = bindparam("top")
_ADVANCE = (
    update(runs)
    .where(runs.c.id == bindparam("run_id"))
    .values(
        last_seq=bindparam("seq_now"),
        steps=runs.c.steps + bindparam("new"),
        last_step=case((or_(runs.c.last_step.is_(None), runs.c.last_step < _TOP), _TOP), else_=runs.c.last_step),
        updated_at=bindparam("now"),
    )
)
_ADVANCE_SEQ = (
    update(runs)
    .where(runs.c.id == bindparam("run_id"))
    .values(last_seq=bindparam("seq_now"), updated_at=bindparam("now"))
)


@dataclass
class Written:
    """What `write_steps` did; `names` and `tail` are for the store to keep once committed."""

    stored: list[bool]
    names: set[SeriesName] = field(default_factory=set)
    tail: tails.Tail | None = None
    changed: bool = False


def write_steps(
    conn: Connection,
    run_id: str,
    batch: Sequence[StepData],
    now: float,
    known: set[SeriesName],
    run_tails: tails.Tails,
    notify: NotifyInTransaction | None,
    param_blocks: bool = True,
) -> Written:
    """Store step messages in the caller's transaction; per message, False if it was stored already.
    Without `param_blocks` its series get no blocks. A rank's run of a job is stored as
    `write_rank_batches` stores it (no blocks: its rows are kept for a recent window only).

    A message is skipped when its seq is not above the run's committed seq, or its step is
    stored (then only the committed seq advances): resending is harmless. A step `resent` by the
    flight recorder only adds its arrays to the stored step (`_add_arrays`), and is never stored
    as a step of its own.
    """
    stored = [False] * len(batch)
    locked = lock_run(conn, run_id)
    if locked.kind == "rank":  # a rank's run of a job: a row per step (store/rank_rows.py)
        return write_rank_batches(conn, [(run_id, batch, notify)], now, known)[0]
    last_seq, last_step_before = locked.last_seq, locked.last_step
    fresh = []
    for i, data in enumerate(batch):
        if data.seq > last_seq:
            last_seq = data.seq
            fresh.append(i)
        elif fresh and data.seq == last_seq == batch[fresh[-1]].seq:
            fresh.append(i)  # the steps of one `steps` message share its seq
    if not fresh:
        return Written(stored)
    wanted = sorted({batch[i].step for i in fresh})
    # the run's last step is its highest stored one (kept in the transaction that stores a step):
    # a batch wholly after it, a live hook's usual one, has none of its steps stored
    after_last = (last_step_before is None and locked.steps == 0) or (
        last_step_before is not None and wanted[0] > last_step_before
    )
    have = set() if after_last else set(conn.execute(_STORED_STEPS, {"run_id": run_id, "steps": wanted}).scalars())
    resent = []
    for i in fresh:
        if batch[i].resent:  # the flight recorder's arrays of a stored step: added below, never a step
            if batch[i].step in have:
                resent.append(batch[i])
        elif batch[i].step not in have:
            have.add(batch[i].step)
            stored[i] = True
    new = [data for data, keep in zip(batch, stored) if keep]
    names: set[SeriesName] = set()
    if new:  # driver rows (insert_plain): SQLAlchemy's per-row work costs more than SQLite's
        insert_plain(conn, steps, [(run_id, d.step, d.seq, d.time) for d in new])
        insert_plain(
            conn, scalars_table, [(run_id, k, d.step, *encode_scalar(x)) for d in new for k, x in d.scalars.items()]
        )
        insert_plain(
            conn, param_metrics, [(run_id, m, d.step, raw, array_dtype(m)) for d in new for m, raw in d.arrays.items()]
        )
        names |= add_names(conn, run_id, "scalar", {k for d in new for k in d.scalars}, known)
        names |= add_names(conn, run_id, "param", {m for d in new for m in d.arrays}, known)
        told = None if notify is None else notify(new)
        if told is not None:
            conn.execute(select(func.pg_notify(*told)))
    added = _add_arrays(conn, run_id, resent)
    if added:
        names |= add_names(conn, run_id, "param", {m for d in resent for m in d.arrays}, known)
    top = max((d.step for d in new), default=None)
    after = last_step_before if top is None else top if last_step_before is None else max(top, last_step_before)
    kept = run_tails.get(run_id, (locked.steps, last_step_before, locked.last_seq))
    tail = kept if tails.covers(kept, new) and not added else None  # a kept step got arrays: read them
    held = None if kept is None or added else kept.closed  # the closed blocks kept stay true
    computed: tails.Computed = {}
    if (top is not None or added) and param_blocks and after is not None:
        computed = update_blocks(
            conn,
            run_id,
            [d.step for d in new] + added,
            last_step_before,
            after,
            None if tail is None else (*tail.steps, *new),
            held=held,
        )
    if top is None:
        conn.execute(_ADVANCE_SEQ, {"run_id": run_id, "seq_now": last_seq, "now": now})
    else:
        conn.execute(_ADVANCE, {"run_id": run_id, "seq_now": last_seq, "new": len(new), "top": top, "now": now})
    token = (locked.steps + len(new), after, last_seq)
    return Written(
        stored,
        names,
        None if added else tails.next_tail(tail, new, last_step_before, after, token, computed, held),
        changed=True,
    )


def _add_arrays(conn: Connection, run_id: str, resent: Sequence[StepData]) -> list[int]:
    """Store the arrays of `resent` steps (the flight recorder's, protocol.RESENT) into those
    stored steps, each metric where the step has none (a measured value is never replaced);
    the steps that got one."""
    if not resent:
        return []
    have = {
        (step, metric)
        for step, metric in conn.execute(
            select(param_metrics.c.step, param_metrics.c.metric).where(
                param_metrics.c.run_id == run_id, param_metrics.c.step.in_(sorted({d.step for d in resent}))
            )
        )
    }
    rows = []
    for d in resent:
        for metric, raw in d.arrays.items():
            if (d.step, metric) not in have:
                have.add((d.step, metric))
                rows.append((run_id, metric, d.step, raw, array_dtype(metric)))
    insert_plain(conn, param_metrics, rows)
    return sorted({row[2] for row in rows})


#: A rank's run of a job as a group commit locks it (`write_rank_batches`).
_LOCK_RUNS = (
    select(runs.c.id, runs.c.last_seq, runs.c.last_step, runs.c.steps)
    .where(runs.c.id.in_(bindparam("run_ids", expanding=True)))
    .with_for_update()
)


def write_rank_batches(
    conn: Connection,
    writes: Sequence[tuple[str, Sequence[StepData], NotifyInTransaction | None]],
    now: float,
    known: set[SeriesName],
) -> list[Written]:
    """`write_steps` of several ranks' runs of jobs (distinct run ids; no blocks, no tails: a
    rank's rows are kept for a recent window only, store/jobs.py) in the caller's transaction,
    each statement once for all of them rather than once per run: a group commit of a large
    job's frames (jobs/commits.py) spent more on building and running its statements per rank
    than on SQLite's work. A rank's step is one `rank_steps` row (store/rank_rows.py), its
    per-parameter arrays `param_metrics` rows as any run's. Raises UnknownRun if any run is
    missing (the caller stores each alone)."""
    ids = [run_id for run_id, _, _ in writes]
    locked = {r.id: r for r in conn.execute(_LOCK_RUNS, {"run_ids": ids})}
    missing = [run_id for run_id in ids if run_id not in locked]
    if missing:
        raise UnknownRun(f"no run {missing[0]!r}")
    fresh: list[list[int]] = []
    seqs: list[int] = []
    for run_id, batch, _ in writes:
        last_seq, mine = locked[run_id].last_seq, []
        for i, data in enumerate(batch):
            if data.seq > last_seq:
                last_seq = data.seq
                mine.append(i)
            elif mine and data.seq == last_seq == batch[mine[-1]].seq:
                mine.append(i)  # the steps of one `steps` message share its seq
        fresh.append(mine)
        seqs.append(last_seq)
    keys = sorted({(run_id, batch[i].step) for (run_id, batch, _), mine in zip(writes, fresh) for i in mine})
    have = _rank_rows.stored(conn, keys)
    out: list[Written] = []
    new_by_run: list[tuple[str, list[StepData]]] = []
    added: set[SeriesName] = set()
    for (run_id, batch, notify), mine in zip(writes, fresh):
        stored = [False] * len(batch)
        resent = []
        for i in mine:
            if batch[i].resent:  # arrays of a stored step (a replica's asked for, the recorder's)
                if (run_id, batch[i].step) in have:
                    resent.append(batch[i])
            elif (run_id, batch[i].step) not in have:
                have.add((run_id, batch[i].step))
                stored[i] = True
        if _add_arrays(conn, run_id, resent):
            added |= {(run_id, "param", m) for d in resent for m in d.arrays}
        new = [data for data, keep in zip(batch, stored) if keep]
        new_by_run.append((run_id, new))
        out.append(Written(stored, changed=bool(mine)))
        told = None if notify is None or not new else notify(new)
        if told is not None:
            conn.execute(select(func.pg_notify(*told)))
    named = _rank_rows.write(conn, new_by_run, known)
    insert_plain(
        conn,
        param_metrics,
        [(r, m, d.step, raw, array_dtype(m)) for r, new in new_by_run for d in new for m, raw in d.arrays.items()],
    )
    by_run: dict[str, set[SeriesName]] = {}
    for n in named:
        by_run.setdefault(n[0], set()).add(n)
    for (run_id, new), written in zip(new_by_run, out):
        written.names = {(run_id, "param", m) for d in new for m in d.arrays} | by_run.get(run_id, set())
    _add_names_of_runs(conn, ({n for w in out for n in w.names if n[1] != "keys"} | added) - known)
    advance = [
        {"run_id": run_id, "seq_now": seq, "new": len(new), "top": max(d.step for d in new), "now": now}
        for (run_id, new), seq, written in zip(new_by_run, seqs, out)
        if written.changed and new
    ]
    if advance:
        conn.execute(_ADVANCE, advance)
    seq_only = [
        {"run_id": run_id, "seq_now": seq, "now": now}
        for (run_id, new), seq, written in zip(new_by_run, seqs, out)
        if written.changed and not new
    ]
    if seq_only:
        conn.execute(_ADVANCE_SEQ, seq_only)
    return out


def _add_names_of_runs(conn: Connection, todo: set[SeriesName]) -> None:
    """Store the series names `todo` (of any runs) that are not stored yet."""
    if not todo:
        return
    run_ids = sorted({r for r, _, _ in todo})
    stored = {
        (r.run_id, r.kind, r.name)
        for r in conn.execute(
            select(series_names.c.run_id, series_names.c.kind, series_names.c.name).where(
                series_names.c.run_id.in_(run_ids)
            )
        )
    }
    missing = [{"run_id": r, "kind": k, "name": n} for r, k, n in sorted(todo - stored)]
    if missing:
        conn.execute(insert(series_names), missing)


def add_names(
    conn: Connection, run_id: str, kind: str, names: Iterable[str], known: set[SeriesName]
) -> set[SeriesName]:
    """Store the series names not stored yet; returns those to know from now on."""
    todo = {(run_id, kind, n) for n in names} - known
    if not todo:
        return set()
    stored = set(
        conn.execute(
            select(series_names.c.name).where(
                series_names.c.run_id == run_id,
                series_names.c.kind == kind,
                series_names.c.name.in_([n for _, _, n in todo]),
            )
        ).scalars()
    )
    missing = [{"run_id": r, "kind": k, "name": n} for r, k, n in todo if n not in stored]
    if missing:
        conn.execute(insert(series_names), missing)
    return todo


def step_times(conn: Connection, run_id: str, wanted: Sequence[int] | np.ndarray) -> tuple[np.ndarray, float | None]:
    """The wall time (Unix seconds, float64) of each of the `wanted` steps, NaN for one that
    is not stored, and the wall time of the run's first stored step (None: no steps)."""
    wanted = np.asarray(wanted, dtype=np.int64)
    head = _rank_rows.heads(conn, run_id, lambda c: (), 1)
    first = head[0][2] if head else None
    if not len(wanted):
        return np.empty(0, dtype=np.float64), first
    rows = _rank_rows.heads(conn, run_id, lambda c: (c.step.between(int(wanted.min()), int(wanted.max())),))
    known = np.array([r[0] for r in rows], dtype=np.int64)
    times = np.array([r[2] for r in rows], dtype=np.float64)
    out = np.full(len(wanted), np.nan)
    if len(known):
        at = np.minimum(np.searchsorted(known, wanted), len(known) - 1)
        hit = known[at] == wanted
        out[hit] = times[at[hit]]
    return out, first


def iter_steps(
    engine: Engine,
    run_id: str,
    *,
    with_scalars: bool = True,
    chunk: int = 256,
    metrics: Iterable[str] | None = None,
    scalar_keys: Iterable[str] | None = None,
    after: int | None = None,
) -> Iterator[list[StoredStep]]:
    """Every stored step of a run (after step `after`), in order, `chunk` steps at a time.

    Each chunk is its own short query, so an export never holds the run in memory nor a
    read transaction open for its whole length. `metrics` and `scalar_keys` read only those
    series (the diagnostics replay needs a few); by default every one is read.
    """
    keys, names = _names(engine, run_id, with_scalars)
    if scalar_keys is not None:
        keys = sorted(set(keys) & set(scalar_keys))
    if metrics is not None:
        names = sorted(set(names) & set(metrics))
    while True:
        with engine.connect() as conn:
            head = _rank_rows.heads(conn, run_id, _after(after), chunk)
            if not head:
                return
            lo, hi = head[0][0], head[-1][0]
            records = {step: StoredStep(step=step, seq=seq, time=t) for step, seq, t in head}
            _fill(conn, run_id, records, keys, names, lo, hi)
        for record in records.values():
            record.scalars = dict(sorted(record.scalars.items()))
        yield list(records.values())
        after = hi


def _after(after: int | None) -> Callable[[Any], list[Any]]:
    """The condition `step > after` on a table's columns (none: every step)."""
    return lambda c: [] if after is None else [c.step > after]


def batch_steps(
    engine: Engine, run_id: str, steps_range: tuple[int, int], seq_range: tuple[int, int] | None
) -> list[StoredStep]:
    """The steps one `write_steps` stored, every series, by step: those with step and seq in
    these ranges (the lowest and highest of the batch). No other write stores a seq in the
    batch's range (seqs are stored only above the run's committed seq); the step range keeps
    the reads on the primary keys. `serve --workers N` reads another worker's batch with it.
    Without `seq_range`: every stored step in the step range (steps that got the flight
    recorder's arrays late keep the seq they were first stored with)."""

    def where(c: Any) -> list[Any]:
        return [c.step.between(*steps_range)] + ([c.seq.between(*seq_range)] if seq_range is not None else [])

    keys, names = _names(engine, run_id, True)
    with engine.connect() as conn:
        head = _rank_rows.heads(conn, run_id, where)
        records = {step: StoredStep(step=step, seq=seq, time=t) for step, seq, t in head}
        if records:
            _fill(conn, run_id, records, keys, names, *steps_range)
    return list(records.values())


def _names(engine: Engine, run_id: str, with_scalars: bool) -> tuple[list[str], list[str]]:
    """The run's scalar keys (none unless `with_scalars`) and parameter metrics."""
    with engine.connect() as conn:
        keys = get_series_names(conn, run_id, "scalar") if with_scalars else []
        return keys, get_series_names(conn, run_id, "param")


def _fill(
    conn: Connection,
    run_id: str,
    records: dict[int, StoredStep],
    keys: Sequence[str],
    names: Sequence[str],
    lo: int,
    hi: int,
    packed: bool = True,
) -> None:
    """Read the scalars `keys` and parameter metrics `names` of steps lo..hi into `records`, for
    the steps it holds only (not a step written since they were read); `packed`: a rank's
    packed scalars too (rank_rows.fill)."""
    if keys:
        s = scalars_table.c
        rows = conn.execute(
            select(s.key, s.step, s.value, s.special).where(s.run_id == run_id, s.key.in_(keys), s.step.between(lo, hi))
        ).all()
        for r, value in zip(rows, decode_scalars(rows).tolist()):
            if r.step in records:
                records[r.step].scalars[r.key] = value
        if packed:
            _rank_rows.fill(conn, run_id, records, lo, hi, keys)
    if names:
        p = param_metrics.c
        for r in conn.execute(
            select(p.metric, p.step, p.data, p.dtype).where(
                p.run_id == run_id, p.metric.in_(names), p.step.between(lo, hi)
            )
        ):
            if r.step in records:
                records[r.step].arrays[r.metric] = np.frombuffer(r.data, dtype="<" + r.dtype)

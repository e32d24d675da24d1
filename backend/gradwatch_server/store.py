"""Storage: the only module that speaks SQL (SQLAlchemy Core; SQLite or PostgreSQL).

`open_store(url)` creates the engine, applies migrations and returns a `Store`; nothing happens
at import. The interface is narrow: a run is opened from a `hello`, steps are written one
message per transaction, and reads return plain records and numpy arrays.

Writes are serialized by one lock per store: SQLite allows one writer at a time, and taking
turns in-process is cheaper than meeting a locked database. On PostgreSQL the run's row is
locked (`FOR UPDATE`) instead, so concurrent writers to one run cannot double-count a step.
"""
from __future__ import annotations

import contextlib
import functools
import json
import math
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import (
    Connection,
    Engine,
    and_,
    case,
    create_engine,
    delete,
    event,
    func,
    insert,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, IntegrityError, NoSuchModuleError, OperationalError

from . import blocks, migrations, tails
from .protocol import Hello, absent_mask, array_dtype
from .schema import (
    deleted_runs,
    diagnoses,
    findings,
    groups,
    metadata,
    metric_blocks,
    param_metrics,
    params,
    run_tags,
    runs,
    series_names,
    steps,
)
from .schema import scalars as scalars_table

#: `scalars.special` codes (see schema.py): values SQLite cannot keep in a REAL column.
SPECIAL_NAN = 1
SPECIAL_NEG_ZERO = 2

RUN_STATUSES = ("running", "finished", "crashed")

#: Severities of findings, as counted per run in `Run.findings`.
SEVERITIES = ("error", "warning", "info")


def _no_findings() -> dict[str, int]:
    return dict.fromkeys(SEVERITIES, 0)


class StoreError(RuntimeError):
    """A storage problem the user can act on; the message says how."""


class ParamsMismatch(StoreError):
    """A `hello` resumes a run but lists different parameters."""


class UnknownRun(StoreError):
    """No run has this id."""


@dataclass(frozen=True)
class Run:
    id: str
    name: str
    project: str
    status: str
    created_at: float
    updated_at: float
    finished_at: float | None
    last_seq: int
    steps: int
    last_step: int | None
    param_count: int
    param_numel: int
    optimizer: str | None
    config: dict[str, Any]
    hook_version: str | None
    tags: list[str] = field(default_factory=list)
    #: Stored findings by severity ({"error": n, "warning": n, "info": n}).
    findings: dict[str, int] = field(default_factory=_no_findings)


@dataclass(frozen=True)
class Param:
    index: int
    name: str
    shape: list[int]
    numel: int
    dtype: str
    group: int
    optimizer: int


@dataclass(frozen=True)
class Group:
    optimizer: int
    index: int
    name: str | None
    hparams: dict[str, Any]


@dataclass(frozen=True)
class OpenedRun:
    """What `open_run` did: `created` a new run, or resumed one (`resumed_from` its status)."""

    run: Run
    created: bool
    resumed_from: str | None


@dataclass(frozen=True)
class StepData:
    """One `step` message to store: scalars as floats, arrays as raw little-endian bytes."""

    seq: int
    step: int
    time: float
    scalars: Mapping[str, float]
    arrays: Mapping[str, bytes]


@dataclass(frozen=True)
class StoredFinding:
    """One diagnostic finding as stored (diagnostics/ makes them; see DESIGN.md, Diagnostics)."""

    code: str
    severity: str
    message: str
    params: list[str]
    first_step: int | None
    figure: dict[str, Any] | None


@dataclass(frozen=True)
class DiagnosisMark:
    """The stored findings of a run cover its first `steps` stored steps, by rules `version`."""

    steps: int
    last_step: int | None
    version: int


@dataclass
class StepRecord:
    """One stored step, as the exporters read it."""

    step: int
    seq: int
    time: float
    scalars: dict[str, float] = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)


# -- engine ----------------------------------------------------------------------------------

def _set_sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    # Wait up to 10 s for another process's write (e.g. `gradwatch import`) instead of failing.
    # First: switching a new file to WAL takes a lock too, which another process starting at the
    # same moment may hold.
    cursor.execute("PRAGMA busy_timeout=10000")
    # WAL: readers (dashboard, exports) never block the writer (ingest), nor it them.
    _enable_wal(cursor)
    # NORMAL: in WAL mode a commit survives a crash of the process; only an OS crash or power
    # loss can undo the last commits, and fsync on every step would cost far more.
    cursor.execute("PRAGMA synchronous=NORMAL")
    # SQLite ignores foreign keys unless asked; deleting a run relies on ON DELETE CASCADE.
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def _enable_wal(cursor: Any, wait_s: float = 10.0) -> None:
    """PRAGMA journal_mode=WAL, tried again while the file is locked (for up to `wait_s`): when
    processes start together on a new file, the busy timeout does not cover every moment of
    another one switching it (1 process of 100, four at a time, failed at once with "database
    is locked" before this; tests/backend/test_store.py)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def _engine_url(url: str) -> str:
    """postgresql:// means psycopg 3 (the `postgres` extra), not SQLAlchemy's psycopg2 default."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def display_url(url: str) -> str:
    """`url` with its password replaced by ***: messages and logs must not carry it."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return re.sub(r"(//[^/@]*?:)[^/@]*@", r"\1***@", url)


def create_db_engine(url: str) -> Engine:
    """An engine for `url`; SQLite files get their pragmas, and a missing folder a clear error."""
    try:
        engine = create_engine(_engine_url(url))
    except (ArgumentError, ValueError) as exc:
        raise StoreError(f"cannot use database URL {display_url(url)!r}: {exc}") from exc
    except (NoSuchModuleError, ModuleNotFoundError) as exc:
        raise StoreError(
            f"no driver for {display_url(url)!r} ({exc}); for PostgreSQL: pip install 'gradwatch-server[postgres]'"
        ) from exc
    if engine.dialect.name == "sqlite":
        database = engine.url.database
        if database and database != ":memory:" and not Path(database).parent.exists():
            raise StoreError(f"cannot create {database}: the folder {Path(database).parent} does not exist")
        event.listen(engine, "connect", _set_sqlite_pragmas)
    return engine


def open_store(url: str, clock: Callable[[], float] = time.time) -> Store:
    """Connect to `url`, bring its schema up to date and return the store."""
    engine = create_db_engine(url)
    try:
        migrations.upgrade(engine)
    except migrations.SchemaError as exc:
        engine.dispose()
        raise StoreError(str(exc)) from exc
    except OperationalError as exc:
        engine.dispose()
        raise StoreError(f"cannot open database {display_url(url)!r}: {exc.orig}") from exc
    return Store(engine, clock)


# -- value encodings -----------------------------------------------------------------------

def _encode_scalar(value: float) -> tuple[float | None, int | None]:
    if math.isnan(value):
        return None, SPECIAL_NAN
    if value == 0.0 and math.copysign(1.0, value) < 0:
        return 0.0, SPECIAL_NEG_ZERO
    return value, None


def _decode_scalars(rows: Sequence[Any]) -> np.ndarray:
    """(value, special) rows -> float64 array, NaN and -0.0 restored."""
    values = np.array([r.value for r in rows], dtype=np.float64)  # None becomes NaN
    special = np.array([r.special or 0 for r in rows], dtype=np.int64)
    values[special == SPECIAL_NAN] = np.nan
    values[special == SPECIAL_NEG_ZERO] = -0.0
    return values


@functools.lru_cache(maxsize=1024)
def _shape(text: str) -> tuple[int, ...]:
    """A stored shape (a JSON list), decoded."""
    return tuple(json.loads(text))


def _to_run(row: Any, tags: Mapping[str, list[str]] | None = None,
            counts: Mapping[str, dict[str, int]] | None = None) -> Run:
    data = row._asdict()
    data["config"] = json.loads(data["config"])
    data["tags"] = list((tags or {}).get(data["id"], []))
    data["findings"] = dict((counts or {}).get(data["id"]) or _no_findings())
    return Run(**data)


def _run_details(conn: Connection, run_ids: Sequence[str]) -> tuple[dict[str, list[str]], dict[str, dict[str, int]]]:
    """The tags and the findings counts of these runs: two queries, whatever their number."""
    if not run_ids:
        return {}, {}
    tags: dict[str, list[str]] = {}
    for r in conn.execute(
        select(run_tags.c.run_id, run_tags.c.tag).where(run_tags.c.run_id.in_(run_ids))
        .order_by(run_tags.c.run_id, run_tags.c.position)
    ):
        tags.setdefault(r.run_id, []).append(r.tag)
    counts: dict[str, dict[str, int]] = {}
    for r in conn.execute(
        select(findings.c.run_id, findings.c.severity, func.count().label("n"))
        .where(findings.c.run_id.in_(run_ids)).group_by(findings.c.run_id, findings.c.severity)
    ):
        if r.severity in SEVERITIES:
            counts.setdefault(r.run_id, _no_findings())[r.severity] = int(r.n)
    return tags, counts


class Store:
    """All reads and writes of runs; safe to share between threads."""

    def __init__(self, engine: Engine, clock: Callable[[], float] = time.time) -> None:
        self.engine = engine
        self._clock = clock
        self._serial = engine.dialect.name == "sqlite"
        self._write_lock = threading.Lock()
        self._known_names: set[tuple[str, str, str]] = set()
        self._tails = tails.Tails()

    def close(self) -> None:
        self.engine.dispose()

    @contextlib.contextmanager
    def _write(self) -> Iterator[Connection]:
        """One transaction: committed on success, rolled back on any error."""
        with self._write_lock if self._serial else contextlib.nullcontext():
            with self.engine.begin() as conn:
                yield conn

    def _lock_run(self, conn: Connection, run_id: str) -> Any:
        row = conn.execute(
            select(runs.c.last_seq, runs.c.status, runs.c.last_step, runs.c.steps)
            .where(runs.c.id == run_id).with_for_update()
        ).one_or_none()
        if row is None:
            raise UnknownRun(f"no run {run_id!r}")
        return row

    # -- writes ----------------------------------------------------------------------------

    def open_run(self, hello: Hello) -> OpenedRun:
        """Create the run of a `hello`, or resume it (same parameter names, same order)."""
        try:
            return self._open_run(hello)
        except IntegrityError:
            # On PostgreSQL writers do not take turns: two hellos of a new run may both find no
            # row, and the second insert fails. The run exists now, so this hello resumes it.
            return self._open_run(hello)

    def _open_run(self, hello: Hello) -> OpenedRun:
        info, now = hello.run, self._clock()
        with self._write() as conn:
            existing = conn.execute(
                select(runs.c.status).where(runs.c.id == info.id).with_for_update()
            ).one_or_none()
            if existing is not None:
                stored = conn.execute(
                    select(params.c.name).where(params.c.run_id == info.id).order_by(params.c.idx)
                ).scalars().all()
                sent = [p.name for p in hello.params]
                if stored != sent:
                    raise ParamsMismatch(_describe_mismatch(info.id, list(stored), sent))
                conn.execute(
                    update(runs).where(runs.c.id == info.id)
                    .values(status="running", finished_at=None, updated_at=now)
                )
            else:
                conn.execute(delete(deleted_runs).where(deleted_runs.c.id == info.id))  # here again
                conn.execute(insert(runs).values(
                    id=info.id, name=info.name or info.id, project=info.project or "default",
                    status="running", created_at=info.started_at, updated_at=now, finished_at=None,
                    last_seq=0, steps=0, last_step=None, param_count=len(hello.params),
                    param_numel=sum(p.numel for p in hello.params), optimizer=info.optimizer,
                    config=json.dumps(info.config, allow_nan=False), hook_version=info.hook_version,
                ))
                if hello.params:
                    conn.execute(insert(params), [
                        {"run_id": info.id, "idx": i, "name": p.name, "shape": json.dumps(p.shape),
                         "numel": p.numel, "dtype": p.dtype, "group_idx": p.group,
                         "optimizer_idx": p.optimizer}
                        for i, p in enumerate(hello.params)
                    ])
                if hello.groups:
                    conn.execute(insert(groups), [
                        {"run_id": info.id, "optimizer_idx": g.optimizer, "idx": g.index,
                         "name": g.name, "hparams": json.dumps(g.hparams, allow_nan=False)}
                        for g in hello.groups
                    ])
            run = _to_run(conn.execute(select(runs).where(runs.c.id == info.id)).one(),
                          *_run_details(conn, [info.id]))
        return OpenedRun(run=run, created=existing is None,
                         resumed_from=None if existing is None else existing.status)

    def write_steps(self, run_id: str, batch: Sequence[StepData],
                    notice: Callable[[Sequence[StepData]], tuple[str, str] | None] | None = None) -> list[bool]:
        """Store step messages in one transaction; per message, False if it was stored already.

        A message is skipped when its seq is not above the run's committed seq, or its step is
        stored (then only the committed seq advances): resending is harmless. `notice` (PostgreSQL,
        `serve --workers N`) is given the new steps and returns a (channel, payload) to NOTIFY in
        the same transaction: listeners learn of the steps exactly when, and in the order, they
        are committed.
        """
        now = self._clock()
        stored = [False] * len(batch)
        new_names: set[tuple[str, str, str]] = set()
        with self._write() as conn:
            locked = self._lock_run(conn, run_id)
            last_seq, last_step_before = locked.last_seq, locked.last_step
            fresh = []
            for i, data in enumerate(batch):
                if data.seq > last_seq:
                    last_seq = data.seq
                    fresh.append(i)
                elif fresh and data.seq == last_seq == batch[fresh[-1]].seq:
                    fresh.append(i)  # the steps of one `steps` message share its seq
            if not fresh:
                return stored
            have = set(conn.execute(select(steps.c.step).where(
                steps.c.run_id == run_id, steps.c.step.in_({batch[i].step for i in fresh}))).scalars())
            for i in fresh:
                if batch[i].step not in have:
                    have.add(batch[i].step)
                    stored[i] = True
            new = [data for data, keep in zip(batch, stored) if keep]
            if new:  # driver rows (_insert_plain): SQLAlchemy's per-row work cost more than SQLite's
                _insert_plain(conn, steps, [(run_id, d.step, d.seq, d.time) for d in new])
                _insert_plain(conn, scalars_table, [(run_id, k, d.step, *_encode_scalar(x))
                                                    for d in new for k, x in d.scalars.items()])
                _insert_plain(conn, param_metrics, [(run_id, m, d.step, raw, array_dtype(m))
                                                    for d in new for m, raw in d.arrays.items()])
                new_names |= self._add_names(conn, run_id, "scalar", {k for d in new for k in d.scalars})
                new_names |= self._add_names(conn, run_id, "param", {m for d in new for m in d.arrays})
                told = None if notice is None else notice(new)
                if told is not None:
                    conn.execute(select(func.pg_notify(*told)))
            top = max((d.step for d in new), default=None)
            after = last_step_before if top is None else top if last_step_before is None else max(top, last_step_before)
            tail = self._tails.get(run_id, (locked.steps, last_step_before))
            tail = tail if tails.covers(tail, new) else None
            if top is not None:
                _update_blocks(conn, run_id, [d.step for d in new], last_step_before, after,
                               None if tail is None else (*tail.steps, *new))
            last_step = runs.c.last_step if top is None else case(
                (or_(runs.c.last_step.is_(None), runs.c.last_step < top), top), else_=runs.c.last_step)
            conn.execute(update(runs).where(runs.c.id == run_id).values(
                last_seq=last_seq, steps=runs.c.steps + len(new), last_step=last_step, updated_at=now,
            ))
        # only once committed
        self._known_names |= new_names
        self._tails.keep(run_id, tails.next_tail(tail, new, last_step_before, after, (locked.steps + len(new), after)))
        return stored

    def _add_names(self, conn: Connection, run_id: str, kind: str, names: Iterable[str]) -> set[tuple[str, str, str]]:
        todo = {(run_id, kind, n) for n in names} - self._known_names
        if not todo:
            return set()
        stored = set(conn.execute(
            select(series_names.c.name).where(
                series_names.c.run_id == run_id, series_names.c.kind == kind,
                series_names.c.name.in_([n for _, _, n in todo]))
        ).scalars())
        missing = [{"run_id": r, "kind": k, "name": n} for r, k, n in todo if n not in stored]
        if missing:
            conn.execute(insert(series_names), missing)
        return todo

    def close_run(self, run_id: str, *, seq: int, status: str) -> bool:
        """Apply a `close` message; False if it was applied already."""
        now = self._clock()
        with self._write() as conn:
            run = self._lock_run(conn, run_id)
            if seq <= run.last_seq:
                return False
            conn.execute(update(runs).where(runs.c.id == run_id).values(
                last_seq=seq, status=status, finished_at=now, updated_at=now,
            ))
        return True

    def mark_crashed(self, run_id: str, idle_since: float) -> bool:
        """Mark a run crashed if it is running and unchanged since `idle_since`; True if so."""
        now = self._clock()
        with self._write() as conn:
            result = conn.execute(
                update(runs)
                .where(runs.c.id == run_id, runs.c.status == "running", runs.c.updated_at <= idle_since)
                .values(status="crashed", updated_at=now)
            )
        return result.rowcount > 0

    def set_status(self, run_id: str, status: str, finished_at: float | None) -> None:
        """Set a run's status outright (an imported run: no hook will send `close`)."""
        with self._write() as conn:
            conn.execute(update(runs).where(runs.c.id == run_id).values(
                status=status, finished_at=finished_at, updated_at=self._clock(),
            ))

    def update_run(self, run_id: str, *, name: str | None = None, tags: Sequence[str] | None = None) -> bool:
        """Rename a run and/or replace its tags (None: unchanged); False if there is no such run.

        `updated_at` is left alone: it is when the run's data last changed (it ends a crashed
        run's duration and times crash detection), and a label is not data.
        """
        with self._write() as conn:
            if conn.execute(select(runs.c.id).where(runs.c.id == run_id).with_for_update()).one_or_none() is None:
                return False
            if name is not None:
                conn.execute(update(runs).where(runs.c.id == run_id).values(name=name))
            if tags is not None:
                conn.execute(delete(run_tags).where(run_tags.c.run_id == run_id))
                unique = list(dict.fromkeys(tags))
                if unique:
                    conn.execute(insert(run_tags), [{"run_id": run_id, "tag": t, "position": i}
                                                    for i, t in enumerate(unique)])
        return True

    def delete_run(self, run_id: str) -> bool:
        """Delete a run and everything stored for it, in one transaction: every table's rows
        reference the run with ON DELETE CASCADE, on an index that starts with run_id. The id
        is kept in `deleted_runs` (deleted_at), so that it can be told from one never stored."""
        with self._write() as conn:
            result = conn.execute(delete(runs).where(runs.c.id == run_id))
            if result.rowcount > 0:
                conn.execute(delete(deleted_runs).where(deleted_runs.c.id == run_id))
                conn.execute(insert(deleted_runs).values(id=run_id, deleted_at=self._clock()))
        self._known_names = {k for k in self._known_names if k[0] != run_id}
        return result.rowcount > 0

    def deleted_at(self, run_id: str) -> float | None:
        """When the run `run_id` was deleted (Unix seconds), or None: never stored, or stored now."""
        if not _storable(run_id):
            return None
        with self.engine.connect() as conn:
            found = conn.execute(select(deleted_runs.c.deleted_at).where(deleted_runs.c.id == run_id)).scalar()
        return None if found is None else float(found)

    # -- maintenance (gradwatch gc) -----------------------------------------------------------

    def runs_to_collect(self, *, created_before: float | None = None, status: str | None = None,
                        project: str | None = None) -> list[Run]:
        """The runs `gradwatch gc` may delete, oldest first: never a running one (it is being
        written), and only those created before `created_before` (Unix seconds), of `status`
        and of `project`, for each one given."""
        if not _storable(project):
            return []
        where = [runs.c.status != "running"]
        if created_before is not None:
            where.append(runs.c.created_at < created_before)
        if status is not None:
            where.append(runs.c.status == status)
        if project is not None:
            where.append(runs.c.project == project)
        with self.engine.connect() as conn:
            rows = conn.execute(select(runs).where(*where).order_by(runs.c.created_at, runs.c.id)).all()
        return [_to_run(r) for r in rows]

    def database_bytes(self) -> int:
        """Disk the database takes: the SQLite file and its write-ahead log, or PostgreSQL's
        pg_database_size."""
        if self.engine.dialect.name == "sqlite":
            name = self.engine.url.database
            if not name or name == ":memory:":
                return 0
            return sum(Path(f"{name}{suffix}").stat().st_size for suffix in ("", "-wal")
                       if Path(f"{name}{suffix}").exists())
        with self.engine.connect() as conn:
            return int(conn.execute(text("SELECT pg_database_size(current_database())")).scalar_one())

    def compact(self) -> None:
        """Give back the space of deleted rows.

        SQLite: checkpoint the write-ahead log into the file, VACUUM (the file is rewritten
        without its free pages: it needs as much free disk as the file and no other writer for
        that time) and truncate the log. PostgreSQL: VACUUM (ANALYZE) gradwatch's tables: their
        free space is reused by new rows and the planner's statistics are fresh; the files do
        not shrink (VACUUM FULL would, locking each table while it rewrites it).
        """
        try:
            with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                if self.engine.dialect.name == "sqlite":
                    conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
                    conn.exec_driver_sql("VACUUM")
                    conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
                else:
                    names = ", ".join(f'"{t.name}"' for t in metadata.sorted_tables)
                    conn.exec_driver_sql(f"VACUUM (ANALYZE) {names}")
        except OperationalError as exc:
            raise StoreError(f"could not compact the database ({exc.orig}); another process may be writing "
                             "to it (a server): run `gradwatch gc` again when it is idle or stopped") from exc

    # -- findings (diagnostics) -------------------------------------------------------------

    def save_findings(self, run_id: str, found: Sequence[StoredFinding], mark: DiagnosisMark | None = None,
                      *, replace: bool = False) -> None:
        """Store findings (each replaces the run's finding of its code) and the mark, in one
        transaction; `replace` first removes every other finding of the run (a fresh diagnosis)."""
        now = self._clock()
        with self._write() as conn:
            if conn.execute(select(runs.c.id).where(runs.c.id == run_id)).one_or_none() is None:
                raise UnknownRun(f"no run {run_id!r}")
            if replace:
                conn.execute(delete(findings).where(findings.c.run_id == run_id))
            elif found:
                conn.execute(delete(findings).where(
                    findings.c.run_id == run_id, findings.c.code.in_([f.code for f in found])))
            if found:
                conn.execute(insert(findings), [
                    {"run_id": run_id, "code": f.code, "severity": f.severity, "message": f.message,
                     "params": json.dumps(f.params), "first_step": f.first_step,
                     "figure": None if f.figure is None else json.dumps(f.figure, allow_nan=False),
                     "updated_at": now}
                    for f in found
                ])
            if mark is not None:
                conn.execute(delete(diagnoses).where(diagnoses.c.run_id == run_id))
                conn.execute(insert(diagnoses).values(run_id=run_id, steps=mark.steps, last_step=mark.last_step,
                                                      version=mark.version, updated_at=now))

    def get_findings(self, run_id: str) -> list[StoredFinding]:
        """A run's stored findings, in the order they were first seen."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(findings).where(findings.c.run_id == run_id)).all()
        found = [StoredFinding(code=r.code, severity=r.severity, message=r.message, params=json.loads(r.params),
                               first_step=r.first_step, figure=None if r.figure is None else json.loads(r.figure))
                 for r in rows]
        return sorted(found, key=lambda f: (f.first_step is not None, f.first_step or 0, f.code))

    def get_diagnosis(self, run_id: str) -> DiagnosisMark | None:
        """How far the stored findings of a run go (None: never diagnosed)."""
        with self.engine.connect() as conn:
            row = conn.execute(select(diagnoses).where(diagnoses.c.run_id == run_id)).one_or_none()
        return None if row is None else DiagnosisMark(steps=row.steps, last_step=row.last_step, version=row.version)

    # -- reads: runs -----------------------------------------------------------------------

    def get_run(self, run_id: str) -> Run | None:
        if not _storable(run_id):
            return None
        with self.engine.connect() as conn:
            row = conn.execute(select(runs).where(runs.c.id == run_id)).one_or_none()
            return None if row is None else _to_run(row, *_run_details(conn, [run_id]))

    def list_runs(self, *, project: str | None = None, q: str | None = None, status: str | None = None,
                  tag: str | None = None, limit: int = 100, offset: int = 0) -> tuple[list[Run], int]:
        """Matching runs, newest first, and how many match in all; each with its tags and
        findings counts (two more queries for the page, not two per run)."""
        if not _storable(project, q, tag):
            return [], 0
        where = []
        if project is not None:
            where.append(runs.c.project == project)
        if status is not None:
            where.append(runs.c.status == status)
        if tag is not None:
            where.append(runs.c.id.in_(select(run_tags.c.run_id).where(run_tags.c.tag == tag)))
        if q:
            where.append(or_(runs.c.name.icontains(q, autoescape=True),
                             runs.c.project.icontains(q, autoescape=True)))
        with self.engine.connect() as conn:
            count = conn.execute(select(func.count()).select_from(runs).where(*where)).scalar_one()
            rows = conn.execute(
                select(runs).where(*where).order_by(runs.c.created_at.desc(), runs.c.id)
                .limit(limit).offset(offset)
            ).all()
            details = _run_details(conn, [r.id for r in rows])
        return [_to_run(r, *details) for r in rows], count

    def running_run_ids(self) -> list[str]:
        with self.engine.connect() as conn:
            return list(conn.execute(select(runs.c.id).where(runs.c.status == "running")).scalars())

    def get_params(self, run_id: str) -> list[Param]:
        """The run's parameters by index; plain rows, and each distinct shape decoded once: the
        run page asks six times for them (1,000 parameters: 6.8 ms -> 2 ms)."""
        c = params.c
        with self.engine.connect() as conn:
            rows = _plain_rows(conn, select(c.idx, c.name, c.shape, c.numel, c.dtype, c.group_idx, c.optimizer_idx)
                               .where(c.run_id == run_id).order_by(c.idx))
        return [Param(index=r[0], name=r[1], shape=list(_shape(r[2])), numel=r[3], dtype=r[4], group=r[5],
                      optimizer=r[6]) for r in rows]

    def get_groups(self, run_id: str) -> list[Group]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(groups).where(groups.c.run_id == run_id).order_by(groups.c.optimizer_idx, groups.c.idx)
            ).all()
        return [Group(optimizer=r.optimizer_idx, index=r.idx, name=r.name, hparams=json.loads(r.hparams))
                for r in rows]

    def series_names(self, run_id: str, kind: str) -> list[str]:
        """Sorted names of a run's scalar series (`kind="scalar"`) or parameter metrics ("param")."""
        with self.engine.connect() as conn:
            names = conn.execute(
                select(series_names.c.name)
                .where(series_names.c.run_id == run_id, series_names.c.kind == kind)
            ).scalars().all()
        # Sorted here, not by ORDER BY: code-point order on every database, whatever the collation
        # of a PostgreSQL server (en_US sorts "alpha" before "Zeta"; SQLite and Python after).
        return sorted(names)

    # -- reads: series -----------------------------------------------------------------------

    def scalar_series(self, run_id: str, key: str, start: int | None = None,
                      end: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(steps, float64 values) of one scalar in [start, end], by step."""
        where = _window(scalars_table.c.step, start, end)
        with self.engine.connect() as conn:
            rows = _plain_rows(conn,
                select(scalars_table.c.step, scalars_table.c.value, scalars_table.c.special)
                .where(scalars_table.c.run_id == run_id, scalars_table.c.key == key, *where)
                .order_by(scalars_table.c.step)
            )
        return _scalar_columns(rows)

    def step_times(self, run_id: str, wanted: Sequence[int] | np.ndarray) -> tuple[np.ndarray, float | None]:
        """The wall time (Unix seconds, float64) of each of the `wanted` steps, NaN for one that
        is not stored, and the wall time of the run's first stored step (None: no steps)."""
        wanted = np.asarray(wanted, dtype=np.int64)
        with self.engine.connect() as conn:
            first = conn.execute(
                select(steps.c.time).where(steps.c.run_id == run_id).order_by(steps.c.step).limit(1)
            ).scalar_one_or_none()
            if not len(wanted):
                return np.empty(0, dtype=np.float64), first
            rows = conn.execute(
                select(steps.c.step, steps.c.time)
                .where(steps.c.run_id == run_id, steps.c.step.between(int(wanted.min()), int(wanted.max())))
                .order_by(steps.c.step)
            ).all()
        known = np.array([r.step for r in rows], dtype=np.int64)
        times = np.array([r.time for r in rows], dtype=np.float64)
        out = np.full(len(wanted), np.nan)
        if len(known):
            at = np.minimum(np.searchsorted(known, wanted), len(known) - 1)
            hit = known[at] == wanted
            out[hit] = times[at[hit]]
        return out, first

    def metric_steps(self, run_id: str, metric: str, start: int | None = None,
                     end: int | None = None) -> np.ndarray:
        """The steps at which a parameter metric is stored, in [start, end]."""
        with self.engine.connect() as conn:
            found = conn.execute(
                select(param_metrics.c.step)
                .where(*_metric_where(run_id, metric), *_window(param_metrics.c.step, start, end))
                .order_by(param_metrics.c.step)
            ).scalars().all()
        return np.array(found, dtype=np.int64)

    def metric_rows(self, run_id: str, metric: str, start: int | None = None,
                    end: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(steps, array of shape steps x parameters) of one metric in [start, end]."""
        with self.engine.connect() as conn:
            rows = _plain_rows(conn,
                select(param_metrics.c.step, param_metrics.c.data)
                .where(*_metric_where(run_id, metric), *_window(param_metrics.c.step, start, end))
                .order_by(param_metrics.c.step)
            )
        dtype = "<" + array_dtype(metric)
        width = len(rows[0][1]) // np.dtype(dtype).itemsize if rows else 0
        matrix = np.frombuffer(_joined(rows, 1), dtype=dtype).reshape(len(rows), width)
        return np.array([r[0] for r in rows], dtype=np.int64), matrix

    def last_metric_row(self, run_id: str, metric: str, start: int | None = None,
                        end: int | None = None) -> tuple[int, np.ndarray] | None:
        """The metric's array at the last stored step in [start, end]."""
        with self.engine.connect() as conn:
            row = conn.execute(
                select(param_metrics.c.step, param_metrics.c.data)
                .where(*_metric_where(run_id, metric), *_window(param_metrics.c.step, start, end))
                .order_by(param_metrics.c.step.desc()).limit(1)
            ).one_or_none()
        if row is None:
            return None
        return row.step, np.frombuffer(row.data, dtype="<" + array_dtype(metric))

    def metric_columns(self, run_id: str, metric: str, indices: Sequence[int], start: int | None = None,
                       end: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(steps, array of shape steps x len(indices)): a few parameters, read as blob slices."""
        dtype = np.dtype("<" + array_dtype(metric))
        size = dtype.itemsize
        slices = [func.substr(param_metrics.c.data, i * size + 1, size).label(f"c{n}")
                  for n, i in enumerate(indices)]
        with self.engine.connect() as conn:
            rows = _plain_rows(conn,
                select(param_metrics.c.step, *slices)
                .where(*_metric_where(run_id, metric), *_window(param_metrics.c.step, start, end))
                .order_by(param_metrics.c.step)
            )
        raw = _joined(rows, 1)
        matrix = np.frombuffer(raw, dtype=dtype).reshape(len(rows), len(indices))
        return np.array([r[0] for r in rows], dtype=np.int64), matrix

    # A series is a parameter metric (`kind` "param", one value per parameter) or a scalar
    # ("scalar", `name` its key); the three reads below serve the long windows of charts.py.

    def series_bounds(self, run_id: str, name: str, start: int | None = None, end: int | None = None,
                      kind: str = "param") -> tuple[int, int] | None:
        """The first and last steps at which a series is stored in [start, end]."""
        table = param_metrics if kind == "param" else scalars_table
        where = [table.c.run_id == run_id, (table.c.metric if kind == "param" else table.c.key) == name,
                 *_window(table.c.step, start, end)]
        with self.engine.connect() as conn:  # two queries: each is one index probe
            lo = conn.execute(select(func.min(table.c.step)).where(*where)).scalar()
            hi = conn.execute(select(func.max(table.c.step)).where(*where)).scalar()
        return None if lo is None or hi is None else (int(lo), int(hi))

    def series_count(self, run_id: str, name: str, lo: int, hi: int, kind: str = "param") -> int:
        """How many steps of a series are stored in [lo, hi], counted from the closed blocks
        that cover it and from the raw rows of the rest: three small queries whatever the span
        (a query per covering segment took 4 ms for 10^4 steps, most of it SQLAlchemy's)."""
        table = param_metrics if kind == "param" else scalars_table
        named = (table.c.metric if kind == "param" else table.c.key) == name
        c = metric_blocks.c
        with self.engine.connect() as conn:
            last = conn.execute(select(runs.c.last_step).where(runs.c.id == run_id)).scalar()
            segments = blocks.cover(lo, hi, last, blocks.SIZES[-1])
            raw = [table.c.step.between(a, b) for size, a, b in segments if size == blocks.RAW]
            stored = [and_(c.size == size, c.block.between(a, b)) for size, a, b in segments if size != blocks.RAW]
            total = 0
            if raw:
                total += conn.execute(select(func.count()).select_from(table).where(
                    table.c.run_id == run_id, named, or_(*raw))).scalar_one()
            if stored:  # every block has a part 0 (a run without parameters has no param blocks)
                total += conn.execute(select(func.coalesce(func.sum(c.step_count), 0)).where(
                    c.run_id == run_id, c.kind == kind, c.metric == name, c.part == 0, or_(*stored))).scalar_one()
        return int(total)

    def series_pieces(self, run_id: str, name: str, lo: int, hi: int, size: int,
                      indices: Sequence[int] | None = None, kind: str = "param") -> blocks.Pieces:
        """Summaries covering steps [lo, hi] of a series, in step order: its closed blocks of at
        most `size` steps lying wholly inside, and single raw steps elsewhere (blocks.cover), for
        the parameters `indices` or all of them (a scalar has one column)."""
        with self.engine.connect() as conn:
            run = conn.execute(select(runs.c.last_step, runs.c.param_count).where(runs.c.id == run_id)).one_or_none()
            width = 1 if kind == "scalar" else len(indices) if indices is not None else \
                (run.param_count if run is not None else 0)
            if run is None:
                return blocks.empty(width)
            found = [
                _raw_pieces(conn, run_id, kind, name, a, b, indices) if size_ == blocks.RAW
                else _stored_pieces(conn, run_id, kind, name, size_, a, b, indices)
                for size_, a, b in blocks.cover(lo, hi, run.last_step, size)
            ]
        return blocks.concat(found, width)

    def iter_steps(self, run_id: str, *, with_scalars: bool = True, chunk: int = 256,
                   metrics: Iterable[str] | None = None, scalar_keys: Iterable[str] | None = None,
                   after: int | None = None) -> Iterator[list[StepRecord]]:
        """Every stored step of a run (after step `after`), in order, `chunk` steps at a time.

        Each chunk is its own short query, so an export never holds the run in memory nor a
        read transaction open for its whole length. `metrics` and `scalar_keys` read only those
        series (the diagnostics replay needs a few); by default every one is read.
        """
        keys = self.series_names(run_id, "scalar") if with_scalars else []
        if scalar_keys is not None:
            keys = sorted(set(keys) & set(scalar_keys))
        names = self.series_names(run_id, "param")
        if metrics is not None:
            names = sorted(set(names) & set(metrics))
        while True:
            with self.engine.connect() as conn:
                where = [steps.c.run_id == run_id] + ([steps.c.step > after] if after is not None else [])
                head = conn.execute(
                    select(steps.c.step, steps.c.seq, steps.c.time).where(*where).order_by(steps.c.step).limit(chunk)
                ).all()
                if not head:
                    return
                lo, hi = head[0].step, head[-1].step
                records = {r.step: StepRecord(step=r.step, seq=r.seq, time=r.time) for r in head}
                if keys:
                    rows = conn.execute(
                        select(scalars_table.c.key, scalars_table.c.step, scalars_table.c.value,
                               scalars_table.c.special)
                        .where(scalars_table.c.run_id == run_id, scalars_table.c.key.in_(keys),
                               scalars_table.c.step.between(lo, hi))
                    ).all()
                    for r, value in zip(rows, _decode_scalars(rows).tolist()):
                        if r.step in records:  # not a step written since `head` was read
                            records[r.step].scalars[r.key] = value
                if names:
                    for r in conn.execute(
                        select(param_metrics.c.metric, param_metrics.c.step, param_metrics.c.data,
                               param_metrics.c.dtype)
                        .where(param_metrics.c.run_id == run_id, param_metrics.c.metric.in_(names),
                               param_metrics.c.step.between(lo, hi))
                    ):
                        if r.step in records:
                            records[r.step].arrays[r.metric] = np.frombuffer(r.data, dtype="<" + r.dtype)
            for record in records.values():
                record.scalars = dict(sorted(record.scalars.items()))
            yield list(records.values())
            after = hi

    def batch_steps(self, run_id: str, steps_range: tuple[int, int], seq_range: tuple[int, int]) -> list[StepRecord]:
        """The steps one `write_steps` stored, every series, by step: those with step and seq in
        these ranges (the lowest and highest of the batch). No other write stores a seq in the
        batch's range (seqs are stored only above the run's committed seq); the step range keeps
        the reads on the primary keys. `serve --workers N` reads another worker's batch with it."""
        where = [steps.c.run_id == run_id, steps.c.step.between(*steps_range), steps.c.seq.between(*seq_range)]
        keys, names = self.series_names(run_id, "scalar"), self.series_names(run_id, "param")
        with self.engine.connect() as conn:
            head = conn.execute(select(steps.c.step, steps.c.seq, steps.c.time).where(*where)
                                .order_by(steps.c.step)).all()
            records = {r.step: StepRecord(step=r.step, seq=r.seq, time=r.time) for r in head}
            if records and keys:
                rows = conn.execute(
                    select(scalars_table.c.key, scalars_table.c.step, scalars_table.c.value, scalars_table.c.special)
                    .where(scalars_table.c.run_id == run_id, scalars_table.c.key.in_(keys),
                           scalars_table.c.step.between(*steps_range))
                ).all()
                for r, value in zip(rows, _decode_scalars(rows).tolist()):
                    if r.step in records:
                        records[r.step].scalars[r.key] = value
            if records and names:
                for r in conn.execute(
                    select(param_metrics.c.metric, param_metrics.c.step, param_metrics.c.data, param_metrics.c.dtype)
                    .where(param_metrics.c.run_id == run_id, param_metrics.c.metric.in_(names),
                           param_metrics.c.step.between(*steps_range))
                ):
                    if r.step in records:
                        records[r.step].arrays[r.metric] = np.frombuffer(r.data, dtype="<" + r.dtype)
        return list(records.values())


# -- step blocks (blocks.py) -------------------------------------------------------------------

#: Blocks of one size recomputed per query: bounds ingest's and the backfill's memory to this
#: many x 4 (or x 16 raw steps) x parameters x 40 bytes.
_BLOCK_BATCH = 64


def _plain_rows(conn: Connection, query: Any) -> list[Any]:
    """A query's rows as the driver gives them (tuples; bytes for blobs), without SQLAlchemy's
    Row objects: they cost half the time of the long reads (20,000 rows on SQLite: 78 ms with
    Rows, 38 ms without; tests/bench/storage.py)."""
    result = conn.execute(query)
    try:
        return list(result.cursor.fetchall())
    finally:
        result.close()


def _joined(rows: Sequence[Any], first: int) -> bytes:
    """The blobs in the columns from `first` on of every row, joined in order, a row at a time
    (bytes, or any buffer a driver gives; 10,000 rows x 5 cells: 4.6 ms through a generator of
    bytes(), 0.9 ms here)."""
    return b"".join([b"".join(r[first:]) for r in rows])


def _ranges(numbers: Sequence[int]) -> list[tuple[int, int]]:
    """Sorted integers as ranges of consecutive ones: [1, 2, 3, 7] -> [(1, 3), (7, 7)]."""
    out: list[tuple[int, int]] = []
    for n in numbers:
        if out and n == out[-1][1] + 1:
            out[-1] = (out[-1][0], n)
        else:
            out.append((n, n))
    return out


def _update_blocks(conn: Connection, run_id: str, new_steps: list[int], before: int | None, after: int,
                   stored: Sequence[StepData] | None = None) -> None:
    """Recompute the closed blocks that storing `new_steps` changed or closed (blocks.dirty),
    of every series of the run, in the caller's transaction: per kind and size, one query reads
    what they are made of (raw rows for the smallest size, blocks of the size below for the
    others), one deletes them and one inserts them, whatever the number of series.

    `stored`: every stored step of the smallest blocks to recompute, when the store has them in
    memory (tails.py); then the raw rows are not read back. Blocks never closed before (numbered
    from `closed(size, before)` on) were never written, so they need no delete."""
    todo = blocks.dirty(new_steps, before, after)
    if not todo[blocks.SIZES[0]]:
        return
    names = conn.execute(select(series_names.c.kind, series_names.c.name).where(series_names.c.run_id == run_id)).all()
    for kind in blocks.RECORDS:
        mine = [name for k, name in names if k == kind]
        for i, size in enumerate(blocks.SIZES):
            numbers = todo[size] if mine else []
            for lo in range(0, len(numbers), _BLOCK_BATCH):
                ranges = _ranges(numbers[lo:lo + _BLOCK_BATCH])
                if i == 0:
                    spans = [(a * size, (b + 1) * size - 1) for a, b in ranges]
                    if stored is not None:
                        found = _memory_pieces_of(stored, kind, spans, size)
                    else:
                        found = (_raw_pieces_of if kind == "param" else _raw_scalar_pieces_of)(conn, run_id, mine, spans, size)
                else:
                    ratio = size // blocks.SIZES[i - 1]
                    found = _block_pieces_of(conn, run_id, kind, mine, blocks.SIZES[i - 1],
                                             [(a * ratio, (b + 1) * ratio - 1) for a, b in ranges])
                _put_blocks(conn, run_id, kind, mine, size, ranges, {m: blocks.group(p, size) for m, p in found.items()},
                            blocks.closed(size, before))


def _put_blocks(conn: Connection, run_id: str, kind: str, names: list[str], size: int, ranges: list[tuple[int, int]],
                found: Mapping[str, blocks.Pieces], fresh: int = 0) -> None:
    """Replace the stored blocks of a size numbered in `ranges` by `found` (per series, one
    piece per block holding data); those numbered from `fresh` on are known not to be stored."""
    stale = [(a, b) for a, b in ranges if a < fresh]
    if stale:
        conn.execute(delete(metric_blocks).where(
            metric_blocks.c.run_id == run_id, metric_blocks.c.kind == kind, metric_blocks.c.metric.in_(names),
            metric_blocks.c.size == size, or_(*[metric_blocks.c.block.between(a, b) for a, b in stale])))
    rows = []
    for name, pieces in found.items():
        if not len(pieces):
            continue
        records = blocks.to_records(pieces, blocks.RECORDS[kind])
        parts = -(-records.shape[1] // blocks.PART)
        rows += [(run_id, kind, name, size, first // size, part, first, count,
                  records[j, part * blocks.PART:(part + 1) * blocks.PART].tobytes())
                 for j, (first, count) in enumerate(zip(pieces.first.tolist(), pieces.rows.tolist()))
                 for part in range(parts)]
    _insert_plain(conn, metric_blocks, rows)


def _insert_plain(conn: Connection, table: Any, rows: list[tuple[Any, ...]]) -> None:
    """INSERT rows (tuples in the order of the table's columns) with the driver's executemany:
    SQLAlchemy's handling of each row's parameters costs about as much as SQLite's insert (112
    rows of 1.3 KB, a block's parts for 7 metrics: 0.97 ms through SQLAlchemy, 0.52 ms here)."""
    if not rows:
        return
    mark = "?" if conn.dialect.paramstyle == "qmark" else "%s"
    names = ", ".join(c.name for c in table.columns)
    conn.exec_driver_sql(f"INSERT INTO {table.name} ({names}) VALUES ({', '.join([mark] * len(table.columns))})",
                         rows)


def _split(rows: list[Any]) -> Iterator[tuple[str, list[Any]]]:
    """Rows whose first column is a series name, ordered by it: (name, its rows) in turn."""
    lo = 0
    for hi in range(1, len(rows) + 1):
        if hi == len(rows) or rows[hi][0] != rows[lo][0]:
            yield rows[lo][0], rows[lo:hi]
            lo = hi


def _pieces_of_values(metric: str, steps_: list[int], raw: bytes, width: int, size: int | None = None) -> blocks.Pieces:
    """Pieces of raw rows (their `data` joined): one per step, or per block of `size` steps."""
    dtype = np.dtype("<" + array_dtype(metric))
    values = np.frombuffer(raw, dtype=dtype).reshape(len(steps_), width)
    missing = absent_mask(values) if dtype.kind == "f" else None
    return blocks.from_values(np.array(steps_, dtype=np.int64), values, missing, size)


def _scalar_columns(rows: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
    """(steps, float64 values) of (step, value, special) rows of a scalar, NaN and -0.0
    restored; plain rows read by column (a scalar over 10,000 steps: 27 ms through SQLAlchemy's
    Row objects, 7 ms here; zip(*rows) costs 6 ms more, its big tuples waking the garbage collector)."""
    values = np.array([r[1] for r in rows], dtype=np.float64)  # None (a NaN) becomes NaN
    special = np.array([r[2] for r in rows], dtype=np.float64)  # None (nothing special) becomes NaN
    values[special == SPECIAL_NAN] = np.nan
    values[special == SPECIAL_NEG_ZERO] = -0.0
    return np.array([r[0] for r in rows], dtype=np.int64), values


def _pieces_of_scalars(rows: list[Any], starts: np.ndarray | None = None) -> blocks.Pieces:
    """Pieces of (step, value, special) rows of scalars: one per row, or per group of rows
    beginning at the indices `starts`."""
    steps_, values = _scalar_columns(rows)
    return blocks.from_values(steps_, values.reshape(-1, 1), None, dtype=np.float64, starts=starts)


def _raw_pieces_of(conn: Connection, run_id: str, metrics: list[str], spans: list[tuple[int, int]],
                   size: int) -> dict[str, blocks.Pieces]:
    """Per parameter metric, one piece per block of `size` steps in the step ranges `spans`."""
    rows = _plain_rows(conn, select(param_metrics.c.metric, param_metrics.c.step, param_metrics.c.data).where(
        param_metrics.c.run_id == run_id, param_metrics.c.metric.in_(metrics),
        or_(*[param_metrics.c.step.between(a, b) for a, b in spans])
    ).order_by(param_metrics.c.metric, param_metrics.c.step))
    found = {}
    for metric, mine in _split(rows):
        width = len(mine[0][2]) // np.dtype(array_dtype(metric)).itemsize
        found[metric] = _pieces_of_values(metric, [r[1] for r in mine], b"".join(r[2] for r in mine), width, size)
    return found


def _raw_scalar_pieces_of(conn: Connection, run_id: str, keys: list[str], spans: list[tuple[int, int]],
                          size: int) -> dict[str, blocks.Pieces]:
    """Per scalar, one piece per block of `size` steps in the step ranges `spans`: all scalars
    in one pass (a run logs a few dozen, a few values each per block)."""
    s = scalars_table.c
    rows = _plain_rows(conn, select(s.key, s.step, s.value, s.special).where(
        s.run_id == run_id, s.key.in_(keys), or_(*[s.step.between(a, b) for a, b in spans])
    ).order_by(s.key, s.step))
    if not rows:
        return {}
    key_of = {k: i for i, k in enumerate(dict.fromkeys(r[0] for r in rows))}
    owner = np.array([key_of[r[0]] for r in rows], dtype=np.int64)
    block = np.array([r[1] for r in rows], dtype=np.int64) // size
    starts = np.flatnonzero((np.diff(owner, prepend=-1) != 0) | (np.diff(block, prepend=block[0] - 1) != 0))
    found = _pieces_of_scalars([r[1:] for r in rows], starts=starts)  # a piece per (scalar, block)
    ends = np.append(np.flatnonzero(np.diff(owner[starts])) + 1, len(starts))
    out, lo = {}, 0
    for key, hi in zip(key_of, ends.tolist()):
        out[key] = blocks.Pieces(*(getattr(found, f)[lo:hi] for f in blocks.FIELDS))
        lo = hi
    return out


def _memory_pieces_of(stored: Sequence[StepData], kind: str, spans: list[tuple[int, int]],
                      size: int) -> dict[str, blocks.Pieces]:
    """What `_raw_pieces_of` / `_raw_scalar_pieces_of` read for the steps in `spans`, from step
    messages in memory instead (every stored step of those spans).

    Series stored at the same steps are reduced together, a column each: reductions run down the
    columns, so each series gets the summaries it would alone, and one call for all of them costs
    about what one per series did (the 14 scalars of a measured step: 14 calls -> 1)."""
    inside = sorted((d for d in stored if any(a <= d.step <= b for a, b in spans)), key=lambda d: d.step)
    series: dict[str, tuple[list[int], list[Any]]] = {}
    for d in inside:
        for name, value in (d.arrays if kind == "param" else d.scalars).items():
            steps_, values = series.setdefault(name, ([], []))
            steps_.append(d.step)
            values.append(value)
    together: dict[tuple[tuple[int, ...], str, int], list[str]] = {}
    for name, (steps_, values) in series.items():
        dtype = np.dtype("<f8") if kind == "scalar" else np.dtype("<" + array_dtype(name))
        width = 1 if kind == "scalar" else len(values[0]) // dtype.itemsize
        together.setdefault((tuple(steps_), dtype.str, width), []).append(name)
    found: dict[str, blocks.Pieces] = {}
    for (steps_, code, width), names in together.items():
        dtype = np.dtype(code)
        if kind == "scalar":
            values = np.array([series[n][1] for n in names], dtype=np.float64).T
            pieces = blocks.from_values(np.array(steps_, dtype=np.int64), values, None, size, dtype=np.float64)
        else:
            values = np.concatenate([np.frombuffer(b"".join(series[n][1]), dtype=dtype).reshape(len(steps_), width)
                                     for n in names], axis=1)
            missing = absent_mask(values) if dtype.kind == "f" else None
            pieces = blocks.from_values(np.array(steps_, dtype=np.int64), values, missing, size)
        for j, name in enumerate(names):
            cols = slice(j * width, (j + 1) * width)
            found[name] = blocks.Pieces(pieces.first, pieces.rows, pieces.low[:, cols], pieces.high[:, cols],
                                        pieces.total[:, cols], pieces.finite[:, cols], pieces.nan[:, cols])
    return found


def _block_pieces_of(conn: Connection, run_id: str, kind: str, names: list[str], size: int,
                     ranges: list[tuple[int, int]]) -> dict[str, blocks.Pieces]:
    """Per series, its stored blocks of a size numbered in `ranges`, all parameters (each
    block's parts, in order, joined)."""
    b = metric_blocks.c
    rows = _plain_rows(conn, select(b.metric, b.first_step, b.step_count, b.data).where(
        b.run_id == run_id, b.kind == kind, b.metric.in_(names), b.size == size,
        or_(*[b.block.between(lo, hi) for lo, hi in ranges])
    ).order_by(b.metric, b.block, b.part))
    return {name: _joined_blocks([r[1:] for r in mine], blocks.RECORDS[kind]) for name, mine in _split(rows)}


def _joined_blocks(rows: list[Any], record: np.dtype) -> blocks.Pieces:
    """(first_step, step_count, data) rows of whole blocks, ordered by block and part."""
    heads = [i for i, r in enumerate(rows) if i == 0 or r[0] != rows[i - 1][0]]
    records = np.frombuffer(_joined(rows, 2), dtype=record).reshape(len(heads), -1)
    return blocks.from_records(np.array([rows[i][0] for i in heads], dtype=np.int64),
                               np.array([rows[i][1] for i in heads], dtype=np.int64), records)


def _raw_pieces(conn: Connection, run_id: str, kind: str, name: str, a: int, b: int,
                indices: Sequence[int] | None) -> blocks.Pieces:
    """One piece per stored step of a series in [a, b]: a scalar, or a parameter metric for the
    parameters `indices` (read as blob slices) or all of them."""
    if kind == "scalar":
        s = scalars_table.c
        return _pieces_of_scalars(_plain_rows(conn, select(s.step, s.value, s.special).where(
            s.run_id == run_id, s.key == name, s.step.between(a, b)).order_by(s.step)))
    where = [*_metric_where(run_id, name), param_metrics.c.step.between(a, b)]
    if indices is None:
        rows = _plain_rows(conn, select(param_metrics.c.step, param_metrics.c.data).where(*where)
                           .order_by(param_metrics.c.step))
        width = len(rows[0][1]) // np.dtype(array_dtype(name)).itemsize if rows else 0
    else:
        size = np.dtype(array_dtype(name)).itemsize
        rows = _plain_rows(conn,
            select(param_metrics.c.step, *[func.substr(param_metrics.c.data, i * size + 1, size) for i in indices])
            .where(*where).order_by(param_metrics.c.step))
        width = len(indices)
    return _pieces_of_values(name, [r[0] for r in rows], _joined(rows, 1), width)


def _stored_pieces(conn: Connection, run_id: str, kind: str, name: str, size: int, a: int, b: int,
                   indices: Sequence[int] | None) -> blocks.Pieces:
    """The stored blocks of a series of a size numbered a..b, for the parameters `indices` (a
    query per part, reading record slices) or all of them (one query)."""
    c = metric_blocks.c
    where = [c.run_id == run_id, c.kind == kind, c.metric == name, c.size == size, c.block.between(a, b)]
    head = [c.first_step, c.step_count]
    record = blocks.RECORDS[kind]
    if indices is None:
        return _joined_blocks(_plain_rows(conn, select(*head, c.data).where(*where).order_by(c.block, c.part)), record)
    wanted: dict[int, list[tuple[int, int]]] = {}  # part -> [(position asked, offset in the part)]
    for position, index in enumerate(indices):
        wanted.setdefault(index // blocks.PART, []).append((position, index % blocks.PART))
    rows: list[Any] = []
    columns, order = [], []
    for part, offsets in wanted.items():
        cells = [func.substr(c.data, o * record.itemsize + 1, record.itemsize) for _, o in offsets]
        rows = _plain_rows(conn, select(*head, *cells).where(*where, c.part == part).order_by(c.block))
        raw = _joined(rows, 2)
        columns.append(np.frombuffer(raw, dtype=record).reshape(len(rows), len(offsets)))
        order += [p for p, _ in offsets]
    if not columns:
        return blocks.empty(0)
    records = np.concatenate(columns, axis=1)[:, np.argsort(order)]
    return blocks.from_records(np.array([r[0] for r in rows], dtype=np.int64),
                               np.array([r[1] for r in rows], dtype=np.int64), records)


def backfill_blocks(conn: Connection) -> None:
    """Compute the closed blocks of every stored run (migration 0004), a range of the largest
    block size at a time (into the table the migration just made: none is stored yet)."""
    top = blocks.SIZES[-1]
    for run_id, last_step in conn.execute(select(runs.c.id, runs.c.last_step).where(runs.c.last_step.is_not(None))).all():
        ranges = conn.execute(select((steps.c.step // top).label("r")).where(steps.c.run_id == run_id)
                              .distinct()).scalars().all()
        for r in sorted(int(r) for r in ranges):
            found = conn.execute(select(steps.c.step).where(
                steps.c.run_id == run_id, steps.c.step.between(r * top, (r + 1) * top - 1))).scalars().all()
            _update_blocks(conn, run_id, list(found), None, last_step)


def _storable(*texts: str | None) -> bool:
    """False if a text holds U+0000: PostgreSQL cannot even compare it (SQLite can), and the
    protocol refuses it in anything stored, so a lookup by it finds nothing on either database."""
    return not any(t and "\x00" in t for t in texts)


def _metric_where(run_id: str, metric: str) -> list[Any]:
    return [param_metrics.c.run_id == run_id, param_metrics.c.metric == metric]


def _window(column: Any, start: int | None, end: int | None) -> list[Any]:
    """Conditions for `start <= column <= end`, either bound optional."""
    return ([column >= start] if start is not None else []) + ([column <= end] if end is not None else [])


def _describe_mismatch(run_id: str, stored: list[str], sent: list[str]) -> str:
    if len(stored) != len(sent):
        detail = f"it has {len(stored)} parameters, the hello lists {len(sent)}"
    else:
        i = next(i for i, (a, b) in enumerate(zip(stored, sent)) if a != b)
        detail = f"parameter {i} is {stored[i]!r}, the hello says {sent[i]!r}"
    return (f"run {run_id!r} already exists with different parameters ({detail}); "
            "start a new run (another run id) for a changed model")

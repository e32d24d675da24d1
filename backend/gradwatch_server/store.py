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
import json
import math
import re
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
    case,
    create_engine,
    delete,
    event,
    func,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, IntegrityError, NoSuchModuleError, OperationalError

from . import migrations
from .protocol import Hello, array_dtype
from .schema import diagnoses, findings, groups, param_metrics, params, runs, series_names, steps
from .schema import scalars as scalars_table

#: `scalars.special` codes (see schema.py): values SQLite cannot keep in a REAL column.
SPECIAL_NAN = 1
SPECIAL_NEG_ZERO = 2

RUN_STATUSES = ("running", "finished", "crashed")


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
    # WAL: readers (dashboard, exports) never block the writer (ingest), nor it them.
    cursor.execute("PRAGMA journal_mode=WAL")
    # NORMAL: in WAL mode a commit survives a crash of the process; only an OS crash or power
    # loss can undo the last commits, and fsync on every step would cost far more.
    cursor.execute("PRAGMA synchronous=NORMAL")
    # Wait up to 10 s for another process's write (e.g. `gradwatch import`) instead of failing.
    cursor.execute("PRAGMA busy_timeout=10000")
    # SQLite ignores foreign keys unless asked; deleting a run relies on ON DELETE CASCADE.
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


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


def _to_run(row: Any) -> Run:
    data = row._asdict()
    data["config"] = json.loads(data["config"])
    return Run(**data)


class Store:
    """All reads and writes of runs; safe to share between threads."""

    def __init__(self, engine: Engine, clock: Callable[[], float] = time.time) -> None:
        self.engine = engine
        self._clock = clock
        self._serial = engine.dialect.name == "sqlite"
        self._write_lock = threading.Lock()
        self._known_names: set[tuple[str, str, str]] = set()

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
            select(runs.c.last_seq, runs.c.status).where(runs.c.id == run_id).with_for_update()
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
            run = _to_run(conn.execute(select(runs).where(runs.c.id == info.id)).one())
        return OpenedRun(run=run, created=existing is None,
                         resumed_from=None if existing is None else existing.status)

    def write_steps(self, run_id: str, batch: Sequence[StepData]) -> list[bool]:
        """Store step messages in one transaction; per message, False if it was stored already.

        A message is skipped when its seq is not above the run's committed seq, or its step is
        stored (then only the committed seq advances): resending is harmless.
        """
        now = self._clock()
        stored = [False] * len(batch)
        new_names: set[tuple[str, str, str]] = set()
        with self._write() as conn:
            last_seq = self._lock_run(conn, run_id).last_seq
            fresh = []
            for i, data in enumerate(batch):
                if data.seq > last_seq:
                    last_seq = data.seq
                    fresh.append(i)
            if not fresh:
                return stored
            have = set(conn.execute(select(steps.c.step).where(
                steps.c.run_id == run_id, steps.c.step.in_({batch[i].step for i in fresh}))).scalars())
            for i in fresh:
                if batch[i].step not in have:
                    have.add(batch[i].step)
                    stored[i] = True
            new = [data for data, keep in zip(batch, stored) if keep]
            if new:
                conn.execute(insert(steps), [
                    {"run_id": run_id, "step": d.step, "seq": d.seq, "time": d.time} for d in new])
                scalar_rows = [{"run_id": run_id, "key": k, "step": d.step, "value": v, "special": sp}
                               for d in new for k, (v, sp) in ((k, _encode_scalar(x)) for k, x in d.scalars.items())]
                if scalar_rows:
                    conn.execute(insert(scalars_table), scalar_rows)
                array_rows = [{"run_id": run_id, "metric": m, "step": d.step, "data": raw, "dtype": array_dtype(m)}
                              for d in new for m, raw in d.arrays.items()]
                if array_rows:
                    conn.execute(insert(param_metrics), array_rows)
                new_names |= self._add_names(conn, run_id, "scalar", {k for d in new for k in d.scalars})
                new_names |= self._add_names(conn, run_id, "param", {m for d in new for m in d.arrays})
            top = max((d.step for d in new), default=None)
            last_step = runs.c.last_step if top is None else case(
                (or_(runs.c.last_step.is_(None), runs.c.last_step < top), top), else_=runs.c.last_step)
            conn.execute(update(runs).where(runs.c.id == run_id).values(
                last_seq=last_seq, steps=runs.c.steps + len(new), last_step=last_step, updated_at=now,
            ))
        self._known_names |= new_names  # only once committed
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

    def rename_run(self, run_id: str, name: str) -> bool:
        with self._write() as conn:
            result = conn.execute(
                update(runs).where(runs.c.id == run_id).values(name=name, updated_at=self._clock())
            )
        return result.rowcount > 0

    def delete_run(self, run_id: str) -> bool:
        """Delete a run and everything stored for it (ON DELETE CASCADE)."""
        with self._write() as conn:
            result = conn.execute(delete(runs).where(runs.c.id == run_id))
        self._known_names = {k for k in self._known_names if k[0] != run_id}
        return result.rowcount > 0

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
        return None if row is None else _to_run(row)

    def list_runs(self, *, project: str | None = None, q: str | None = None, status: str | None = None,
                  limit: int = 100, offset: int = 0) -> tuple[list[Run], int]:
        """Matching runs, newest first, and how many match in all."""
        if not _storable(project, q):
            return [], 0
        where = []
        if project is not None:
            where.append(runs.c.project == project)
        if status is not None:
            where.append(runs.c.status == status)
        if q:
            where.append(or_(runs.c.name.icontains(q, autoescape=True),
                             runs.c.project.icontains(q, autoescape=True)))
        with self.engine.connect() as conn:
            count = conn.execute(select(func.count()).select_from(runs).where(*where)).scalar_one()
            rows = conn.execute(
                select(runs).where(*where).order_by(runs.c.created_at.desc(), runs.c.id)
                .limit(limit).offset(offset)
            ).all()
        return [_to_run(r) for r in rows], count

    def running_run_ids(self) -> list[str]:
        with self.engine.connect() as conn:
            return list(conn.execute(select(runs.c.id).where(runs.c.status == "running")).scalars())

    def get_params(self, run_id: str) -> list[Param]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(params).where(params.c.run_id == run_id).order_by(params.c.idx)).all()
        return [Param(index=r.idx, name=r.name, shape=json.loads(r.shape), numel=r.numel, dtype=r.dtype,
                      group=r.group_idx, optimizer=r.optimizer_idx) for r in rows]

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
            rows = conn.execute(
                select(scalars_table.c.step, scalars_table.c.value, scalars_table.c.special)
                .where(scalars_table.c.run_id == run_id, scalars_table.c.key == key, *where)
                .order_by(scalars_table.c.step)
            ).all()
        return np.array([r.step for r in rows], dtype=np.int64), _decode_scalars(rows)

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
            rows = conn.execute(
                select(param_metrics.c.step, param_metrics.c.data)
                .where(*_metric_where(run_id, metric), *_window(param_metrics.c.step, start, end))
                .order_by(param_metrics.c.step)
            ).all()
        dtype = "<" + array_dtype(metric)
        width = len(rows[0].data) // np.dtype(dtype).itemsize if rows else 0
        matrix = np.frombuffer(b"".join(r.data for r in rows), dtype=dtype).reshape(len(rows), width)
        return np.array([r.step for r in rows], dtype=np.int64), matrix

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
            rows = conn.execute(
                select(param_metrics.c.step, *slices)
                .where(*_metric_where(run_id, metric), *_window(param_metrics.c.step, start, end))
                .order_by(param_metrics.c.step)
            ).all()
        raw = b"".join(bytes(cell) for r in rows for cell in r[1:])
        matrix = np.frombuffer(raw, dtype=dtype).reshape(len(rows), len(indices))
        return np.array([r.step for r in rows], dtype=np.int64), matrix

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

"""Storage: the only package that speaks SQL (SQLAlchemy Core; SQLite or PostgreSQL).

`open_store(url)` creates the engine, applies migrations and returns a `Store`; nothing happens
at import. The interface is narrow: a run is opened from a `hello`, steps are written one
message per transaction, and reads return plain records and numpy arrays.

`Store` is a thin front: it owns the engine, the transactions and what the store keeps in memory
(the series names it knows are stored, the recent steps of each run: tails.py), and each method
hands a connection to the module of its job: `runs`, `steps`, `series`, `findings`, the blocks'
SQL (`blocks_sql`), and the `engine` (URLs, pragmas, size, compaction).

Writes are serialized by one lock per store: SQLite allows one writer at a time, and taking
turns in-process is cheaper than meeting a locked database. On PostgreSQL the run's row is
locked (`FOR UPDATE`) instead, so concurrent writers to one run cannot double-count a step.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np
from sqlalchemy import Connection, Engine
from sqlalchemy.exc import IntegrityError, OperationalError

from .. import blocks, migrations, tails
from ..jobs.memory import JobMemory
from ..protocol import Hello
from . import admission as _admission
from . import engine as _engine
from . import findings as _findings
from . import jobs as _jobs
from . import ranks as _ranks
from . import runs as _runs
from . import series as _series
from . import spread as _spread
from . import steps as _steps
from .blocks_sql import backfill_blocks
from .engine import create_db_engine, display_url
from .jobs import Assembly, OpenedRank, RankSummaries
from .param_lists import ParamList, ParamLists
from .ranks import PartialRange
from .records import (
    RUN_STATUSES,
    SEVERITIES,
    DiagnosisMark,
    Group,
    OpenedRun,
    Param,
    ParamsMismatch,
    Run,
    StepData,
    StoredFinding,
    StoredStep,
    StoreError,
    UnknownRun,
)
from .rows import storable
from .spread import SpreadRows
from .steps import NotifyInTransaction
from .values import SPECIAL_NAN, SPECIAL_NEG_ZERO

__all__ = [
    "RUN_STATUSES",
    "Assembly",
    "JobMemory",
    "OpenedRank",
    "SEVERITIES",
    "SPECIAL_NAN",
    "SPECIAL_NEG_ZERO",
    "DiagnosisMark",
    "Group",
    "NotifyInTransaction",
    "OpenedRun",
    "Param",
    "PartialRange",
    "ParamsMismatch",
    "RankSummaries",
    "SpreadRows",
    "Run",
    "StepData",
    "StoredStep",
    "Store",
    "StoreError",
    "StoredFinding",
    "UnknownRun",
    "backfill_blocks",
    "create_db_engine",
    "display_url",
    "open_store",
]


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


class Store:
    """All reads and writes of runs; safe to share between threads."""

    def __init__(self, engine: Engine, clock: Callable[[], float] = time.time) -> None:
        self.engine = engine
        self._clock = clock
        self._serial = engine.dialect.name == "sqlite"
        self._write_lock = threading.Lock()
        self._known_names: set[_steps.SeriesName] = set()
        self._tails = tails.Tails()
        self.param_lists = ParamLists()

    def close(self) -> None:
        self.engine.dispose()

    @contextlib.contextmanager
    def _write(self) -> Iterator[Connection]:
        """One transaction: committed on success, rolled back on any error."""
        with self._write_lock if self._serial else contextlib.nullcontext():
            with self.engine.begin() as conn:
                yield conn

    @contextlib.contextmanager
    def _read(self) -> Iterator[Connection]:
        with self.engine.connect() as conn:
            yield conn

    # -- runs ------------------------------------------------------------------------------

    def open_run(self, hello: Hello) -> OpenedRun:
        """Create the run of a `hello`, or resume it (same parameter names, same order)."""
        try:
            with self._write() as conn:
                return _runs.open_run(conn, hello, self._clock())
        except IntegrityError:
            # On PostgreSQL writers do not take turns: two hellos of a new run may both find no
            # row, and the second insert fails. The run exists now, so this hello resumes it.
            with self._write() as conn:
                return _runs.open_run(conn, hello, self._clock())

    def open_rank(self, hello: Hello) -> OpenedRank:
        """Open a rank's run and its job's run from a hello with `dist` (jobs.open_rank)."""
        try:
            with self._write() as conn:
                opened = _jobs.open_rank(conn, hello, self._clock(), self.param_lists)
        except IntegrityError:  # PostgreSQL: another rank's hello created the job's run meanwhile
            with self._write() as conn:
                opened = _jobs.open_rank(conn, hello, self._clock(), self.param_lists)
        if opened.job_created:  # the ranks that follow may name its list by digest
            self.param_lists.remember_job(hello.params, hello.groups)
        return opened

    def open_ranks(self, hellos: Sequence[Hello]) -> list[OpenedRank | ParamsMismatch]:
        """Open the runs of several ranks' hellos of one job in one transaction (admission.py):
        per hello, what `open_rank` returns, or the ParamsMismatch it raises."""
        try:
            with self._write() as conn:
                opened = _admission.open_ranks(conn, hellos, self._clock(), self.param_lists)
        except IntegrityError:  # PostgreSQL: another worker's hello created a run meanwhile
            with self._write() as conn:
                opened = _admission.open_ranks(conn, hellos, self._clock(), self.param_lists)
        for hello, result in zip(hellos, opened):
            if isinstance(result, OpenedRank) and result.job_created:
                self.param_lists.remember_job(hello.params, hello.groups)
        return opened

    def resolve_params(self, job: str, digest: str) -> tuple[ParamList | None, bool]:
        """The parameter list and groups `digest` names (protocol v2): known to this store, or
        `job`'s stored list if that is its digest (None if neither); and whether `job`'s run
        exists (param_lists.py)."""
        if not storable(job):
            return self.param_lists.known(digest), False
        with self._read() as conn:
            return self.param_lists.resolve(conn, job, digest)

    def assemble(
        self,
        job: str,
        rank_timeout: float,
        since: float,
        notify: NotifyInTransaction | None = None,
        late: Sequence[int] = (),
        memory: JobMemory | None = None,
    ) -> Assembly:
        """Assemble the job's ready steps into its run, in one transaction (jobs.assemble; ranks'
        silence counts from `since` at the earliest; `late`: steps a rank has just stored, whose
        partial job steps are assembled again where complete now; `memory`: what the caller
        keeps of the job between assemblies, the ranks' steps it stored included)."""
        with self._write() as conn:
            done = _jobs.assemble(
                conn, job, self._clock(), rank_timeout, since, self._known_names, self._tails, notify, late, memory
            )
        written = done.written
        if written is not None and written.changed:  # only once committed
            self._known_names |= written.names
            self._tails.keep(job, written.tail)
        return done

    def running_jobs(self) -> list[str]:
        with self._read() as conn:
            return _jobs.running_jobs(conn)

    def rank_runs(self, job: str) -> list[Run]:
        """The runs of a distributed job's ranks, by rank (none for any other run)."""
        if not storable(job):
            return []
        with self._read() as conn:
            return _jobs.rank_runs(conn, job)

    def rank_spread(self, job: str, key: str, window: int) -> SpreadRows:
        """A per-rank figure's spread across the job's ranks over its last `window` steps, and
        the ranks' values over the window's last steps, for the outliers (spread.py)."""
        if not storable(job):
            return SpreadRows.empty()
        with self._read() as conn:
            return _spread.read_spread(conn, job, key, window)

    def rank_summaries(self, job: str, first: int | None = None, last: int | None = None) -> RankSummaries:
        """The summaries of a job's rank steps (rank_summaries) in steps `first`..`last`, as
        arrays by (rank, step) (jobs.rank_summaries)."""
        if not storable(job):
            return _jobs.RankSummaries.empty()
        with self._read() as conn:
            return _jobs.rank_summaries(conn, job, first, last)

    def lost_ranks(
        self, job: str, rank_timeout: float, since: float | None = None, memory: JobMemory | None = None
    ) -> list[int]:
        """The ranks of a job that are lost now (jobs.lost_ranks): `--rank-timeout` is the
        setting's, `since` when the asking process first saw the job (None: the job's start),
        `memory` what it heard of the ranks."""
        if not storable(job):
            return []
        with self._read() as conn:
            return _jobs.lost_ranks(conn, job, self._clock(), rank_timeout, since, memory)

    def close_run(self, run_id: str, *, seq: int, status: str) -> bool:
        """Apply a `close` message; False if it was applied already."""
        with self._write() as conn:
            return _runs.close_run(conn, run_id, seq, status, self._clock())

    def mark_crashed(self, run_id: str, idle_since: float) -> bool:
        """Mark a run crashed if it is running and unchanged since `idle_since`; True if so."""
        with self._write() as conn:
            return _runs.mark_crashed(conn, run_id, idle_since, self._clock())

    def set_status(self, run_id: str, status: str, finished_at: float | None) -> None:
        """Set a run's status outright (an imported run: no hook will send `close`)."""
        with self._write() as conn:
            _runs.set_status(conn, run_id, status, finished_at, self._clock())

    def update_run(self, run_id: str, *, name: str | None = None, tags: Sequence[str] | None = None) -> bool:
        """Rename a run and/or replace its tags (None: unchanged); False if there is no such run."""
        with self._write() as conn:
            return _runs.update_run(conn, run_id, name, tags)

    def delete_run(self, run_id: str) -> bool:
        """Delete a run and everything stored for it, in one transaction; its id is remembered (deleted_at)."""
        with self._write() as conn:
            deleted = _runs.delete_run(conn, run_id, self._clock())
        ranks = f"{run_id}.r"  # a job's ranks' runs go with it (ON DELETE CASCADE)
        self._known_names = {k for k in self._known_names if k[0] != run_id and not k[0].startswith(ranks)}
        return deleted

    def deleted_at(self, run_id: str) -> float | None:
        """When the run `run_id` was deleted (Unix seconds), or None: never stored, or stored now."""
        if not storable(run_id):
            return None
        with self._read() as conn:
            return _runs.deleted_at(conn, run_id)

    def runs_to_collect(
        self, *, created_before: float | None = None, status: str | None = None, project: str | None = None
    ) -> list[Run]:
        """The runs `gradwatch gc` may delete, oldest first (never a running one)."""
        if not storable(project):
            return []
        with self._read() as conn:
            return _runs.runs_to_collect(conn, created_before, status, project)

    def get_run(self, run_id: str) -> Run | None:
        if not storable(run_id):
            return None
        with self._read() as conn:
            return _runs.get_run(conn, run_id)

    def list_runs(
        self,
        *,
        project: str | None = None,
        q: str | None = None,
        status: str | None = None,
        tag: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> tuple[list[Run], int]:
        """Matching runs, newest first, and how many match in all."""
        if not storable(project, q, tag):
            return [], 0
        with self._read() as conn:
            return _runs.list_runs(conn, project, q, status, tag, limit, offset)

    def running_run_ids(self) -> list[str]:
        with self._read() as conn:
            return _runs.running_run_ids(conn)

    def get_params(self, run_id: str) -> list[Param]:
        with self._read() as conn:
            return _runs.get_params(conn, run_id)

    def get_groups(self, run_id: str) -> list[Group]:
        with self._read() as conn:
            return _runs.get_groups(conn, run_id)

    def series_names(self, run_id: str, kind: str) -> list[str]:
        """Sorted names of a run's scalar series (`kind="scalar"`) or parameter metrics ("param")."""
        with self._read() as conn:
            return _runs.get_series_names(conn, run_id, kind)

    # -- a distributed job's partial steps, as ranges (reads) ---------------------------------

    def partial_ranges(self, run_id: str) -> list[PartialRange]:
        """A job's steps stored without some rank, as ranges (store/ranks.py)."""
        with self._read() as conn:
            return _ranks.partial_ranges(conn, run_id)

    # -- steps -----------------------------------------------------------------------------

    def write_steps(
        self,
        run_id: str,
        batch: Sequence[StepData],
        notify: NotifyInTransaction | None = None,
        rank_run: bool = False,
    ) -> list[bool]:
        """Store step messages in one transaction; per message, False if it was stored already
        (steps.write_steps). `notify` (PostgreSQL, `serve --workers N`) names the NOTIFY to send
        in that transaction. `rank_run`: a rank's own run of a job (no blocks)."""
        with self._write() as conn:
            written = _steps.write_steps(
                conn, run_id, batch, self._clock(), self._known_names, self._tails, notify, param_blocks=not rank_run
            )
        if written.changed:  # only once committed
            self._known_names |= written.names
            self._tails.keep(run_id, written.tail)
        return written.stored

    def try_write_steps(self, run_id: str, batch: Sequence[StepData]) -> list[bool] | None:
        """`write_steps` of a run of its own, done now only if it need not wait: on SQLite, with
        no other write of this store under way and the file not locked by another process
        (SQLite's busy wait turned off meanwhile). None where it would have waited, nothing
        stored: the caller stores the batch on a thread, where a wait blocks no one. For the
        event loop, where a thread's hand-off and the loop's wake cost more than storing a small
        batch (docs/design.md)."""
        if not self._serial or not self._write_lock.acquire(blocking=False):
            return None
        try:
            with self.engine.connect() as conn:
                conn.exec_driver_sql("PRAGMA busy_timeout=0")
                conn.commit()  # (SQLAlchemy's autobegun transaction: SQLite began none)
                try:
                    with conn.begin():
                        written = _steps.write_steps(
                            conn, run_id, batch, self._clock(), self._known_names, self._tails, None
                        )
                except OperationalError as exc:
                    if "locked" in str(exc) or "busy" in str(exc):
                        return None
                    raise
                finally:
                    conn.exec_driver_sql(f"PRAGMA busy_timeout={_engine.BUSY_TIMEOUT_MS}")
                    conn.commit()
        finally:
            self._write_lock.release()
        if written.changed:
            self._known_names |= written.names
            self._tails.keep(run_id, written.tail)
        return written.stored

    def write_rank_steps(
        self, writes: Sequence[tuple[str, Sequence[StepData], NotifyInTransaction | None]]
    ) -> list[list[bool] | Exception]:
        """Store the batches of several ranks' runs (distinct run ids) in one transaction: a
        group commit, whose cost is shared by the ranks' frames (a large job's frames each in a
        transaction of its own spent more on the commits than on the rows). Per write, what
        `write_steps` returns, or the error it raised: when any write fails, each is stored
        again in a transaction of its own, so that one deleted run harms no other."""
        if not writes:
            return []
        try:
            with self._write() as conn:
                done = _steps.write_rank_batches(conn, writes, self._clock(), self._known_names)
        except Exception as exc:
            if len(writes) == 1:
                return [exc]
            alone: list[list[bool] | Exception] = []
            for one_write in writes:
                try:
                    alone.append(self.write_rank_steps([one_write])[0])
                except Exception as one:
                    alone.append(one)
            return alone
        for written in done:
            if written.changed:  # only once committed
                self._known_names |= written.names
        return [written.stored for written in done]

    def step_times(self, run_id: str, wanted: Sequence[int] | np.ndarray) -> tuple[np.ndarray, float | None]:
        with self._read() as conn:
            return _steps.step_times(conn, run_id, wanted)

    def iter_steps(
        self,
        run_id: str,
        *,
        with_scalars: bool = True,
        chunk: int = 256,
        metrics: Iterable[str] | None = None,
        scalar_keys: Iterable[str] | None = None,
        after: int | None = None,
    ) -> Iterator[list[StoredStep]]:
        return _steps.iter_steps(
            self.engine,
            run_id,
            with_scalars=with_scalars,
            chunk=chunk,
            metrics=metrics,
            scalar_keys=scalar_keys,
            after=after,
        )

    def batch_steps(
        self, run_id: str, steps_range: tuple[int, int], seq_range: tuple[int, int] | None
    ) -> list[StoredStep]:
        return _steps.batch_steps(self.engine, run_id, steps_range, seq_range)

    # -- series ----------------------------------------------------------------------------

    def scalar_series(
        self, run_id: str, key: str, start: int | None = None, end: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        with self._read() as conn:
            return _series.scalar_series(conn, run_id, key, start, end)

    def metric_steps(self, run_id: str, metric: str, start: int | None = None, end: int | None = None) -> np.ndarray:
        with self._read() as conn:
            return _series.metric_steps(conn, run_id, metric, start, end)

    def metric_rows(
        self, run_id: str, metric: str, start: int | None = None, end: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        with self._read() as conn:
            return _series.metric_rows(conn, run_id, metric, start, end)

    def last_metric_row(
        self, run_id: str, metric: str, start: int | None = None, end: int | None = None
    ) -> tuple[int, np.ndarray] | None:
        with self._read() as conn:
            return _series.last_metric_row(conn, run_id, metric, start, end)

    def metric_columns(
        self, run_id: str, metric: str, indices: Sequence[int], start: int | None = None, end: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        with self._read() as conn:
            return _series.metric_columns(conn, run_id, metric, indices, start, end)

    def series_bounds(
        self, run_id: str, name: str, start: int | None = None, end: int | None = None, kind: str = "param"
    ) -> tuple[int, int] | None:
        with self._read() as conn:
            return _series.series_bounds(conn, run_id, name, start, end, kind)

    def series_count(self, run_id: str, name: str, lo: int, hi: int, kind: str = "param") -> int:
        with self._read() as conn:
            return _series.series_count(conn, run_id, name, lo, hi, kind)

    def series_stretches(
        self,
        run_id: str,
        name: str,
        lo: int,
        hi: int,
        size: int,
        indices: Sequence[int] | None = None,
        kind: str = "param",
    ) -> blocks.Stretches:
        with self._read() as conn:
            return _series.series_stretches(conn, run_id, name, lo, hi, size, indices, kind)

    # -- findings (diagnostics) ------------------------------------------------------------

    def save_findings(
        self, run_id: str, found: Sequence[StoredFinding], mark: DiagnosisMark | None = None, *, replace: bool = False
    ) -> None:
        """Store findings and the mark in one transaction (findings.save_findings)."""
        with self._write() as conn:
            _findings.save_findings(conn, run_id, found, mark, replace, self._clock())

    def get_findings(self, run_id: str) -> list[StoredFinding]:
        with self._read() as conn:
            return _findings.get_findings(conn, run_id)

    def get_diagnosis(self, run_id: str) -> DiagnosisMark | None:
        with self._read() as conn:
            return _findings.get_diagnosis(conn, run_id)

    # -- maintenance (gradwatch gc) --------------------------------------------------------

    def database_bytes(self) -> int:
        return _engine.database_bytes(self.engine)

    def compact(self) -> None:
        _engine.compact(self.engine)

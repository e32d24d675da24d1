"""Live updates across the worker processes of `gradwatch serve --workers N` (PostgreSQL LISTEN/NOTIFY).

Every event (a run created or changing status, steps stored, a finding) is NOTIFYed on the
channel `gradwatch_live`, and every worker, the publisher included, delivers to its browsers only
what its listener receives: each browser gets each event once, in commit order, whichever worker
it is connected to. The steps' notification is sent in the transaction that stores them, so a
hook that moves to another worker never has its later steps shown first and a worker killed
after a commit cannot lose it. Steps that got the flight recorder's arrays late are announced
after their commit (`{"k": "late", "run", "steps": [lo, hi]}`): a worker whose browsers watch the
run reads the stored steps of that range back and sends them marked `flight/resent`, as one
process does, so that the pages fetch their series again. Payloads must stay under PostgreSQL's 8000 bytes, so steps always
travel as a reference (`{"k": "steps", "run", "steps": [lo, hi], "seq": [lo, hi]}`) read back
only by a worker whose browsers watch the run; run events and findings travel whole when they fit.
A broken connection makes browsers reconnect and catch up over REST (close code 1013). A worker
holding a run's hook holds a shared advisory lock on it, which crash detection asks about.
The same channel carries the jobs' coordination (jobs/assembler.py): the worker that owns a
job's assembly holds an exclusive advisory lock on it (`owns`), and the others tell it when their
ranks have stored a step (`{"k": "job"}`) or ask a replica connected to them for its arrays
(`{"k": "ask"}`).
With one process (SQLite, or no --workers) LiveHub delivers directly and nothing here runs.
The reasoning, case by case: docs/design.md, Live updates across workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import logging
import math
import os
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.conninfo import make_conninfo
from sqlalchemy.engine import make_url

from .live import LIVE_LINGER_S, LiveHub, finding_event, run_event
from .protocol import RESENT, Step
from .store import Run, StepData, Store, StoreError, display_url

if TYPE_CHECKING:
    from .jobs.assembler import JobAssembler

log = logging.getLogger("gradwatch.relay")

CHANNEL = "gradwatch_live"
#: PostgreSQL refuses a NOTIFY payload of 8000 bytes or more.
MAX_PAYLOAD = 7999
#: Notifications waiting to be sent; beyond this (the database is away) they are dropped and the
#: other workers are told to resync once it is back.
MAX_OUTBOX = 10_000
#: Notifications sent in one pipeline.
BATCH = 256
RETRY_MIN_S, RETRY_MAX_S = 0.25, 10.0
#: At shutdown, how long queued notifications may take to go out.
FLUSH_S = 2.0
#: How often a worker that does not own a job tries to take it (its owner may be gone).
OWN_RETRY_S = 1.0
#: Most steps a job's note names as possibly completing partial steps (a range, expanded).
LATE_SPAN = 4096


def conninfo(db_url: str) -> str:
    """A libpq connection string for the database of a SQLAlchemy URL (postgresql+psycopg://...)."""
    url = make_url(db_url)
    params: dict[str, Any] = {
        "host": url.host,
        "port": url.port,
        "user": url.username,
        "password": url.password,
        "dbname": url.database,
        "application_name": f"gradwatch relay {os.getpid()}",  # which worker (pg_stat_activity)
    }
    params.update({k: v if isinstance(v, str) else v[-1] for k, v in url.query.items()})
    return make_conninfo(**{k: v for k, v in params.items() if v is not None})


def hook_lock_key(run_id: str) -> int:
    """The advisory lock key of a run's hooks: 64 bits of a hash of its id, as a signed bigint."""
    digest = hashlib.blake2b(b"gradwatch.hook\x00" + run_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def job_lock_key(job: str) -> int:
    """The advisory lock key of a job's assembly (its owner holds it): as `hook_lock_key`."""
    digest = hashlib.blake2b(b"gradwatch.job\x00" + job.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


@dataclass(frozen=True)
class Event:
    """A notification (of any worker, this one included), checked."""

    kind: str
    run_id: str
    text: str | None
    steps: tuple[int, int] = (0, 0)
    seq: tuple[int, int] = (0, 0)
    code: str = ""
    #: a job's note to its owner ("job": the worker, its ranks' step, a close) or an ask of a
    #: replica's arrays ("ask": the rank, its steps in `late`)
    worker: str = ""
    step: int = -1
    late: tuple[int, ...] = ()
    closed: bool = False
    ranks: int | None = None

    @classmethod
    def parse(cls, payload: dict[str, Any]) -> Event:
        kind, text = payload["k"], payload.get("text")
        if kind not in ("run", "steps", "late", "finding", "resync", "job", "ask") or not isinstance(
            text, (str, type(None))
        ):
            raise ValueError(f"unknown kind {kind!r}")
        run_id = "" if kind == "resync" else str(payload["run"])
        if kind == "job":
            lo, hi = (int(v) for v in payload.get("late") or (0, -1))
            late = tuple(range(max(lo, hi - LATE_SPAN + 1), hi + 1))
            ranks = payload.get("ranks")
            return cls(
                kind,
                run_id,
                None,
                worker=str(payload["w"]),
                step=int(payload["step"]),
                late=late,
                closed=bool(payload.get("closed")),
                ranks=None if ranks is None else int(ranks),
            )
        if kind == "ask":
            return cls(kind, run_id, None, step=int(payload["rank"]), late=tuple(int(v) for v in payload["steps"]))
        if kind in ("steps", "late"):
            lo, hi = (int(v) for v in payload["steps"])
            first, last = (int(v) for v in payload["seq"]) if kind == "steps" else (0, 0)
            return cls(kind, run_id, None, steps=(lo, hi), seq=(first, last))
        return cls(kind, run_id, text, code=str(payload.get("code", "")))


class RelayedHub(LiveHub):
    """One worker's hub: announces every event on the channel instead of delivering it; `Relay`
    hands what the channel brings (this worker's events included) to LiveHub's delivery methods."""

    def __init__(self, queue_size: int, relay: Relay) -> None:
        super().__init__(queue_size)
        self._relay = relay

    def publish_run(self, run: Run) -> None:
        self._relay.announce("run", run.id, run_event(run))

    def publish_step(self, run_id: str, step: Step) -> None:
        pass  # announced by the transaction that stored it (steps_notice)

    def linger(self, run_id: str) -> float:
        return LIVE_LINGER_S  # browsers on other workers are not known here: keep the live pace

    def publish_steps(self, run_id: str, steps: Sequence[Step]) -> None:
        pass  # announced by the transaction that stored them (steps_notice)

    def publish_late(self, run_id: str, steps: Sequence[Step]) -> None:
        if steps:  # after the commit, so after the notice of the batch's new steps
            self._relay.announce("late", run_id, steps=[min(s.step for s in steps), max(s.step for s in steps)])

    def steps_notice(self, run_id: str) -> Callable[[Sequence[StepData]], tuple[str, str]]:
        def notice(new: Sequence[StepData]) -> tuple[str, str]:
            return CHANNEL, self._relay.payload(
                "steps",
                run_id,
                steps=[min(d.step for d in new), max(d.step for d in new)],
                seq=[min(d.seq for d in new), max(d.seq for d in new)],
            )

        return notice

    def publish_finding(self, run_id: str, finding: dict[str, Any]) -> None:
        self._relay.announce("finding", run_id, finding_event(run_id, finding), code=finding["code"])


class Relay:
    """This worker's two PostgreSQL connections: one LISTENs, one NOTIFYs and holds the hooks' locks.

    `start()` connects both before the worker serves (and fails if it cannot); `close()` sends what
    is queued and closes them. Everything else runs on the event loop and never waits for the
    database: `announce`, `arrived` and `left` queue work for the sending task.
    """

    def __init__(self, db_url: str, store: Store, queue_size: int) -> None:
        if store.engine.dialect.name != "postgresql":
            raise StoreError(f"live updates across workers need PostgreSQL, not {display_url(db_url)}")
        self.worker = secrets.token_hex(8)  # unique across machines sharing the database
        self.store = store
        self.hub = RelayedHub(queue_size, self)
        self._conninfo = conninfo(db_url)
        self._where = display_url(db_url)
        self._outbox: asyncio.Queue[str | None] = asyncio.Queue()  # payloads; None: sync the locks
        self._numbers = itertools.count(1)  # thread-safe: steps' payloads are made in writer threads
        self._lost = False  # notifications were dropped: tell every worker to resync
        self._wanted: set[str] = set()  # runs whose hook this worker holds
        self._held: set[str] = set()  # runs locked on the current notify connection
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._conn_lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._owned: set[str] = set()  # jobs whose assembly this worker owns (locked on `_conn`)
        self._tried: dict[str, float] = {}  # job -> when this worker last tried to take it
        self.jobs: JobAssembler | None = None  # told of the jobs' notes (app.py)
        self._jobs_tasks: set[asyncio.Task[None]] = set()  # the notes being handled
        self._inbox: asyncio.Queue[str] = asyncio.Queue()  # live events received, for `_deliver_all`

    # -- life --------------------------------------------------------------------------------

    async def start(self) -> None:
        listening: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._tasks = [asyncio.create_task(self._listen(listening))]
        try:
            await listening
            async with self._conn_lock:
                await self._notifier()
        except BaseException:
            await self.close()
            raise
        self._tasks += [asyncio.create_task(self._send()), asyncio.create_task(self._deliver_all())]

    async def close(self) -> None:
        if len(self._tasks) > 1:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._outbox.join(), FLUSH_S)
        for task in [*self._tasks, *self._jobs_tasks]:
            task.cancel()
        await asyncio.gather(*self._tasks, *self._jobs_tasks, return_exceptions=True)
        self._tasks = []
        if self._conn is not None:
            await self._conn.close()  # lets go of the hooks' locks
            self._conn = None

    # -- sending -------------------------------------------------------------------------------

    def announce(self, kind: str, run_id: str, text: str | None = None, **reference: Any) -> None:
        """Queue a notification for the sending task."""
        self._queue(self.payload(kind, run_id, text, **reference))

    def payload(self, kind: str, run_id: str, text: str | None = None, **reference: Any) -> str:
        """A notification: `text` (the browser message) inline if it fits, else the reference."""
        event = {"w": self.worker, "n": next(self._numbers), "k": kind, "run": run_id, **reference}
        if text is not None:
            inline = json.dumps({**event, "text": text}, separators=(",", ":"))  # ASCII: len is bytes
            if len(inline) <= MAX_PAYLOAD:
                return inline
        return json.dumps(event, separators=(",", ":"))

    def _queue(self, payload: str | None) -> None:
        if payload is not None and self._outbox.qsize() >= MAX_OUTBOX:
            self._lost = True
            return
        self._outbox.put_nowait(payload)

    async def _send(self) -> None:
        delay = RETRY_MIN_S
        while True:
            batch = [await self._outbox.get()]
            while not self._outbox.empty() and len(batch) < BATCH:
                batch.append(self._outbox.get_nowait())
            payloads = [p for p in batch if p is not None]
            resync = self._lost
            try:
                async with self._conn_lock:
                    conn = await self._notifier()
                    await self._sync_locks(conn)
                    if resync:
                        payloads.insert(0, json.dumps({"w": self.worker, "k": "resync"}))
                    if payloads:
                        async with conn.pipeline():
                            for payload in payloads:
                                await conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, payload))
                if resync:
                    self._lost = False
                delay = RETRY_MIN_S
            except Exception as exc:  # the database is away (psycopg.Error) or worse: never stop sending
                if payloads:
                    self._lost = True
                log.warning(
                    "live relay: cannot notify the workers (%s); %d notifications lost; trying again in %.1f s",
                    exc,
                    len(payloads),
                    delay,
                    exc_info=not isinstance(exc, psycopg.Error),
                )
                await self._drop_connection()
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_S)
                self._queue(None)  # come back: take the hooks' locks again, resync the workers
            finally:
                for _ in batch:
                    self._outbox.task_done()

    async def _notifier(self) -> psycopg.AsyncConnection[Any]:
        """The notify connection (under `_conn_lock`), connected again if it was lost."""
        if self._conn is not None and not (self._conn.closed or self._conn.broken):
            return self._conn
        await self._drop_connection()
        self._conn = await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True)
        self._held = set()  # a new session holds no locks
        self._owned = set()
        if self._wanted:
            self._queue(None)
        return self._conn

    async def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                await conn.close()

    # -- which worker holds a hook (sessions.Presence) -----------------------------------------

    def arrived(self, run_id: str) -> None:
        """This worker now holds a hook of the run (its first connection)."""
        self._wanted.add(run_id)
        self._queue(None)

    def left(self, run_id: str) -> None:
        """This worker holds no hook of the run any more."""
        self._wanted.discard(run_id)
        self._queue(None)

    async def held_elsewhere(self, run_id: str) -> bool:
        """Whether a hook of the run is connected to another worker (raises if it cannot tell).

        This session's own locks never conflict with its requests, so only other workers count."""
        async with self._conn_lock:
            conn = await self._notifier()
            cursor = await conn.execute(
                "SELECT CASE WHEN pg_try_advisory_lock(%(key)s) THEN NOT pg_advisory_unlock(%(key)s) ELSE true END",
                {"key": hook_lock_key(run_id)},
            )
            row = await cursor.fetchone()
        return bool(row and row[0])

    async def _sync_locks(self, conn: psycopg.AsyncConnection[Any]) -> None:
        for run_id in sorted(self._wanted - self._held):
            await conn.execute("SELECT pg_advisory_lock_shared(%s)", (hook_lock_key(run_id),))
            self._held.add(run_id)
        for run_id in sorted(self._held - self._wanted):
            await conn.execute("SELECT pg_advisory_unlock_shared(%s)", (hook_lock_key(run_id),))
            self._held.discard(run_id)

    # -- which worker assembles a job (jobs/assembler.py, Coordinator) --------------------------

    async def owns(self, job: str) -> bool:
        """Whether this worker owns `job`'s assembly: it holds the job's advisory lock on its
        notify connection, taken here if no worker holds it (tried at most every OWN_RETRY_S).
        A worker that dies, or loses that connection, lets go of it: another takes the job."""
        if job in self._owned and self._conn is not None and not self._conn.closed:
            return True
        now = asyncio.get_running_loop().time()
        if now - self._tried.get(job, -math.inf) < OWN_RETRY_S:
            return False
        self._tried[job] = now
        try:
            async with self._conn_lock:
                conn = await self._notifier()
                cursor = await conn.execute("SELECT pg_try_advisory_lock(%s)", (job_lock_key(job),))
                row = await cursor.fetchone()
                if row and row[0]:
                    self._owned.add(job)
                    self._tried.pop(job, None)
        except psycopg.Error as exc:  # the database is away: the store's lock still orders assemblies
            log.warning("live relay: cannot ask who assembles job %s (%s)", job, exc)
        return job in self._owned

    async def release(self, job: str) -> None:
        """`job` is settled: let go of its lock (a resumed job is taken again by its next frame)."""
        self._tried.pop(job, None)
        if job not in self._owned:
            return
        self._owned.discard(job)
        with contextlib.suppress(psycopg.Error):
            async with self._conn_lock:
                conn = await self._notifier()
                await conn.execute("SELECT pg_advisory_unlock(%s)", (job_lock_key(job),))

    def tell_owner(
        self, job: str, step: int, late: Sequence[int] = (), closed: bool = False, ranks: int | None = None
    ) -> None:
        reference: dict[str, Any] = {"step": step}
        if ranks is not None:
            reference["ranks"] = ranks
        if late:
            reference["late"] = [min(late), max(late)]
        if closed:
            reference["closed"] = True
        self.announce("job", job, **reference)

    def ask_elsewhere(self, job: str, rank: int, steps: list[int]) -> None:
        self.announce("ask", job, rank=rank, steps=steps[:LATE_SPAN])

    # -- receiving -----------------------------------------------------------------------------

    async def _listen(self, listening: asyncio.Future[None]) -> None:
        delay = RETRY_MIN_S
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True) as conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    if listening.done():
                        log.warning("live relay: listening again; browsers reconnect and catch up over REST")
                        self.hub.drop_all()  # what the others announced meanwhile is lost
                    else:
                        listening.set_result(None)
                    delay = RETRY_MIN_S
                    async for note in conn.notifies():
                        if not self._job_note(note.payload):
                            self._inbox.put_nowait(note.payload)
            except Exception as exc:  # the database is away (psycopg.Error) or worse: never stop listening
                if not listening.done():
                    listening.set_exception(StoreError(f"cannot listen for the other workers on {self._where}: {exc}"))
                    return
                log.warning(
                    "live relay: lost the connection that listens to the other workers (%s); "
                    "connecting again in %.1f s",
                    exc,
                    delay,
                    exc_info=not isinstance(exc, psycopg.Error),
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_S)

    def _job_note(self, payload: str) -> bool:
        """Handle a job's note or ask at once (in a task of its own); False for anything else,
        which `_deliver_all` hands to the browsers in order. Not behind them: a live event's
        read-back (a watched run's steps) would hold up the owner's next assembly."""
        try:
            note = json.loads(payload)
            if not isinstance(note, dict) or note.get("k") not in ("job", "ask"):
                return False
            event = Event.parse(note)
        except (ValueError, KeyError, TypeError, AttributeError):
            return False  # `_receive` says what is wrong with it
        jobs = self.jobs
        if jobs is not None and event.kind == "job" and event.worker != self.worker:
            self._spawn(jobs.told(event.run_id, event.worker, event.step, event.late, event.closed, event.ranks))
        elif jobs is not None and event.kind == "ask":
            self._spawn(jobs.ask_here(event.run_id, event.step, list(event.late)))
        return True

    async def _deliver_all(self) -> None:
        """The live events as they came, one after the other (a read-back awaited in turn)."""
        while True:
            payload = await self._inbox.get()
            await self._receive(payload)

    def _spawn(self, work: Any) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._jobs_tasks.add(task)
        task.add_done_callback(self._jobs_done)

    def _jobs_done(self, task: asyncio.Task[None]) -> None:
        self._jobs_tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("live relay: a job's note failed", exc_info=task.exception())

    async def _receive(self, payload: str) -> None:
        """Hand an event to this worker's browsers (reading it back if referenced)."""
        try:
            event = Event.parse(json.loads(payload))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning(
                "live relay: ignored a notification on %s that is not gradwatch's (%s): %.200s", CHANNEL, exc, payload
            )
            return
        try:
            await self._deliver(event)
        except Exception:  # a read failed: these browsers miss events; make them catch up
            log.exception("live relay: could not read what was announced for run %s", event.run_id)
            self.hub.drop_all()

    async def _deliver(self, event: Event) -> None:
        hub = self.hub
        jobs = self.jobs
        if event.kind in ("job", "ask"):  # handled as they come (`_job_note`)
            return
        if event.kind == "steps" and jobs is not None:
            jobs.stored_elsewhere(event.run_id, event.steps[1])
        if event.kind == "resync":
            hub.drop_all()
        elif event.kind == "run" and hub.listening():
            text = event.text
            if text is None:
                run = await asyncio.to_thread(self.store.get_run, event.run_id)
                text = None if run is None else run_event(run)
            if text is not None:
                hub.send_all(text)
        elif event.kind in ("steps", "late") and hub.watching(event.run_id):
            late = event.kind == "late"
            records = await asyncio.to_thread(
                self.store.batch_steps, event.run_id, event.steps, None if late else event.seq
            )
            for record in records:
                if late:
                    record.scalars[RESENT] = 1.0
                hub.publish_record(event.run_id, record)
        elif event.kind == "finding" and hub.watching(event.run_id):
            text = event.text
            if text is None:
                found = await asyncio.to_thread(self.store.get_findings, event.run_id)
                text = next(
                    (
                        finding_event(
                            event.run_id,
                            {
                                "code": f.code,
                                "severity": f.severity,
                                "message": f.message,
                                "params": f.params,
                                "first_step": f.first_step,
                                "figure": f.figure,
                            },
                        )
                        for f in found
                        if f.code == event.code
                    ),
                    None,
                )
            if text is not None:
                hub.send_watchers(event.run_id, text)

"""Distributed jobs on the server: assembling the ranks' steps into the job's run, after each
committed batch of a rank and on a timer that notices lost ranks.

`JobAssembler.assemble(job)` runs the store's assembly (store/jobs.py, in a worker thread) until
nothing more is ready, then treats the job's new steps as any run's: the diagnostics engine
judges them, the browsers watching `?run=JOB` get them, a changed status goes to every browser,
and a new error or warning finding to the `--notify` webhooks. Calls for one job take turns (a
lock per job), so the engine sees the job's steps in order; those that come while one waits
for the lock join it (`_Waiting`). The hook whose batch completed a
step gets the job's findings from its own connection (ingest.py).

The timer (`start`) looks at every running job each `interval` seconds (a quarter of
`--rank-timeout`, at least 0.05 s, at most 5 s): a rank that sent nothing for `--rank-timeout`
while another is ahead is lost, the steps waiting on it are assembled without it
(`partial_steps`), and once every rank has closed or is lost the job's run is finished or
crashed. With `serve --workers N` every worker runs it; the lock on the job's row makes them
take turns.

With `serve --workers N` one worker owns each job's assembly (`Coordinator`: an advisory lock
per job on PostgreSQL, relay.py): the others only store their ranks' frames, acknowledge them
once committed, and tell the owner when every rank connected to them has stored a step (and
of a close, or of a step that may complete a partial one); the owner reads their rows of the
ready steps back. A worker whose owner is gone takes the job over (its frames and its timer try
the lock). Ownership only spares work: the lock on the job's row still keeps any two
assemblies from storing a step twice (docs/design.md, "A job's ranks on several workers").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ..diagnostics import Diagnostics, Finding
from ..live import LiveHub
from ..notify import Notifier, RunRef, tell
from ..protocol import GRAD_STATUS, PROTOCOL_VERSION, Step
from ..store import StepData, Store, UnknownRun
from .commits import GroupCommits
from .memory import JobMemory

log = logging.getLogger("gradwatch.jobs")

#: Longest pause between two looks for lost ranks.
MAX_INTERVAL_S = 5.0
#: Shortest: however small the timeout, the timer never spins.
MIN_INTERVAL_S = 0.05
#: Most of a job's steps assembled whole that this process remembers (the latest: a rank's step
#: older than those is taken as possibly completing a partial one, which costs an assembly).
WHOLE_KEPT = 4096
#: Most deleted jobs remembered, so that what was under way at the deletion keeps nothing of them.
DELETED_KEPT = 1024


def as_steps(batch: Sequence[StepData]) -> list[Step]:
    """Stored steps as the live hub publishes them (already validated: no second pass)."""
    return [
        Step.model_construct(
            v=PROTOCOL_VERSION,
            type="step",
            seq=d.seq,
            step=d.step,
            time=d.time,
            scalars=dict(d.scalars),
            params={m: raw for m, raw in d.arrays.items() if m != GRAD_STATUS},
            grad_status=d.arrays.get(GRAD_STATUS),
        )
        for d in batch
    ]


class Coordinator(Protocol):
    """How the workers of `serve --workers N` share a job's assembly (relay.Relay)."""

    async def owns(self, job: str) -> bool:
        """Whether this worker assembles `job` (it takes the job if no worker does)."""
        ...

    async def release(self, job: str) -> None:
        """`job` is settled here: another worker may take it when it runs again."""
        ...

    def tell_owner(
        self, job: str, step: int, late: Sequence[int] = (), closed: bool = False, ranks: int | None = None
    ) -> None:
        """Every rank connected here has stored `job`'s step `step` (-1: none yet); `late`:
        steps a rank here stored that may complete a partial step; `closed`: a rank closed;
        `ranks`: how many of the job's ranks said hello here (told at each hello)."""
        ...

    def ask_elsewhere(self, job: str, rank: int, steps: list[int]) -> None:
        """Ask `rank`, connected to another worker, for its arrays of `steps` (its digest differs)."""
        ...


@dataclass
class _Waiting:
    """An assembly of a job waiting for its lock, which has read nothing yet: the frames
    committed meanwhile join it instead of each queueing one of their own. With `serve
    --workers N` a worker does not know how far the other workers' ranks are (`nothing_ready`
    cannot tell), so every frame of a step would run an assembly that reads every rank, most of
    them finding nothing. Joined, a worker runs at most the one under way and one more, which
    reads after every frame that joined it is committed."""

    done: asyncio.Future[bool]  # whether it ran (or found nothing to run): else a joiner runs its own
    late: list[int] = field(default_factory=list)
    timer: bool = False  # the timer's (or another caller's with no rank): never skipped
    closes: bool = False  # some rank's close joined

    def join(self, rank: int | None, late: Sequence[int], closed: bool) -> None:
        self.late += late
        self.timer |= rank is None
        self.closes |= closed

    def skippable(self, state: _Job) -> bool:
        """Whether none of those joined can make a step ready (`_Job.nothing_ready`) nor end the
        job (`_Job.close_frees_nothing`), now that the assembly before it is done."""
        if self.timer:
            return False
        if self.closes and not state.close_frees_nothing():
            return False
        return state.nothing_ready(self.late)


@dataclass
class _Job:
    """What this process keeps of a job while its status is unsettled."""

    first_seen: float  # when this process first saw the job (server time)
    touched: float  # when it last did
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    waiting: _Waiting | None = None  # the assembly waiting for `lock`, which later frames join
    users: int = 0  # assemblies holding or awaiting the lock
    settled: bool = False  # finished, crashed or deleted: drop once no assembly uses it
    announced: dict[str, dict[str, object]] = field(default_factory=dict)  # code -> finding as told
    memory: JobMemory = field(default_factory=JobMemory)  # the ranks' pieces and parameters kept here
    world_size: int | None = None
    #: What this process knows of the ranks, to skip an assembly that cannot find a step ready:
    #: each rank's last stored step (from its hello here, then its batches; -1: none), the ranks
    #: that closed here, and those the last assembly went on without (lost, until they send again).
    frontier: dict[int, int] = field(default_factory=dict)
    closed: set[int] = field(default_factory=set)
    lost: set[int] = field(default_factory=set)
    #: the job's run's last step (-1: none), as of this process's last assembly or, before it, of
    #: a rank's hello here: at most the stored one, which only makes `nothing_ready` say False
    assembled: int | None = None
    #: the job's latest steps that this process assembled (or completed) with every rank: a
    #: rank's step among them cannot complete a partial step (at most WHOLE_KEPT of them)
    whole: set[int] = field(default_factory=set)
    #: `_behind`'s scan: the ranks below `scan_at` were past `scan_for` (the job's last step then)
    scan_at: int = 0
    scan_for: int | None = None
    #: set (and replaced) when an assembly here stored steps of the job or settled it: what a
    #: closing rank's connection waits on (`JobAssembler.wait_for_step`) instead of polling
    progress: asyncio.Event = field(default_factory=asyncio.Event)
    waiters: int = 0  # connections waiting on `progress`
    #: With `serve --workers N` (a `Coordinator`): the step through which each other worker's
    #: connected ranks have all stored (what they told this worker, the job's owner), and the one
    #: this worker told the owner last (-2: nothing yet), with the scan of its ranks (`_behind`'s)
    elsewhere: dict[str, int] = field(default_factory=dict)
    told: int = -2
    #: the last assembly found a rank that never said hello (with a `Coordinator` only; cleared
    #: once every rank said hello here or to another worker, as told): a job's start
    unheard: bool = False
    counts: dict[str, int] = field(default_factory=dict)  # worker -> its ranks that said hello there

    def heard_all(self) -> bool:
        """Whether every rank said hello here or (as told) to another worker."""
        return len(self.frontier) + sum(self.counts.values()) >= (self.world_size or 0)

    here: list[int] = field(default_factory=list)  # the ranks connected here, as of the scan's start
    here_at: int = 0
    here_for: int | None = None  # the step told when `here` was listed

    def others_through(self) -> int | None:
        """The step through which every rank not connected here has stored, as the other
        workers told (None: some worker's word is missing, or none came)."""
        return min(self.elsewhere.values()) if self.elsewhere else None

    def progressed(self) -> None:
        """Wake whoever waits on the job's progress (the next wait takes a new event)."""
        self.progress.set()
        self.progress = asyncio.Event()

    def nothing_ready(self, late: Sequence[int]) -> bool:
        """Whether no step can be ready: some rank still waited for has stored nothing beyond
        the job's last step (a step is ready when every waited rank has it or is past it), and
        no stored step may complete a partial one (those are at most the job's last step, and
        not among the steps this process assembled whole: a group commit stores many ranks'
        frames, and the assembly that one of them runs may take the others' steps before their
        connections ask; each asking again read every rank).
        Only where every waited rank said hello to this process: a rank known elsewhere (another
        worker, before a restart) leaves it to the store. Never so for a rank that stopped
        without closing here: the timer's assembly finds it lost, and goes on without it."""
        if self.world_size is None or self.assembled is None:
            return False
        if any(s <= self.assembled and s not in self.whole for s in late):
            return False
        if self.unheard:  # no step is ready before every rank said hello (a hello clears it)
            return True
        others = self.others_through()
        if others is not None and others <= self.assembled:
            return True  # a rank on another worker has stored nothing beyond: it tells when it has
        if len(self.frontier) < self.world_size and others is None:
            waited = (r for r in range(self.world_size) if r not in self.closed and r not in self.lost)
            if any(r not in self.frontier for r in waited):  # some rank unknown here: is it waited for?
                return False
        return self._behind(self.assembled)

    def keep_whole(self, steps: Sequence[int]) -> None:
        """`steps` are stored whole in the job's run (assembled, or completed, here)."""
        self.whole.update(steps)
        if len(self.whole) > 2 * WHOLE_KEPT:
            self.whole = set(sorted(self.whole)[-WHOLE_KEPT:])

    def close_frees_nothing(self) -> bool:
        """Whether a rank's close (the rank is in `closed` now) can neither make a step ready nor
        end the job: a rank still waited for has stored nothing beyond the job's last step
        (`nothing_ready`), and some rank has not closed here (the last close settles the job's
        status), or the job is settled already (the closes that waited for the one that settled
        it). Without it each rank's close ran an assembly that reads every rank: at a 1,024-rank
        job's end, as many assemblies as ranks."""
        if self.elsewhere:  # other workers' closes are not known here: any may be the last
            return self.settled
        return self.settled or (len(self.closed) < (self.world_size or 0) and self.nothing_ready(()))

    def _behind(self, assembled: int) -> bool:
        """Whether a waited rank has stored nothing beyond `assembled`. Every rank's frame asks,
        so the scan resumes where it stopped (a rank's frontier only grows: one found past the
        job's last step stays past it until the job's next step), which makes it linear in the
        ranks per global step, not per frame. A rank that is waited for again (a lost rank back,
        a closed one resumed) may be skipped until then: that answers False, which only costs an
        assembly that finds nothing."""
        if self.scan_for != assembled:
            self.scan_at, self.scan_for = 0, assembled
        assert self.world_size is not None
        while self.scan_at < self.world_size:
            r = self.scan_at
            if r not in self.closed and r not in self.lost and self.frontier.get(r, assembled + 1) <= assembled:
                return True
            self.scan_at += 1
        return False


class JobAssembler:
    """Assembles jobs' steps and announces them; used from the event loop only.

    It keeps per job a lock, when it first saw the job and the findings it told, from the job's
    first hello or assembly here until its status is settled (finished, crashed) or it is
    deleted; the timer also drops the jobs no longer running (settled by another worker)."""

    def __init__(
        self,
        store: Store,
        hub: LiveHub,
        diagnostics: Diagnostics,
        rank_timeout_s: float,
        notifier: Notifier | None = None,
        clock: Callable[[], float] = time.time,
        coordinator: Coordinator | None = None,
    ) -> None:
        self._store = store
        self._coordinator = coordinator
        self._clock = clock
        self._hub = hub
        self._diagnostics = diagnostics
        self._notifier = notifier
        self.rank_timeout_s = rank_timeout_s
        self.interval_s = max(MIN_INTERVAL_S, min(rank_timeout_s / 4, MAX_INTERVAL_S))
        self._started = clock()
        self._admitting = 0  # hellos this process is validating or opening (of ranks unknown yet)
        self._jobs: dict[str, _Job] = {}
        #: jobs deleted here (the newest DELETED_KEPT): a frame or assembly still under way when
        #: its run was deleted must not bring their state back (a deleted id is never reopened)
        self._deleted: dict[str, None] = {}
        self._timer: asyncio.Task[None] | None = None
        #: set by a hello, and when this process first keeps a job's state: a resting timer looks again (`_sweep`)
        self._known = asyncio.Event()
        #: the ranks' frames, stored in group commits (commits.py)
        self.commits = GroupCommits(store)
        #: (job, rank) -> how to ask that rank's connection here for a replica's arrays
        self._askers: dict[tuple[str, int], Callable[[list[int]], Awaitable[None]]] = {}

    def listen(self, job: str, rank: int, ask: Callable[[list[int]], Awaitable[None]]) -> None:
        """`rank`'s connection is here: a digest of its that differs from rank 0's is asked of
        it by `ask` (its earlier asks go again, to this connection)."""
        self._askers[(job, rank)] = ask
        state = self._jobs.get(job)
        if state is not None:
            state.here_for, state.here_at = None, 0  # the ranks here are listed again
            state.memory.wanted = {key: t for key, t in state.memory.wanted.items() if key[0] != rank}

    def unlisten(self, job: str, rank: int, ask: Callable[[list[int]], Awaitable[None]]) -> None:
        if self._askers.get((job, rank)) is ask:
            del self._askers[(job, rank)]
            state = self._jobs.get(job)
            if self._coordinator is not None and state is not None:
                # it may come back on another worker, which tells of it: what is known here of
                # it would hold back `nothing_ready` (the scans start again)
                state.frontier.pop(rank, None)
                state.scan_for, state.here_for, state.here_at = None, None, 0

    async def ask_here(self, job: str, rank: int, steps: list[int]) -> None:
        """The owner of `job` (another worker) asks `rank` for its arrays of `steps`, if its
        connection is here."""
        ask = self._askers.get((job, rank))
        if ask is not None:
            try:
                await ask(steps)
            except Exception:  # the connection is going: the owner asks again
                log.info("job %s: rank %d could not be asked for steps %s' arrays", job, rank, steps)

    def owed(self, job: str, rank: int) -> list[int]:
        """The steps a closing replica of `job` is asked for the arrays of (JobMemory.owed)."""
        state = self._jobs.get(job)
        return [] if state is None else state.memory.owed(rank)

    async def _ask(self, job: str, state: _Job) -> None:
        """Ask the replicas for the arrays the assembly waits on (JobMemory.waits_on); one not
        connected here is asked again once it is (`listen`)."""
        by_rank: dict[int, list[int]] = {}
        for rank, step in state.memory.take_asks():
            by_rank.setdefault(rank, []).append(step)
        for rank, steps in by_rank.items():
            ask = self._askers.get((job, rank))
            if ask is None:
                if self._coordinator is not None:  # the worker it is connected to asks it
                    self._coordinator.ask_elsewhere(job, rank, sorted(steps))
                continue  # else asked again when the rank says hello here (`listen`)
            try:
                await ask(sorted(steps))
            except Exception:  # the connection is going: its rank is asked again when back
                log.info("job %s: rank %d could not be asked for steps %s' arrays", job, rank, steps)

    def _job(self, job: str) -> _Job | None:
        if job in self._deleted:
            return None
        now = self._clock()
        state = self._jobs.get(job)
        if state is None:
            state = self._jobs[job] = _Job(first_seen=now, touched=now)
            self._known.set()
        state.touched = now
        return state

    def _release(self, job: str, state: _Job) -> None:
        if state.users == 0 and state.settled and self._jobs.get(job) is state:
            del self._jobs[job]

    def held(self) -> frozenset[str]:
        """The jobs this process keeps state for (their status is not settled yet)."""
        return frozenset(self._jobs)

    async def assemble(
        self,
        job: str,
        rank: int | None = None,
        batch: Sequence[StepData] = (),
        closed: bool = False,
        also_late: Sequence[int] = (),
    ) -> list[Finding] | None:
        """Assemble what is ready of `job`; its current findings if steps were added, else None.
        `rank`'s connection just committed `batch` (kept here for the assembly: its pieces are
        not read back), or its close (`closed`); a batch that cannot make a step ready (another
        rank has not stored one beyond the job's last yet) assembles nothing, and one that comes
        while an assembly of the job waits for its turn joins it (None: the findings go to the
        hook of the caller that led it)."""
        state = self._job(job)
        if state is None:
            return None
        late = [d.step for d in batch] + list(also_late)
        if self._coordinator is not None and not await self._coordinator.owns(job):
            if rank is not None:
                self._store_only(job, state, rank, late, closed)
            return None
        if rank is not None:
            state.memory.add(rank, batch)
            if batch:
                state.frontier[rank] = max(state.frontier.get(rank, -1), *late)
                state.lost.discard(rank)
            if closed:
                state.closed.add(rank)
            elif state.nothing_ready(late):
                return None
        state.users += 1
        try:
            waiting = state.waiting
            # one waits for the lock and has read nothing yet: it takes ours (the findings go
            # to the hook of the one that runs it); if it never ran (cancelled), ours runs
            if waiting is not None:
                waiting.join(rank, late, closed)
                if await asyncio.shield(waiting.done):
                    return None
            return await self._lead(job, state, rank, late, closed)
        finally:
            state.users -= 1
            self._release(job, state)

    def _store_only(self, job: str, state: _Job, rank: int, late: Sequence[int], closed: bool) -> None:
        """On a worker that does not own `job`: `rank`'s frames are committed (its acks go now,
        they are durable in its rows); tell the owner when every rank connected here has stored
        a step it had not told, of a close, and of steps that may complete a partial one (at most
        the job's last step as this worker heard it). Its pieces are not kept: the owner reads
        them back, one query per table for all of this worker's ranks."""
        assert self._coordinator is not None
        if late:
            state.frontier[rank] = max(state.frontier.get(rank, -1), *late)
            state.lost.discard(rank)
        if closed:
            state.closed.add(rank)
        old = [s for s in late if state.assembled is not None and s <= state.assembled]
        through = self._through_here(job, state)
        # A close is told once no rank here is open: only then can this worker's closes end the
        # job (the owner reads every rank's status), and a rank that closed early is not waited
        # for by the store's assembly, which the next step's word runs (told per close, a job's
        # end made the owner run an assembly per rank)
        closed = closed and all(r in state.closed for j, r in self._askers if j == job)
        if closed or old or through > state.told:
            state.told = max(state.told, through)
            self._coordinator.tell_owner(job, state.told, old, closed)

    def _through_here(self, job: str, state: _Job) -> int:
        """The last step that every rank connected here (and not closed) has stored. The scan
        resumes where it stopped (each rank's frontier only grows), so it is linear in the ranks
        per step told, not per frame."""
        if state.here_at == 0 and state.here_for != state.told:  # once per step told
            state.here, state.here_for = sorted(r for j, r in self._askers if j == job), state.told
        while state.here_at < len(state.here):
            r = state.here[state.here_at]
            if r not in state.closed and state.frontier.get(r, -1) <= state.told:
                return state.told
            state.here_at += 1
        state.here_at = 0
        return min((state.frontier.get(r, -1) for r in state.here if r not in state.closed), default=state.told)

    def stored_elsewhere(self, job: str, step: int) -> None:
        """Another worker (`job`'s owner) stored `job`'s steps through `step`: a closing rank's
        wait here ends, and a rank's step up to it may complete a partial one (`_store_only`)."""
        state = self._jobs.get(job)
        if state is not None and (state.assembled is None or step > state.assembled):
            state.assembled = step
            state.progressed()

    async def told(
        self, job: str, worker: str, step: int, late: Sequence[int], closed: bool, ranks: int | None = None
    ) -> None:
        """Worker `worker`'s ranks of `job` have all stored `step` (or `late`, or a close): this
        worker assembles what is ready if it owns the job. Skipped where a rank connected here,
        or another worker's, has stored nothing beyond the job's last step (`nothing_ready`: that
        rank's frame, or its worker's word, asks again); a close never is (it may end the job)."""
        state = self._job(job)
        if state is None or self._coordinator is None or not await self._coordinator.owns(job):
            return
        state.elsewhere[worker] = max(state.elsewhere.get(worker, -1), step)
        if ranks is not None:
            state.counts[worker] = ranks
        if state.heard_all():  # the last hello may have been there
            state.unheard = False
        if not closed and state.nothing_ready(late):
            return
        await self.assemble(job, also_late=late)

    async def _lead(
        self, job: str, state: _Job, rank: int | None, late: Sequence[int], closed: bool
    ) -> list[Finding] | None:
        """Run an assembly for this caller and those that join it while it waits (`_Waiting`)."""
        waiting = state.waiting = _Waiting(asyncio.get_running_loop().create_future())
        waiting.join(rank, late, closed)
        ran = False
        try:
            async with state.lock:
                state.waiting = None  # from here on it reads: later frames wait for the next one
                # the assembly this one waited for may have taken every step ready (a close is
                # asked here only: with no assembly under way, the job's last step is current)
                if waiting.skippable(state):
                    ran = True
                    return None
                found = await self._assemble(job, state, waiting.late)
                ran = True
                return found
        finally:
            if state.waiting is waiting:
                state.waiting = None
            waiting.done.set_result(ran)

    async def _assemble(self, job: str, state: _Job, late: list[int]) -> list[Finding] | None:
        notify = self._hub.steps_notice(job)
        new: list[StepData] = []
        status: str | None = None
        before: int | None = None
        while True:
            done = await asyncio.to_thread(
                self._store.assemble, job, self.rank_timeout_s, self._since(state), notify, late, state.memory
            )
            late = []
            await self._ask(job, state)
            state.assembled = done.last_step if done.last_step is not None else state.assembled
            state.unheard = done.unheard and self._coordinator is not None
            for missing in done.partial.values():
                state.lost.update(missing)
            state.keep_whole([d.step for d in done.steps if d.step not in done.partial] + done.completed)
            before = done.steps_before if before is None else before
            new += done.steps
            status = done.status or status
            if done.partial:
                log.info("job %s: steps %s assembled without ranks %s", job, min(done.partial), done.partial)
            if done.completed:
                log.info("job %s: partial steps %s..%s complete now", job, done.completed[0], done.completed[-1])
            if not done.more:
                break
        found = None
        if new:
            found = await self._judge(job, state, new, before or 0)
            self._hub.publish_steps(job, as_steps(new))
        if status is not None:
            state.settled = True
            log.info("job %s %s: every rank closed or was lost", job, status)
            if self._coordinator is not None:
                await self._coordinator.release(job)
            try:
                await asyncio.to_thread(self._diagnostics.close_run, job)
            except Exception:
                log.exception("diagnostics of job %s could not be closed", job)
            run = await asyncio.to_thread(self._store.get_run, job)
            if run is not None:
                self._hub.publish_run(run)
        if new or status is not None:  # judged and told: the closing ranks' waits may end
            state.progressed()
        return found

    async def wait_for_step(self, job: str, step: int, timeout: float) -> bool:
        """Wait, at most `timeout` s, until an assembly in this process has stored `job`'s step
        `step` (its findings judged) or settled the job; whether one did. A rank's close waits so
        for its last step (ingest.py) instead of polling the store: the assembly that stores the
        step wakes it. A job assembled or settled by another worker (or not held here) wakes
        nothing: the caller looks at the store after `timeout`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            state = self._jobs.get(job)
            if state is not None and (state.settled or (state.assembled is not None and state.assembled >= step)):
                return True
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            if state is None:
                await asyncio.sleep(remaining)
                continue
            state.waiters += 1
            try:
                await asyncio.wait_for(state.progress.wait(), remaining)
            except TimeoutError:
                pass
            finally:
                state.waiters -= 1

    def waiting(self, job: str) -> int:
        """How many closing ranks' connections wait here for `job`'s progress."""
        state = self._jobs.get(job)
        return 0 if state is None else state.waiters

    def since(self, job: str) -> float:
        """When this process first saw `job` (its start if it has not): a rank's silence counts
        from then at the earliest, since nothing is written while the server is down."""
        state = self._jobs.get(job)
        return self._since(state)

    def _since(self, state: _Job | None) -> float:
        # While hellos wait here, any rank may be one of them (which, is known once validated):
        # no rank's silence counts (lost means silent, not queued behind a crowd's admission).
        if self._admitting:
            return math.inf
        return self._started if state is None else state.first_seen

    @contextlib.contextmanager
    def admitting(self) -> Iterator[None]:
        """A hello is validated and its run opened meanwhile (ingest.py)."""
        self._admitting += 1
        self._known.set()  # it may open a job: a resting timer looks again
        try:
            yield
        finally:
            self._admitting -= 1

    def hear(self, job: str, rank: int, queued: int = 0) -> None:
        """`rank` of `job` sent a frame to this process; `queued` (+n or -n): n of its frames
        start or stop waiting on this process's writer (hearing.py)."""
        state = self._job(job)
        if state is not None:
            state.memory.heard.hear(rank, self._clock(), queued)

    def memory(self, job: str) -> JobMemory | None:
        """What this process keeps and heard of `job`'s ranks (None: nothing)."""
        state = self._jobs.get(job)
        return None if state is None else state.memory

    def forget(self, job: str) -> None:
        """The job's run was deleted: drop what is kept of it (once no assembly uses it), and
        keep nothing of it that a frame or assembly still under way would bring back."""
        self._deleted[job] = None
        while len(self._deleted) > DELETED_KEPT:
            del self._deleted[next(iter(self._deleted))]
        state = self._jobs.get(job)
        if state is not None:
            state.settled = True
            state.progressed()
            self._release(job, state)

    async def _judge(self, job: str, state: _Job, new: list[StepData], before: int) -> list[Finding] | None:
        try:
            found = await asyncio.to_thread(self._diagnostics.observe, job, new, before)
        except UnknownRun:
            return None
        except Exception:  # diagnostics must never stop assembly: log, and carry on
            log.exception("diagnostics of job %s failed", job)
            return None
        await self._announce(job, state, found)
        return found

    async def _announce(self, job: str, state: _Job, found: list[Finding]) -> None:
        """Tell the browsers each changed finding, and the webhooks each new (or graver) one, once
        per job whichever rank's batch found it."""
        for finding in found:
            public = finding.to_dict()
            told = tell(state.announced, public)
            if told.news and self._notifier is not None:
                run = await asyncio.to_thread(self._store.get_run, job)
                if run is not None:
                    self._notifier.finding(RunRef(run.id, run.name, run.project), public)
            if told.changed:
                self._hub.publish_finding(job, public)

    def opened(
        self,
        job: str,
        found: list[Finding],
        rank: int,
        world_size: int,
        last_step: int | None,
        job_last_step: int | None = None,
    ) -> None:
        """A rank's hello (its run's last stored step `last_step`, its job's `job_last_step`;
        None: none): the job's findings so far were news when they were found, not now."""
        state = self._job(job)
        if state is None:
            return
        state.settled = False  # a job resumed by a rank's hello runs again
        state.world_size = world_size
        state.frontier[rank] = max(state.frontier.get(rank, -1), -1 if last_step is None else last_step)
        # Known before the first assembly, so that a job's first step is assembled once, not
        # once per rank's first frame (each reading every rank).
        job_last = -1 if job_last_step is None else job_last_step
        state.assembled = job_last if state.assembled is None else max(state.assembled, job_last)
        state.closed.discard(rank)
        if self._coordinator is None or state.heard_all():
            state.unheard = False
        if self._coordinator is not None:  # the owner, if another worker, hears of the hello
            self._coordinator.tell_owner(job, state.told, ranks=len(state.frontier))
        known = state.announced
        for finding in found:
            known.setdefault(finding.code, finding.to_dict())

    # -- the timer ---------------------------------------------------------------------------

    def start(self) -> None:
        self._timer = asyncio.create_task(self._sweep())

    async def _sweep(self) -> None:
        """Look for lost ranks every `interval_s` while a job may be running. A process that is
        the database's only writer (no coordinator) rests once a look found no running job, it
        keeps no job's state, and no hello came since the pause before it: a job starts running only
        through a rank's hello here (`admitting`, then `_job` keeps its state), which wakes the
        timer. A server beside a training run without jobs then neither wakes nor reads the store
        for them: each costs CPU that the training pays."""
        idle = False
        while True:
            if idle:
                await self._known.wait()
            self._known.clear()
            await asyncio.sleep(self.interval_s)
            idle = False
            try:
                asked = self._clock()
                jobs = await asyncio.to_thread(self._store.running_jobs)
                for job in self._drop_stale(set(jobs), asked):
                    if self._coordinator is not None:  # a job lock taken late, with nothing left to assemble
                        await self._coordinator.release(job)
                for job in jobs:
                    await self.assemble(job)
                idle = not jobs and not self._jobs and self._coordinator is None and not self._known.is_set()
            except Exception:  # a timer has no caller to report to: log, and look again later
                log.exception("could not assemble the running jobs")

    def _drop_stale(self, running: set[str], asked: float) -> list[str]:
        """Drop the jobs that were not running when asked at `asked` (settled by another worker,
        or deleted) and that nothing here touched since; the jobs dropped. Their assembly locks
        are let go too: a worker may take a job's lock after its owner settled it and let go
        (`Coordinator.owns`, asked by a late frame or note), and find nothing to assemble."""
        dropped = []
        for job, state in list(self._jobs.items()):
            if job not in running and state.users == 0 and state.touched < asked:
                state.progressed()  # its closing ranks look at the store
                del self._jobs[job]
                dropped.append(job)
        return dropped

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            await asyncio.gather(self._timer, return_exceptions=True)
            self._timer = None

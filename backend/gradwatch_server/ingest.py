"""One hook connection on /ws/ingest: hello, then steps until close (docs/protocol.md).

The connection moves through explicit states: AWAIT_HELLO -> STREAMING -> CLOSED (after a
`close` message). After the hello, a reader task validates frames against `protocol` and queues
them; the writer stores whatever has queued up in one transaction off the event loop, then
acknowledges the batch's highest seq (an ack covers every seq up to it) and publishes the steps
to the browsers. Acks come only after the commit. Each committed batch goes through the
diagnostics engine before it is acknowledged: a new finding (or one whose severity changed) is
sent to the hook (`finding`) ahead of the ack that covers its step, so a hook that has its acks
has its findings; new or changed findings go to the browsers, and a new (or graver) error or
warning to the `--notify` webhooks (notify.py: queued, never awaited), unless it was known before
this connection resumed the run. The flight recorder's late norms are judged the same way
(`Diagnostics.judge_late`); only values older than the diagnosis' snapshots have the run judged
again whole after their batch's ack, its findings sent before the next batch's.

A rank of a distributed job (a hello with `dist`) streams into its own run `JOB.rRANK` the same
way, but its batches are stored with other ranks' in group commits (jobs/commits.py; acked once
committed), its run gets no diagnostics and is never announced to the run list; after each of its
committed batches (and its close) the job's ready steps are assembled into the job's run
(jobs/assembler.py), and the job's new findings are sent to this hook ahead of the ack.

A frame that breaks the protocol gets an `error` frame and a close code once the messages before
it are committed; nothing of it is stored, and every other connection carries on.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import json
import logging
import math
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fastapi import WebSocket, WebSocketDisconnect
from starlette.websockets import WebSocketDisconnected

from .cost import StepCost
from .deps import token_ok
from .diagnostics import Diagnostics, Finding
from .jobs.admission import admission
from .jobs.assembler import JobAssembler
from .live import LiveHub, worker_headers
from .notify import Notifier, RunRef, tell
from .protocol import (
    READ_VERSIONS,
    RESENT,
    Close,
    Hello,
    Pieces,
    ProtocolError,
    Step,
    Steps,
    parse_binary,
    parse_message,
)
from .sessions import Sessions
from .settings import Settings
from .store import NotifyInTransaction, ParamsMismatch, Run, StepData, Store, UnknownRun

log = logging.getLogger("gradwatch.ingest")

#: What judging a batch found: the run's findings, or None (nothing judged).
_Judged = list[Finding] | None

CLOSE_INVALID = 1003
CLOSE_POLICY = 1008
CLOSE_TOO_BIG = 1009
CLOSE_SERVER_ERROR = 1011
#: A v2 hello names its job's parameters by a digest this server does not know: send the hello
#: again with the full list (docs/protocol.md, "Version 2").
CLOSE_NEED_PARAMS = 4002

#: How long a hello that names its job's parameters by digest waits for them to become known (the
#: rank that sends them in full may be a moment behind it) before it is told to send them.
DIGEST_WAIT_S = 5.0
#: Its job's stored list is looked at this often meanwhile (another worker may have stored it);
#: this process's own hellos are seen at once.
DIGEST_POLL_S = 0.05
DIGEST_STORE_EVERY_S = 1.0

#: Messages validated but not yet stored; when full, the reader stops reading the socket.
MAX_PENDING = 64

#: A hook sends a pace's frames back to back, but its sending thread may wait for the training
#: process' GIL between two (up to the interpreter's switch interval): the writer waits for the
#: rest of a burst of step frames (until BURST_GAP_S passes without one, BURST_MAX_S at most) and
#: stores it as one batch: each batch costs a commit, a thread hand-off, a diagnosis and an ack.
BURST_GAP_S = 0.01
BURST_MAX_S = 0.05

#: A batch of at most this many steps, none with per-parameter arrays (a hook's unmeasured
#: steps), is stored on the event loop where the store can without waiting (`_store_now`): a
#: few ms of the loop at most (its cost a step: docs/benchmarks.md).
LOOP_STEPS = 256

#: How long a rank's close waits for the job's run to hold that rank's last step, so that the
#: job's findings (found when the last rank's steps arrive) reach every rank before it ends.
#: Bounded well under the hook's own close timeout (5 s by default): nothing waits on it for data.
JOB_CLOSE_WAIT_S = 2.0
#: How often that wait looks at the store when nothing here wakes it: a job assembled or settled by
#: another worker (`serve --workers N`). An assembly in this process wakes it at once.
JOB_CLOSE_LOOK_S = 0.5
#: How long a DDP replica's close waits for the arrays it was asked for as it closed (the steps
#: whose `grad_digest` no comparison has settled: JobMemory.owed); its hook answers from its ring
#: at once. Bounded, with JOB_CLOSE_WAIT_S, under the hook's close timeout.
CLOSE_ANSWER_WAIT_S = 2.0


#: A rank of a job this large (world_size) has its step acks paced: at most one every RANK_ACK_EVERY_S
#: (cumulative, each sent only once what it covers is committed). One ack a rank-step is a socket
#: write, the largest single cost of a big job's frames on the server (docs/benchmarks.md,
#: "Large jobs"); a smaller job keeps an ack per commit, which its clients may wait on in turn.
PACED_ACKS_FROM_RANKS = 64
#: Well under the hook's own pace while no browser watches (IDLE_LINGER_S, 5 s): a hook that
#: sends at that pace still has each send acked at once; one sending every step, a second apart,
#: is acked every third step, and keeps those steps a little longer (memory, spool).
RANK_ACK_EVERY_S = 3.0


#: Threads of their own for hellos (validating one, opening its run): a crowd of ranks joining a
#: running job is admitted while the other ranks' step writes fill the default executor, rather
#: than queued behind them past the hook's welcome timeout (each retry a new hello: a storm).
HELLO_THREADS = 2
_hellos = ThreadPoolExecutor(HELLO_THREADS, thread_name_prefix="gradwatch-hello")

_T = TypeVar("_T")


async def _on_hello_thread(func: Callable[..., _T], *args: Any) -> _T:
    return await asyncio.get_running_loop().run_in_executor(_hellos, functools.partial(func, *args))


class State(enum.Enum):
    AWAIT_HELLO = "await_hello"
    STREAMING = "streaming"
    CLOSED = "closed"


class Refusal(Exception):
    """End the connection: send `message` as an error frame, then close with `code`."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class _Disconnected:
    """Queued by the reader when the hook has gone: store what came before, then stop."""


class _AckDue:
    """Queued by the held ack's timer: send it now (`IngestConnection._hold`)."""


_ACK_DUE = _AckDue()


@dataclass
class _Closing:
    """A replica's close that waits for the arrays it was asked for (`IngestConnection._write`)."""

    close: Close
    owed: set[int]  # steps asked for and not yet answered
    deadline: float  # loop time
    acks: list[dict[str, object]] = field(default_factory=list)  # of its answers: the close's covers them


#: The steps of one message (one `step`, or the K of a `steps`: stored in one transaction), or
#: what ends the batch.
Pending = tuple[Step, ...] | Close | Refusal | _Disconnected | _AckDue


def _small(batch: Sequence[StepData]) -> bool:
    """Whether a batch is cheap enough to store on the event loop (LOOP_STEPS)."""
    return len(batch) <= LOOP_STEPS and not any(d.arrays for d in batch)


def step_data(step: Step) -> StepData:
    """What the store keeps of a step message (its arrays decoded to bytes)."""
    return StepData(
        seq=step.seq,
        step=step.step,
        time=step.time,
        scalars=step.scalars,
        arrays=step.arrays(),
        resent=RESENT in step.scalars,
        digest=step.grad_digest,
    )


def close_reason(message: str) -> str:
    """A close reason must fit in 123 bytes of UTF-8; cut on a character boundary."""
    raw = message.encode()
    if len(raw) <= 123:
        return message
    return raw[:120].decode(errors="ignore") + "..."


def _deleted(run_id: str) -> Refusal:
    return Refusal(CLOSE_INVALID, f"run {run_id!r} was deleted on the server; start a new run")


class IngestConnection:
    def __init__(
        self,
        websocket: WebSocket,
        store: Store,
        hub: LiveHub,
        sessions: Sessions,
        settings: Settings,
        diagnostics: Diagnostics,
        step_cost: StepCost,
        notifier: Notifier | None = None,
        jobs: JobAssembler | None = None,
    ) -> None:
        self.ws = websocket
        self.jobs = jobs
        self.store = store
        self.hub = hub
        self.sessions = sessions
        self.settings = settings
        self.diagnostics = diagnostics
        self.step_cost = step_cost
        self.notifier = notifier
        self.run_ref: RunRef | None = None  # the run, as notifications name it
        self.state = State.AWAIT_HELLO
        self.run_id = ""
        self.job: str | None = None  # the job's run id, for a rank of a distributed job
        self.rank = 0  # and its rank
        self.param_count = 0
        self.reported: dict[str, dict[str, object]] = {}  # findings this connection has passed on
        self.queued = 0  # a rank's frames read and not yet stored (the job's assembler hears of them)
        #: a whole re-diagnosis of the run after late values (`_steps`), running after its batch's ack
        self.rejudging: asyncio.Task[bool] | None = None
        self.paced = False  # a rank of a large job: acks at most every RANK_ACK_EVERY_S (`_hold`)
        self.pacing: set[asyncio.Task[None]] = set()  # `pace` messages being sent (`_tell_pace`)
        self.held: dict[str, object] | None = None  # an ack not sent yet (what it covers is committed)
        self.held_timer: asyncio.TimerHandle | None = None
        self.ack_sent_at = -math.inf  # loop time of the last step ack sent
        self.linger_sent: object = None  # the linger that ack asked for
        self.pending: asyncio.Queue[Pending] | None = None

    async def serve(self) -> None:
        await self.ws.accept(headers=worker_headers())
        reader: asyncio.Task[None] | None = None
        try:
            if not token_ok(self.settings, self.ws.headers.get("authorization")):
                raise Refusal(
                    CLOSE_POLICY,
                    "missing or wrong token: this server needs "
                    "'Authorization: Bearer TOKEN' (watch(token=...) or GRADWATCH_TOKEN)",
                )
            text = await self._receive()
            if isinstance(text, bytes):
                raise Refusal(
                    CLOSE_INVALID,
                    "the first message must be hello, in a JSON text frame (binary frames carry steps only)",
                )
            with contextlib.nullcontext() if self.jobs is None else self.jobs.admitting():
                first = await _on_hello_thread(self._parse, text)
                if not isinstance(first, Hello):
                    raise Refusal(CLOSE_INVALID, f"the first message must be hello, not {first.type}")
                await self._hello(first)
            self.hub.listen_pace(self.run_id, self._tell_pace)
            pending: asyncio.Queue[Pending] = asyncio.Queue(MAX_PENDING)
            self.pending = pending
            reader = asyncio.create_task(self._read(pending))
            await self._write(pending)
        except Refusal as refusal:
            await self._refuse(refusal)
        except (WebSocketDisconnect, WebSocketDisconnected):
            pass  # the hook went away: the normal end of a stream
        except Exception:
            log.exception("ingest of run %s failed", self.run_id or "(before hello)")
            await self._refuse(Refusal(CLOSE_SERVER_ERROR, "server error while storing; see the server log"))
        finally:
            if self.state is not State.AWAIT_HELLO:
                self.hub.unlisten_pace(self.run_id, self._tell_pace)
            if self.held_timer is not None:
                self.held_timer.cancel()
            for task in (reader, self.rejudging, *self.pacing):
                if task is not None:
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
            self._hear(-self.queued)
            if self.job is not None and self.jobs is not None:
                self.jobs.unlisten(self.job, self.rank, self._ask_arrays)
            if self.state is not State.AWAIT_HELLO:
                self.sessions.detach(self.run_id, closed=self.state is State.CLOSED)

    def _tell_pace(self, linger: float) -> None:
        """A browser started watching this run: tell the hook its pace now (`pace`), not with the
        next ack (a hook at the idle pace sends, and so hears an ack, IDLE_LINGER_S apart)."""
        task = asyncio.get_running_loop().create_task(self._send_pace(linger))
        self.pacing.add(task)
        task.add_done_callback(self.pacing.discard)

    async def _send_pace(self, linger: float) -> None:
        with contextlib.suppress(WebSocketDisconnect, WebSocketDisconnected, RuntimeError):
            await self._send({"type": "pace", "linger": linger})

    async def _receive(self) -> str | bytes:
        """The next frame: JSON text, or binary (a version 3 step frame, `parse_binary`)."""
        message = await self.ws.receive()
        if message["type"] == "websocket.disconnect":
            raise WebSocketDisconnect(message.get("code", 1000))
        frame = message.get("text")
        if frame is None:
            frame = message.get("bytes")
        if not isinstance(frame, (str, bytes)):
            raise Refusal(CLOSE_INVALID, "empty websocket message: send JSON text frames or binary step frames")
        if len(frame) > self.settings.max_frame_bytes:
            raise Refusal(CLOSE_TOO_BIG, f"frame larger than {self.settings.max_frame_bytes} bytes")
        return frame

    def _parse(self, frame: str | bytes) -> Hello | Step | Steps | Close:
        param_count = self.param_count if self.state is not State.AWAIT_HELLO else None
        try:
            if isinstance(frame, bytes):
                return parse_binary(frame, param_count)
            return parse_message(frame, param_count)
        except ProtocolError as exc:
            raise Refusal(CLOSE_INVALID, str(exc)) from None

    async def _hello(self, hello: Hello) -> None:
        self.run_id = hello.run.id
        self.sessions.attach(self.run_id)  # before the write: a crash timer must not overrule it
        self.state = State.STREAMING
        if hello.dist is not None:
            await self._hello_rank(hello)
            return
        try:
            opened = await _on_hello_thread(self.store.open_run, hello)
        except ParamsMismatch as exc:
            raise Refusal(CLOSE_INVALID, str(exc)) from None
        self.param_count = len(hello.params)
        await self._welcome(opened.run.last_seq)
        if opened.created or opened.resumed_from != "running":
            self.hub.publish_run(opened.run)
        self.run_ref = RunRef(opened.run.id, opened.run.name, opened.run.project)
        # A resumed run's findings were news when they were found, not now.
        await self._report(lambda run_id: self.diagnostics.open_run(run_id, opened.run.steps), notify=opened.created)

    async def _hello_rank(self, hello: Hello) -> None:
        """A rank's hello: open its run and its job's; the run list hears of the job only."""
        dist = hello.dist
        assert dist is not None
        if hello.names_params:
            hello = await self._resolve(hello)
        try:  # with the other ranks' hellos waiting meanwhile, in one transaction
            opened = await admission(self.store, _on_hello_thread).open(hello)
        except ParamsMismatch as exc:
            raise Refusal(CLOSE_INVALID, str(exc)) from None
        self.job = dist.job
        self.rank = dist.rank
        self.paced = dist.world_size >= PACED_ACKS_FROM_RANKS
        self.param_count = len(hello.params)
        await self._welcome(opened.rank.run.last_seq)
        if opened.job_created or opened.job_resumed:
            self.hub.publish_run(opened.job)
        job = self.job
        try:
            found = await _on_hello_thread(self.diagnostics.open_run, job, opened.job.steps)
        except Exception:
            log.exception("diagnostics of job %s failed", job)
            return
        if self.jobs is not None:
            self.jobs.opened(job, found, dist.rank, dist.world_size, opened.rank.run.last_step, opened.job.last_step)
            self.jobs.listen(job, dist.rank, self._ask_arrays)
        await self._send_findings(found)

    async def _resolve(self, hello: Hello) -> Hello:
        """A v2 hello that names its job's parameters by digest, with them (and its pieces, by
        default every piece whole and counted). A digest not known is waited for while its job
        has no run yet (the rank that sends the list may be a moment behind), at most
        DIGEST_WAIT_S; then, or at once if the job's run has another list, the hello is refused
        with CLOSE_NEED_PARAMS (the full list then says how it differs)."""
        assert hello.dist is not None and hello.params_digest is not None
        digest, job = hello.params_digest, hello.dist.job
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DIGEST_WAIT_S
        next_look = loop.time()
        while (found := self.store.param_lists.known(digest)) is None:
            job_there = False
            if loop.time() >= next_look:
                found, job_there = await _on_hello_thread(self.store.resolve_params, job, digest)
                if found is not None:
                    break
                next_look = loop.time() + DIGEST_STORE_EVERY_S
            if job_there or loop.time() >= deadline:
                raise Refusal(
                    CLOSE_NEED_PARAMS,
                    f"params_digest {digest[:16]}... is not known to this server: send the hello again "
                    "with the job's full parameter list (params and groups)",
                )
            await asyncio.sleep(DIGEST_POLL_S)
        params, groups = found
        pieces = hello.pieces if hello.pieces is not None else Pieces()
        try:
            pieces.check(params)
        except ValueError as exc:
            raise Refusal(CLOSE_INVALID, f"invalid hello message: {exc}") from None
        return hello.model_copy(update={"params": params, "groups": groups, "pieces": pieces})

    async def _welcome(self, last_seq: int) -> None:
        await self._send(
            {
                "type": "welcome",
                "run_id": self.run_id,
                "last_seq": last_seq,
                "linger": self.hub.linger(self.run_id),
                "versions": list(READ_VERSIONS),  # 3: binary step frames (docs/protocol.md)
            }
        )

    async def _read(self, pending: asyncio.Queue[Pending]) -> None:
        """Validate frames in arrival order; a refusal or the end of the socket is queued last."""
        try:
            while True:
                message = self._parse(await self._receive())
                if isinstance(message, Hello):
                    raise Refusal(CLOSE_INVALID, "hello may only be the first message of a connection")
                self._hear(1)
                await pending.put(
                    tuple(message.expand())
                    if isinstance(message, Steps)
                    else (message,)
                    if isinstance(message, Step)
                    else message
                )
        except Refusal as refusal:
            await pending.put(refusal)
        except (WebSocketDisconnect, WebSocketDisconnected):
            await pending.put(_Disconnected())

    async def _write(self, pending: asyncio.Queue[Pending]) -> None:
        """Store queued messages, steps in batches, until the reader's last item.

        A DDP replica's close first asks it for the arrays behind the digests no comparison has
        settled (rank 0's piece may come after the rank is gone: `JobAssembler.owed`); its
        answers are stored, their acks held, and the close is done and acknowledged (with the seq
        of the last answer) once they all came, or after CLOSE_ANSWER_WAIT_S."""
        loop = asyncio.get_running_loop()
        closing: _Closing | None = None
        while True:
            if closing is None:
                items = [await pending.get()]
                if isinstance(items[0], tuple):
                    # let the reader queue the rest of the pace's frames: one batch of them costs
                    # one commit, thread hand-off, diagnosis and ack rather than one per message
                    await self._burst(pending)
            else:
                try:
                    items = [await asyncio.wait_for(pending.get(), max(0.0, closing.deadline - loop.time()))]
                except TimeoutError:
                    await self._end_close(closing)
                    closing = None
                    continue
            while isinstance(items[-1], (tuple, _AckDue)) and not pending.empty():
                items.append(pending.get_nowait())
            if any(isinstance(item, _AckDue) for item in items):  # a held ack's time has come
                await self._send_held()
                items = [item for item in items if not isinstance(item, _AckDue)]
                if not items:
                    continue
            steps = [step for item in items if isinstance(item, tuple) for step in item]
            if steps:
                ack = await self._steps(steps, send_ack=closing is None)
                if closing is not None:
                    closing.acks.append(ack)
                    closing.owed.difference_update(s.step for s in steps if RESENT in s.scalars)
            self._hear(-sum(isinstance(item, (tuple, Close)) for item in items))
            last = items[-1]
            if closing is not None and (not closing.owed or not isinstance(last, tuple)):
                with contextlib.suppress(WebSocketDisconnect, WebSocketDisconnected, RuntimeError):
                    await self._end_close(closing)  # a hook gone meanwhile: its close still counts
                closing = None
            if isinstance(last, Close):
                owed = [] if self.job is None or self.jobs is None else self.jobs.owed(self.job, self.rank)
                if owed:
                    await self._ask_arrays(owed)
                    closing = _Closing(last, set(owed), loop.time() + CLOSE_ANSWER_WAIT_S)
                else:
                    await self._close(last)
            elif isinstance(last, Refusal):
                raise last
            elif isinstance(last, _Disconnected):
                return

    async def _burst(self, pending: asyncio.Queue[Pending]) -> None:
        """Wait while the reader queues more of a burst of frames (BURST_GAP_S, BURST_MAX_S)."""
        loop = asyncio.get_running_loop()
        end = loop.time() + BURST_MAX_S
        seen = -1
        while pending.qsize() != seen and not pending.full():
            seen = pending.qsize()
            left = end - loop.time()
            if left <= 0:
                return
            await asyncio.sleep(min(BURST_GAP_S, left))

    async def _end_close(self, closing: _Closing) -> None:
        """A replica's close, its answers stored: the close takes the seq of its last answer
        (its ack covers them; a close below the run's last seq reads as applied already)."""
        seq = max([closing.close.seq, *(int(str(ack["seq"])) for ack in closing.acks)])
        await self._close(closing.close.model_copy(update={"seq": seq}))

    def _hear(self, queued: int) -> None:
        """A rank's frame was read (+1: it waits on the writer) or its frames stored (-n): the
        job's assembler hears of the rank now, so that a rank behind the writer is not lost."""
        if self.job is not None and self.jobs is not None and (queued or self.queued):
            self.queued += queued
            self.jobs.hear(self.job, self.rank, queued)

    async def _ask_arrays(self, steps: list[int]) -> None:
        """Ask this replica for the arrays its `grad_digest` stood for at `steps` (their digest
        differs from rank 0's): the hook sends them again, marked RESENT (docs/protocol.md)."""
        await self._send({"type": "arrays", "steps": steps})

    async def _steps(self, steps: list[Step], send_ack: bool = True) -> dict[str, object]:
        """Store a batch of steps (and assemble or judge them); their ack is sent (`send_ack`)
        or returned, to follow a replica's close (`_write`)."""
        if self.job is None and any(s.grad_digest is not None for s in steps):
            raise Refusal(CLOSE_INVALID, "grad_digest is for a distributed job's rank (a hello with dist)")
        await self._settle()
        batch = [step_data(s) for s in steps]
        notice = self.hub.steps_notice(self.run_id)
        late = [s for s, data in zip(steps, batch) if data.resent]
        judged: _Judged = None
        try:
            if self.job is not None and self.jobs is not None:  # with other ranks' frames: a group commit
                stored = await self.jobs.commits.write(self.run_id, batch, notice)
            elif self.job is None and not late:  # stored and judged here, or in one hand-off to a thread
                now = self._store_now(batch) if notice is None and _small(batch) else None
                if now is not None:
                    stored, judged = now, self._judge(batch, now)
                else:
                    stored, judged = await asyncio.to_thread(self._store_and_judge, batch, notice)
            else:
                stored = await asyncio.to_thread(
                    self.store.write_steps, self.run_id, batch, notice, self.job is not None
                )
        except UnknownRun:
            raise _deleted(self.run_id) from None
        new = [data for data, is_new in zip(batch, stored) if is_new]
        whole = False
        if self.job is not None:  # with a replica's arrays asked for (resent): the step they held back
            await self._assemble([d for d, is_new in zip(batch, stored) if is_new or d.resent])
        elif late:
            # norms added to steps judged unmeasured: judged again from the diagnosis' snapshot
            # before them, with this batch's new steps (at most 128 steps and the batch's, whatever
            # the run's length); a window older than the snapshots has the run judged again whole,
            # after the ack (about 0.7 ms a stored step: docs/benchmarks.md)
            earliest = min(s.step for s in late)
            whole = not await self._report(lambda run_id: self.diagnostics.judge_late(run_id, earliest))
        elif judged is not None:
            await self._tell(judged)
        ack: dict[str, object] = {
            "type": "ack",
            "seq": max(s.seq for s in steps),
            "linger": self.hub.linger(self.run_id),
        }
        cpu_per_step = self.step_cost.stored(len(new))
        if cpu_per_step is not None:
            ack["cpu_per_step"] = cpu_per_step
        if send_ack:
            await self._hold(ack)
        self.hub.publish_steps(self.run_id, [step for step, is_new in zip(steps, stored) if is_new])
        if late and self.job is None:  # the window's norms: the charts add them to the steps they show
            self.hub.publish_late(self.run_id, late)
        if whole:  # its findings are told as they come; the next batch (or close) waits for it
            self.rejudging = asyncio.create_task(self._report(self.diagnostics.rejudge))
        return ack

    async def _settle(self) -> None:
        """Let the run's whole re-diagnosis end before the next batch is stored or the run
        closed: it reads the steps stored so far, and the next batch's are judged after them."""
        if self.rejudging is not None:
            await asyncio.gather(self.rejudging, return_exceptions=True)
            self.rejudging = None

    def _store_and_judge(self, batch: list[StepData], notice: NotifyInTransaction | None) -> tuple[list[bool], _Judged]:
        """In a worker thread: store a batch of a run of its own, then judge its new steps once
        committed (one hand-off to a thread for both: each costs the loop and the thread more
        than a batch of unmeasured steps costs the store)."""
        stored = self.store.write_steps(self.run_id, batch, notice, False)
        return stored, self._judge(batch, stored)

    def _store_now(self, batch: list[StepData]) -> list[bool] | None:
        """On the loop: store a small batch if the store can without waiting (SQLite, no other
        write under way), else None. A thread's hand-off and its wake of the loop when done
        cost more CPU than storing a batch of unmeasured steps (docs/design.md)."""
        try:
            return self.store.try_write_steps(self.run_id, batch)
        except UnknownRun:
            raise
        except Exception:  # the thread's path tries again and reports what fails there
            log.debug("storing run %s's batch on the loop failed; handing it to a thread", self.run_id, exc_info=True)
            return None

    def _judge(self, batch: list[StepData], stored: list[bool]) -> _Judged:
        """The run's findings after its new steps in `batch` (`stored`) were committed; None where
        no step was new, or the diagnostics failed (logged: they never stop ingest)."""
        new = [data for data, is_new in zip(batch, stored) if is_new]
        if not new:
            return None
        try:
            return self.diagnostics.observe(self.run_id, new)
        except Exception:  # diagnostics must never stop ingest: log, and carry on storing
            log.exception("diagnostics of run %s failed", self.run_id)
            return None

    async def _report(self, diagnose: Callable[[str], list[Finding] | None], notify: bool = True) -> bool:
        """Run the diagnostics (off the loop); send the hook each new code (again if its severity
        changes), and the webhooks too (with `notify`); the browsers each change. False where
        `diagnose` judged nothing (None)."""
        try:
            found = await asyncio.to_thread(diagnose, self.run_id)
        except Exception:  # diagnostics must never stop ingest: log, and carry on storing
            log.exception("diagnostics of run %s failed", self.run_id)
            return True
        if found is None:
            return False
        await self._tell(found, notify)
        return True

    async def _tell(self, found: list[Finding], notify: bool = True) -> None:
        """Send the hook each new code of the run's findings `found` (again if its severity
        changes), and the webhooks too (with `notify`); the browsers each change."""
        for finding in found:
            public = finding.to_dict()
            told = tell(self.reported, public)
            if told.news:
                await self._send({"type": "finding", "finding": public})
                if notify and self.notifier is not None and self.run_ref is not None:
                    self.notifier.finding(self.run_ref, public)
            if told.changed:
                self.hub.publish_finding(self.run_id, public)

    async def _assemble(self, stored: Sequence[StepData] = (), closed: bool = False) -> None:
        """A rank's batch is committed (its new steps `stored`), or its close: assemble the job's
        ready steps; send this hook the job's new findings (before the ack that follows)."""
        if self.jobs is None or self.job is None:
            return
        try:
            found = await self.jobs.assemble(self.job, self.rank, stored, closed=closed)
        except Exception:  # the rank's steps are committed: the job's timer assembles them later
            log.exception("assembly of job %s failed", self.job)
            return
        if found is not None:
            await self._send_findings(found)

    async def _send_findings(self, found: list[Finding]) -> None:
        """Send this hook each of the job's findings it was not sent (again if graver)."""
        for finding in found:
            public = finding.to_dict()
            if tell(self.reported, public).news:
                await self._send({"type": "finding", "finding": public})

    async def _hold(self, ack: dict[str, object]) -> None:
        """Send a step ack, or on a paced connection hold it (the newest covers the ones before
        it) until RANK_ACK_EVERY_S has passed since the last one sent, or its linger changed;
        a held ack is sent at the latest RANK_ACK_EVERY_S after it was held (a timer queues
        `_ACK_DUE` for the writer), before an error frame, and is covered by a close's ack."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        if not self.paced or now - self.ack_sent_at >= RANK_ACK_EVERY_S or ack["linger"] != self.linger_sent:
            self.held = ack
            await self._send_held()
            return
        self.held = ack
        if self.held_timer is None:
            self.held_timer = loop.call_at(now + RANK_ACK_EVERY_S, self._ack_due)

    def _ack_due(self) -> None:
        self.held_timer = None
        if self.pending is not None:
            with contextlib.suppress(asyncio.QueueFull):  # a full queue: the writer acks soon anyway
                self.pending.put_nowait(_ACK_DUE)

    async def _send_held(self) -> None:
        if self.held_timer is not None:
            self.held_timer.cancel()
            self.held_timer = None
        ack, self.held = self.held, None
        if ack is not None:
            self.ack_sent_at = asyncio.get_running_loop().time()
            self.linger_sent = ack["linger"]
            await self._send(ack)

    async def _close(self, close: Close) -> None:
        await self._settle()
        self.held = None  # the close's ack covers it
        try:
            changed = await asyncio.to_thread(self.store.close_run, self.run_id, seq=close.seq, status=close.status)
        except UnknownRun:
            raise _deleted(self.run_id) from None
        self.state = State.CLOSED
        if self.job is not None:  # a closed rank is waited for no more
            await self._assemble(closed=True)
            job = await self._await_job()
            if job is not None:  # its stored findings: the job may have ended, its state dropped
                found = await asyncio.to_thread(
                    self.diagnostics.findings, job.id, steps=job.steps, running=job.status == "running"
                )
                await self._send_findings(found)
            await self._send({"type": "ack", "seq": close.seq})
            return
        try:
            await asyncio.to_thread(self.diagnostics.close_run, self.run_id)
        except Exception:
            log.exception("diagnostics of run %s could not be closed", self.run_id)
        await self._send({"type": "ack", "seq": close.seq})
        if changed:
            run = await asyncio.to_thread(self.store.get_run, self.run_id)
            if run is not None:
                self.hub.publish_run(run)

    async def _await_job(self) -> Run | None:
        """Wait, at most JOB_CLOSE_WAIT_S, until the job's run holds this rank's last step (the
        other ranks' connections assemble it) or the job has ended; the job's run then (None if
        it or this rank's run is gone). The assembly here that stores the step wakes the wait
        (`JobAssembler.wait_for_step`); the store is looked at again on waking, and every
        JOB_CLOSE_LOOK_S for a job another worker assembles or settles."""
        assert self.job is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + JOB_CLOSE_WAIT_S
        mine, job = await asyncio.gather(
            asyncio.to_thread(self.store.get_run, self.run_id), asyncio.to_thread(self.store.get_run, self.job)
        )
        while True:
            if mine is None or job is None:
                return None
            if job.status != "running" or mine.last_step is None or loop.time() >= deadline:
                return job
            if job.last_step is not None and job.last_step >= mine.last_step:
                return job
            wait = min(JOB_CLOSE_LOOK_S, deadline - loop.time())
            if self.jobs is None:
                await asyncio.sleep(wait)
            else:
                await self.jobs.wait_for_step(self.job, mine.last_step, wait)
            job = await asyncio.to_thread(self.store.get_run, self.job)

    async def _send(self, message: dict[str, object]) -> None:
        await self.ws.send_text(json.dumps(message, separators=(",", ":")))

    async def _refuse(self, refusal: Refusal) -> None:
        log.info("ingest of run %s refused (%d): %s", self.run_id or "(before hello)", refusal.code, refusal.message)
        try:
            await self._send_held()  # what came before the refused message is acknowledged first
            await self._send({"type": "error", "message": refusal.message})
            await self.ws.close(refusal.code, close_reason(refusal.message))
        except (WebSocketDisconnect, WebSocketDisconnected, RuntimeError):
            pass  # the hook is gone already

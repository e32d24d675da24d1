"""The transport: a background thread that serializes messages and streams them to the server.

The training thread only calls `submit`/`submit_step`, which never block and never raise (an
append to a deque: no lock, no wake-up of this thread). The thread writes every message ahead to
the run's spool file (spool.py), keeps it until the server acknowledges it (the server acks after
commit), resends what is unacknowledged after reconnecting with exponential backoff and jitter,
and drops the message the server refuses as invalid (it would be refused again) with a warning.
Memory stays bounded: past `max_unacked_bytes` the oldest messages live only in the spool and are
resent from there. What is still unacknowledged when `close()` gives up stays in the spool for
the next `watch()` or `gradwatch-sync`.

Sending is paced: every `linger` seconds (as the server asks: 0.25 s while a browser watches the
run, 5 s otherwise) the thread sends what it serialized since. A fast training loop (tens of
steps per second) then costs one commit, one ack and one diagnostics pass per `linger` instead
of per step, on both sides, and a step reaches the dashboard at most `linger` later. A hook
with an `on_finding` callback caps the pace at FINDING_LINGER_S (`max_linger`), so that a finding
raised by a step reaches the callback within a second of it (docs/diagnostics.md). Writing to
the spool is not paced by the server: every SPOOL_EVERY_S the thread serializes what was
submitted (consecutive steps with the same keys as one `steps` message, docs/protocol.md) and
writes it to the spool, so a training process killed outright loses at most its last
SPOOL_EVERY_S of steps, however long the server lets the hook gather them.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
import math
import random
import threading
import time
from collections.abc import Sequence
from typing import Any, Callable, Optional, Union

from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection

from . import wire
from .connection import CLOSE_INVALID, negotiate, refusal, replies
from .spool import SpoolWriter, as_json
from .wire import UnsentStep

log = logging.getLogger("gradwatch")

#: Builds the message body for a sequence number; runs on the sender thread.
MessageFactory = Callable[[int], dict[str, Any]]
#: Builds a step message's binary frame (protocol v3) for a sequence number.
FrameFactory = Callable[[int], bytes]
#: A serialized message as kept until acknowledged: JSON text, or a binary step frame.
Payload = Union[str, bytes]


def _one_step(record: UnsentStep, seq: int) -> dict[str, Any]:
    return wire.steps(seq, [record])


class _StepItem:
    """A submitted step: `make` runs on the sender thread (it may wait for the device-to-host
    copy and resolves the measurements), so the training thread does neither. It may make
    several steps' records at once (the flight recorder's held steps, recorder.py)."""

    __slots__ = ("make",)

    def __init__(self, make: Callable[[], Union[UnsentStep, list[UnsentStep]]]) -> None:
        self.make = make


_Item = Union[MessageFactory, _StepItem]


def _renderer(make: Callable[..., Any]) -> Any:
    """The renderer of a step submitted as `functools.partial(renderer.render, snapshot, steps)`
    (rounds.py) by a renderer that renders several steps in one pass (`render_many`, render.py),
    else None: the sender renders the steps it drains together (fewer numpy calls a step)."""
    func = make.func if isinstance(make, functools.partial) and not make.keywords else None
    owner = getattr(func, "__self__", None)
    return owner if getattr(func, "__name__", None) == "render" and hasattr(owner, "render_many") else None


#: Most steps, and about the most bytes, of one `steps` message (the server takes 4,096 steps
#: and 16 MiB frames).
MAX_BATCH_STEPS = 1024
MAX_BATCH_BYTES = 4 << 20
#: A replica's measured steps kept (their arrays) to answer the server's `arrays` request: a
#: step whose `grad_digest` differs from rank 0's (docs/protocol.md, version 2).
REPLICA_RING_STEPS = 256

#: Bounds of the pace the server may ask for (`linger` in its `welcome` and `ack`).
MIN_LINGER_S, MAX_LINGER_S = 0.01, 5.0
#: The longest pace of a hook whose training process acts on findings (`watch(on_finding=...)`):
#: a step, its finding and the reply take well under a second, at four commits a second.
FINDING_LINGER_S = 0.25
#: Longest a submitted step waits to be serialized and written to the spool (what a killed process
#: loses). Each spool write has a fixed cost, so it is not shorter: writing several times a second
#: triples the sender's CPU per step (docs/benchmarks.md); sending follows the server's pace.
SPOOL_EVERY_S = 1.0


class Sender:
    #: Called on this thread with each diagnostic the server finds (watcher sets a FindingWarner).
    on_finding: Callable[[Any], None] = staticmethod(lambda finding: None)

    def __init__(
        self,
        ws_url: str,
        hello: dict[str, Any],
        token: Optional[str] = None,
        max_queue: int = 4096,
        max_unacked_bytes: int = 64 << 20,
        spool: Optional[SpoolWriter] = None,
        linger: float = 0.25,
        max_linger: float = MAX_LINGER_S,
        replica_state: bool = False,
    ) -> None:
        """`linger`: seconds between sends until the server says otherwise (`_pace`), never more
        than `max_linger`. `replica_state`: a DDP replica's optimizer shards its state
        (states.shards_state): its digested steps keep their state norms (wire.digested)."""
        self.ws_url = ws_url
        self.max_linger = min(max(max_linger, MIN_LINGER_S), MAX_LINGER_S)
        self.linger = min(linger, self.max_linger)
        #: wait for replies after a send (a finding reaches `on_finding` as soon as it comes) rather
        #: than read them at the next drain: a hook capped below MAX_LINGER_S acts on findings
        self._prompt_replies = self.max_linger < MAX_LINGER_S
        self.hello = hello
        #: the hellos to try in turn (wire.rank_hellos), serialized on the sender thread
        self._hellos: Optional[list[str]] = None
        self.token = token
        self.max_unacked_bytes = max_unacked_bytes
        self.spool = spool
        self.dropped = 0  # messages lost: the queue was full, or memory was and there is no spool
        #: server CPU seconds per stored step, as its acks say (`cpu_per_step`); 0 until one does
        self.server_cpu_per_step = 0.0
        self._evicted_upto = 0  # messages up to this seq are unacknowledged but only in the spool
        self._acked = 0  # highest seq the server acknowledged
        self._deadline = float("inf")
        self._items: collections.deque[_Item] = collections.deque()
        self._max_queue = max_queue
        # items submitted, and items serialized: equal when nothing waits to be serialized (what
        # tests wait for before reading `_unacked`: tests/support/sent.py)
        self._submitted = 0
        self._serialized = 0
        self._unacked: collections.deque[tuple[int, Payload]] = collections.deque()
        self._unacked_bytes = 0
        self._next_drain = 0.0
        self._next_send = 0.0
        self._sent_upto = 0  # highest seq handed to the current connection
        self._seq = 0
        self._ws: Optional[ClientConnection] = None
        self._ws_scope = contextlib.ExitStack()  # websockets>=17 wants connect() as a context manager
        self._closing = threading.Event()
        self._errors_seen: set[tuple[type, str]] = set()
        # held until close() releases it: a wait to acquire it ends at close() (a bare lock: an
        # Event's wait runs a Condition's Python code at each of this thread's wakes)
        self._wake = threading.Lock()
        self._wake.acquire()
        #: a DDP replica's measured steps go as their digest once the server speaks v2 (`_v2`)
        self._replica = wire.is_replica(hello)
        self._replica_state = replica_state
        self._v2 = False
        #: the server reads binary step frames (protocol v3, its welcome's `versions`): steps go so
        self._binary = False
        self._ring: collections.deque[UnsentStep] = collections.deque(maxlen=REPLICA_RING_STEPS)
        self._thread = threading.Thread(target=self._run, name="gradwatch-sender", daemon=True)
        self._thread.start()

    # -- training thread -------------------------------------------------------------------
    def submit(self, factory: MessageFactory) -> None:
        """Queue a message; never blocks the training step."""
        self._put(factory)

    def submit_step(self, make: Callable[[], Union[UnsentStep, list[UnsentStep]]]) -> None:
        """Queue a step (or several); `make` builds its record(s) on the sender thread."""
        self._put(_StepItem(make))

    def _put(self, item: _Item) -> None:
        if len(self._items) >= self._max_queue:
            self._drop("the send queue is full")
            return
        self._submitted += 1
        self._items.append(item)

    def close(self, status: str = "finished", timeout: float = 5.0) -> bool:
        """Send `close`, wait up to `timeout` s for every message to be acknowledged."""
        if self._closing.is_set():
            return not self._thread.is_alive()
        self.submit(lambda seq: wire.close(seq, status))
        self._deadline = time.monotonic() + timeout
        self._closing.set()
        with contextlib.suppress(RuntimeError):  # released already by a close() on another thread
            self._wake.release()
        self._thread.join(timeout + 1.5)  # a send in progress gives up within 1 s (SO_SNDTIMEO)
        return not self._thread.is_alive()

    @property
    def pending(self) -> int:
        """Messages not yet acknowledged by the server (queued or sent)."""
        evicted = self._evicted_upto - self._acked if self._evicted_upto else 0
        return len(self._items) + len(self._unacked) + evicted

    # -- sender thread ---------------------------------------------------------------------
    def _run(self) -> None:
        backoff, next_attempt = 0.1, 0.0
        while True:
            try:
                self._pump()  # spool what is queued before a connection attempt can block
                if self._closing.is_set():
                    delivered = not self._items and not self._unacked and not self._evicted_upto
                    if delivered or self._past_deadline():
                        self._finish(delivered)
                        return
                if self._ws is None and time.monotonic() >= next_attempt:
                    try:
                        self._connect()
                        backoff = 0.1
                    except Exception as exc:  # server down, refusing, or slow: retry later
                        log.debug("gradwatch: cannot reach %s: %s", self.ws_url, exc)
                        self._disconnect()
                        next_attempt = time.monotonic() + backoff * (0.5 + random.random())
                        backoff = min(backoff * 2, 5.0)
            except Exception as exc:  # a bug here must never reach the training loop
                self._report_error(exc)
                self._disconnect()
                if self._past_deadline():  # a pump that keeps failing must not outlive close()
                    self._give_up()
                    return
                time.sleep(0.1)

    def _report_error(self, exc: Exception) -> None:
        """Log a sender error's traceback the first time it is seen, its repeats at debug level:
        a fault that recurs at every pump would otherwise write a traceback ten times a second
        into the training job's log for the rest of the process."""
        key = (type(exc), str(exc))
        if key in self._errors_seen or len(self._errors_seen) >= 16:
            log.debug("gradwatch: sender error again; continuing: %r", exc)
            return
        self._errors_seen.add(key)
        log.error("gradwatch: sender error; continuing", exc_info=exc)

    def _give_up(self) -> None:
        """End the thread after close()'s deadline when the pump itself keeps failing: keep on
        disk what can be kept, and say so."""
        try:
            self._finish(delivered=False)
        except Exception as exc:
            log.warning("gradwatch: the sender ended on an error; messages may be lost: %r", exc)

    def _pump(self) -> None:
        """Every SPOOL_EVERY_S (or `linger`, if shorter): serialize what was submitted and write
        it to the spool; read the replies that came since; every `linger` (at once when closing):
        send what is serialized and not sent yet; then wait for the next of those.

        The spool is flushed before anything is sent, so a send that hangs on a stalled server
        leaves every serialized message on disk.
        """
        now, closing = time.monotonic(), self._closing.is_set()
        period = min(self.linger, SPOOL_EVERY_S)
        if self._items and (now >= self._next_drain or closing):
            self._next_drain = now + period
            self._drain()
            if self.spool is not None:
                self.spool.flush()
        # Replies (acks, findings, a replica's `arrays`) answer what was sent; a `pace` comes
        # when a browser starts watching the run. Those received
        # since the last wake are read at this one (before this wake's send: its acks come at the
        # next), without waiting for more: an ack that woke this thread would cost a wake per send.
        # A hook whose training acts on findings, and one closing, wait for them instead (after
        # the send: a reply ends the wait).
        prompt = closing or self._prompt_replies
        if not prompt and self._ws is not None:  # a `pace` may come with nothing awaited
            self._read_acks(0.0)
        # A send due within half a drain period goes with this wake's drain: each wake of this
        # thread costs more CPU than its work (docs/benchmarks.md), and the pace stays `linger`.
        if self._unsent() and (now >= self._next_send - period / 2 or closing):
            self._next_send = now + self.linger
            self._send_unsent()
        if self._items:  # the next drain (a send due by then goes with it)
            wake_at = self._next_drain
        elif self._unsent():
            wake_at = self._next_send
        else:  # the training thread does not wake this one: look for submitted steps at the pace
            wake_at = self._next_drain if self._next_drain > now else now + period
        wait = min(max(wake_at - time.monotonic(), 0.001), SPOOL_EVERY_S)
        if closing:  # close() waits `timeout` at most, whatever pace the server set
            wait = min(wait, max(self._deadline - time.monotonic(), 0.001))
        if prompt and self._awaiting_replies():
            self._read_acks(wait)
        elif self._ws is None:  # `_run` retries the connection meanwhile
            time.sleep(0.02) if closing else self._wake.acquire(timeout=min(wait, 0.05))
        elif not closing:
            self._wake.acquire(timeout=wait)

    def _awaiting_replies(self) -> bool:
        """Whether something sent on this connection is not acknowledged yet."""
        return self._ws is not None and bool(self._unacked) and self._sent_upto > self._acked

    def _drain(self) -> None:
        """Serialize every submitted item in order into `_unacked` (and the spool); runs of steps
        with the same keys become one message each."""
        run: list[UnsentStep] = []
        whole: list[UnsentStep] = []  # a replica's digested steps with their arrays: what the spool keeps
        size = taken = 0
        run_keys = None  # the keys of `run`'s steps

        def flush() -> None:
            nonlocal size
            if run:
                records, kept = run.copy(), whole.copy()
                same = all(a is b for a, b in zip(kept, records))
                spooled = None if same else lambda seq: wire.steps(seq, kept)
                make: MessageFactory = lambda seq: wire.steps(seq, records)  # noqa: E731
                frame: FrameFactory = lambda seq: wire.binary_steps(seq, records)  # noqa: E731
                self._add(make, spooled, frame)
                run.clear()
                whole.clear()
                size = 0

        items = self._items
        while items:
            item = items.popleft()
            taken += 1
            if not isinstance(item, _StepItem):
                flush()
                self._add(item)
                continue
            make = item.make
            lean = type(make) is functools.partial and make.func is UnsentStep  # an unmeasured step's facts
            renderer = None if lean else _renderer(make)
            if renderer is None:
                made = self._make_one(make)
            else:  # the steps queued after it that the same renderer makes: rendered with it
                batch = [item]
                while items and isinstance(after := items[0], _StepItem) and _renderer(after.make) is renderer:
                    batch.append(after)
                    items.popleft()
                taken += len(batch) - 1
                made = self._make(batch, renderer)
            for full in made:
                record = self._replica_step(full) if self._replica else full
                keys = record.keys()
                nbytes = record.nbytes
                if run and (keys != run_keys or len(run) >= MAX_BATCH_STEPS or size + nbytes > MAX_BATCH_BYTES):
                    flush()
                run_keys = keys
                run.append(record)
                whole.append(full)
                size += nbytes
        flush()
        self._serialized += taken  # only now: every item taken is in `_unacked` (or skipped)

    def _make(self, items: list[_StepItem], renderer: Any = None) -> list[UnsentStep]:
        """The records of `items`: made together by `renderer.render_many` when given (their
        makes are its `render`'s: `_renderer`), else each by its own `make`; an item whose make
        raises is skipped, with a warning (a batch that raises is made again item by item)."""
        if renderer is not None:
            try:
                made: list[UnsentStep] = renderer.render_many([item.make.args for item in items])  # type: ignore[attr-defined]
                return made
            except Exception:
                log.debug("gradwatch: could not render %d steps at once; one by one", len(items), exc_info=True)
        records: list[UnsentStep] = []
        for item in items:
            records.extend(self._make_one(item.make))
        return records

    @staticmethod
    def _make_one(make: Callable[[], Union[UnsentStep, list[UnsentStep]]]) -> Sequence[UnsentStep]:
        """The record(s) of one `make` (several: the flight recorder's held steps); none, with a
        warning, when it raises."""
        try:
            one = make()
        except Exception:
            log.exception("gradwatch: could not build a step; skipped")
            return ()
        return one if isinstance(one, list) else (one,)

    def _replica_step(self, record: UnsentStep) -> UnsentStep:
        """A replica's measured step as its digest (its arrays kept in the ring), on v2."""
        measured = record.grad_status is not None or "grad_norm" in record.metrics
        if not (self._replica and self._v2 and measured) or wire.RESENT in record.scalars:
            return record
        self._ring.append(record)
        return wire.digested(record, self._replica_state)

    def _send_arrays(self, steps: Any) -> None:
        """The server asks for the arrays behind some of this replica's digests: each step sent
        again from the ring, marked RESENT; one no longer held is sent marked, without arrays
        (the server then judges that step without this rank)."""
        held = {r.step: r for r in self._ring}
        for s in steps if isinstance(steps, list) else []:
            if not isinstance(s, int):
                continue
            record = held.get(s)
            if record is None:
                log.warning("gradwatch: the server asked for step %d's arrays, no longer held", s)
                again = UnsentStep(s, time.time(), {wire.RESENT: 1.0}, {}, None)
            else:
                scalars = {**record.scalars, wire.RESENT: 1.0}
                again = UnsentStep(record.step, record.time, scalars, record.metrics, record.grad_status)
            self._add(functools.partial(_one_step, again))

    def _unsent(self) -> bool:
        """Whether the connection has messages to be sent (unconnected, `_connect` sends them all)."""
        return self._ws is not None and self._seq > self._sent_upto

    def _send_unsent(self) -> None:
        """Send the messages serialized since the last send, in order (those still in memory:
        evicted ones go from the spool when `_connect` resends)."""
        assert self._ws is not None
        unsent = [payload for seq, payload in self._unacked if seq > self._sent_upto]
        self._sent_upto = self._seq
        for payload in unsent:
            if self._past_deadline():
                return
            try:
                self._ws.send(payload)
            except Exception:
                self._disconnect()  # `_connect` sends every unacknowledged message
                return

    def _past_deadline(self) -> bool:
        return self._closing.is_set() and time.monotonic() > self._deadline

    def _add(
        self, factory: MessageFactory, spooled: Optional[MessageFactory] = None, frame: Optional[FrameFactory] = None
    ) -> Optional[Payload]:
        """Serialize one message, spool it and keep it until acknowledged; returns it as kept.
        `spooled`: what the
        spool keeps instead (a replica's steps with their arrays, which a replay sends: its
        connection cannot answer the server's ask for them). `frame`: the message as a binary
        frame, kept and spooled as such (never serialized as JSON too) unless this connection's
        server does not read them (`_connect` turns those made before connecting into JSON)."""
        seq = self._seq + 1
        try:
            binary = frame is not None and (self._binary or self._ws is None)
            payload: Payload = frame(seq) if frame is not None and binary else wire.dumps(factory(seq))
            kept = None
            if self.spool is not None:
                kept = payload if spooled is None else wire.dumps(spooled(seq))
        except Exception:
            log.exception("gradwatch: could not build a message; skipped")
            return None
        self._seq = seq
        if kept is not None:
            self._spool_append(kept)
        self._unacked.append((seq, payload))
        self._unacked_bytes += len(payload)
        while self._unacked_bytes > self.max_unacked_bytes and len(self._unacked) > 1:
            old_seq, old = self._unacked.popleft()
            self._unacked_bytes -= len(old)
            if self.spool is not None:
                self._evicted_upto = old_seq  # still on disk: resent from there
            else:
                self._drop("unacknowledged data exceeds the memory limit")
        return payload

    def _read_acks(self, timeout: float) -> None:
        assert self._ws is not None
        try:
            for reply in replies(self._ws, timeout):
                if reply.get("type") == "ack":
                    self._acknowledge(int(reply["seq"]))
                    self._pace(reply)
                    self._note_cost(reply)
                elif reply.get("type") == "error":
                    log.warning("gradwatch: the server refused a message: %s", reply.get("message"))
                elif reply.get("type") == "pace":  # a browser started watching: its pace, now
                    self._pace(reply)
                elif reply.get("type") == "finding":  # a diagnostic (findings.py); never raises
                    self.on_finding(reply.get("finding"))
                elif reply.get("type") == "arrays":  # a replica's digest differs from rank 0's
                    self._send_arrays(reply.get("steps"))
        except ConnectionClosed as exc:
            self._refused(exc)
            self._disconnect()

    def _refused(self, exc: ConnectionClosed) -> None:
        """Drop the first unacknowledged message when the server closed because it is invalid."""
        why = refusal(exc)
        if why is None:
            return
        if exc.rcvd is not None and exc.rcvd.code == CLOSE_INVALID:
            if self._unacked:
                seq, payload = self._unacked.popleft()
                self._unacked_bytes -= len(payload)
                log.warning("gradwatch: %s: message %d was dropped", why, seq)
        else:
            log.warning("gradwatch: %s", why)

    def _pace(self, reply: dict[str, Any]) -> None:
        """Follow the server's `linger` (short while a browser watches the run), within bounds."""
        linger = reply.get("linger")
        if isinstance(linger, (int, float)) and not isinstance(linger, bool) and math.isfinite(linger):
            self.linger = min(max(float(linger), MIN_LINGER_S), self.max_linger)
            soon = time.monotonic() + self.linger  # a shorter pace starts now, not after the longer one
            self._next_send = min(self._next_send, soon)
            self._next_drain = min(self._next_drain, soon)

    def _note_cost(self, reply: dict[str, Any]) -> None:
        """Keep the server's CPU per stored step (for every="auto"), if the ack says a sane one."""
        cost = reply.get("cpu_per_step")
        if isinstance(cost, (int, float)) and not isinstance(cost, bool) and 0.0 <= cost < 10.0:
            self.server_cpu_per_step = float(cost)

    def _acknowledge(self, seq: int) -> None:
        self._acked = max(self._acked, seq)
        if seq >= self._evicted_upto:
            self._evicted_upto = 0
        while self._unacked and self._unacked[0][0] <= seq:
            _, payload = self._unacked.popleft()
            self._unacked_bytes -= len(payload)

    def _awaiting(self) -> bool:
        """While the welcome is awaited (a server admitting a crowd): spool what was submitted,
        as the pump does every SPOOL_EVERY_S; stop waiting once closing (close() bounds its wait)."""
        if self._items and time.monotonic() >= self._next_drain:
            self._next_drain = time.monotonic() + SPOOL_EVERY_S
            self._drain()
            if self.spool is not None:
                self.spool.flush()
        return not self._closing.is_set()

    def _connect(self) -> None:
        # A server that stops reading must not hold this thread in a send for long: past 1 s
        # the send fails, the connection is dropped and retried, and the pump keeps spooling.
        if self._hellos is None:
            self._hellos = [wire.dumps(h) for h in wire.rank_hellos(self.hello)]
        ws, reply, taken = negotiate(
            self.ws_url, self._hellos, self.token, self._ws_scope, send_timeout=1.0, waiting=self._awaiting
        )
        if taken and taken == len(self._hellos) - 1:  # a server older than v2: v1 from now on
            self._hellos = self._hellos[taken:]
        self._v2 = taken < len(self._hellos) - 1
        self._binary = wire.reads_binary(reply)
        self._ws = ws
        last_seq = int(reply.get("last_seq", 0))
        self._acknowledge(last_seq)
        self._pace(reply)
        backlog = bool(self._unacked) or (self._evicted_upto > last_seq and self.spool is not None)
        if self._evicted_upto and self.spool is not None:
            for payload in self.spool.payloads():  # the hello, then messages in seq order
                seq = wire.seq_of(payload)
                if last_seq < seq <= self._evicted_upto:
                    ws.send(payload if self._binary else as_json(payload))
        if not self._binary:  # binary frames made before connecting: as JSON to this server
            self._unacked = collections.deque((seq, as_json(p)) for seq, p in self._unacked)
            self._unacked_bytes = sum(len(p) for _, p in self._unacked)
        for _, payload in list(self._unacked):
            ws.send(payload)
        self._sent_upto = self._seq
        if backlog:  # a send: the next is `linger` away, as after any other
            self._next_send = time.monotonic() + self.linger

    def _disconnect(self) -> None:
        self._ws = None
        try:
            self._ws_scope.close()
        except Exception as exc:  # already broken: nothing more to tell the server
            log.debug("gradwatch: closing the connection: %s", exc)

    def _spool_append(self, text: Payload) -> None:
        assert self.spool is not None
        try:
            self.spool.append(text)
        except OSError as exc:  # disk full or gone: keep going in memory only
            log.warning("gradwatch: cannot write the spool %s (%s); continuing without it", self.spool.path, exc)
            self._close_spool(delete=False)

    def _finish(self, delivered: bool) -> None:
        """End of the run: drop the spool if the server has everything, else leave it for replay."""
        self._disconnect()
        if not delivered and self.spool is not None:  # what is still queued goes to disk too
            self._drain()
        if self.spool is not None:
            self.spool.flush()
        if not delivered and self.spool is not None:
            log.warning(
                "gradwatch: %d messages not acknowledged yet; kept in %s: run `gradwatch-sync` "
                "or the next watch() to deliver them",
                self.pending,
                self.spool.path,
            )
        self._close_spool(delete=delivered)

    def _close_spool(self, delete: bool) -> None:
        spool, self.spool = self.spool, None
        if spool is not None:
            try:
                spool.close(delete=delete)
            except OSError as exc:
                log.warning("gradwatch: closing the spool %s: %s", spool.path, exc)

    def _drop(self, why: str) -> None:
        if self.dropped == 0:
            log.warning("gradwatch: dropping telemetry: %s", why)
        self.dropped += 1

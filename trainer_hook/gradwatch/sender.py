"""The transport: a background thread that serializes messages and streams them to the server.

The training thread only calls `submit`, which never blocks and never raises. The thread keeps
every message until the server acknowledges it (the server acks after commit), resends what is
unacknowledged after reconnecting with exponential backoff and jitter, and drops the message the
server refuses as invalid (it would be refused again) with a warning.
"""
from __future__ import annotations

import collections
import contextlib
import json
import logging
import queue
import random
import threading
import time
from typing import Any, Callable, Optional

from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from . import wire

log = logging.getLogger("gradwatch")

#: Builds the message body for a sequence number; runs on the sender thread (it may wait for
#: the device-to-host copy and does the serialization), so the training thread does neither.
MessageFactory = Callable[[int], dict[str, Any]]

_CLOSE_INVALID = 1003
_CLOSE_POLICY = 1008


class Sender:
    def __init__(self, ws_url: str, hello: dict[str, Any], token: Optional[str] = None,
                 max_queue: int = 4096, max_unacked_bytes: int = 256 << 20) -> None:
        self.ws_url = ws_url
        self.hello = hello
        self.token = token
        self.max_unacked_bytes = max_unacked_bytes
        self.dropped = 0  # messages lost because memory was full (the spool will take these)
        self._queue: queue.Queue[Optional[MessageFactory]] = queue.Queue(maxsize=max_queue)
        self._unacked: collections.deque[tuple[int, str]] = collections.deque()
        self._unacked_bytes = 0
        self._seq = 0
        self._ws: Optional[ClientConnection] = None
        self._ws_scope = contextlib.ExitStack()  # websockets>=17 wants connect() as a context manager
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gradwatch-sender", daemon=True)
        self._thread.start()

    # -- training thread -------------------------------------------------------------------
    def submit(self, factory: MessageFactory) -> None:
        """Queue a message; never blocks the training step."""
        try:
            self._queue.put_nowait(factory)
        except queue.Full:
            self._drop("the send queue is full")

    def close(self, status: str = "finished", timeout: float = 5.0) -> bool:
        """Send `close`, wait up to `timeout` s for every message to be acknowledged."""
        if self._closing.is_set():
            return not self._thread.is_alive()
        self.submit(lambda seq: wire.close(seq, status))
        self._closing.set()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def wait_serialized(self, timeout: float) -> bool:
        """Wait until every submitted message is serialized (sent or kept for resending)."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.005)
        return not self._queue.unfinished_tasks

    @property
    def pending(self) -> int:
        """Messages not yet acknowledged by the server (queued or sent)."""
        return self._queue.qsize() + len(self._unacked)

    # -- sender thread ---------------------------------------------------------------------
    def _run(self) -> None:
        backoff, next_attempt = 0.1, 0.0
        while True:
            try:
                if self._ws is None and time.monotonic() >= next_attempt:
                    try:
                        self._connect()
                        backoff = 0.1
                    except Exception as exc:  # server down, refusing, or slow: retry later
                        log.debug("gradwatch: cannot reach %s: %s", self.ws_url, exc)
                        self._disconnect()
                        next_attempt = time.monotonic() + backoff * (0.5 + random.random())
                        backoff = min(backoff * 2, 5.0)
                self._pump()
                if self._closing.is_set() and self._queue.empty() and not self._unacked:
                    self._disconnect()
                    return
            except Exception:  # a bug here must never reach the training loop
                log.exception("gradwatch: sender error; continuing")
                self._disconnect()
                time.sleep(0.1)

    def _pump(self) -> None:
        """Serialize queued messages, send them, and read acknowledgements."""
        wait = 0.0 if self._ws is not None and self._unacked else 0.05
        try:
            factory = self._queue.get(timeout=wait) if wait else self._queue.get_nowait()
        except queue.Empty:
            factory = None
        while factory is not None:
            self._add(factory)
            self._queue.task_done()
            try:
                factory = self._queue.get_nowait()
            except queue.Empty:
                factory = None
        if self._ws is not None:
            self._read_acks(0.02 if self._unacked else 0.0)

    def _add(self, factory: MessageFactory) -> None:
        try:
            body = factory(self._seq + 1)
            text = wire.dumps(body)
        except Exception:
            log.exception("gradwatch: could not build a message; skipped")
            return
        self._seq += 1
        self._unacked.append((self._seq, text))
        self._unacked_bytes += len(text)
        while self._unacked_bytes > self.max_unacked_bytes and len(self._unacked) > 1:
            _, old = self._unacked.popleft()
            self._unacked_bytes -= len(old)
            self._drop("unacknowledged data exceeds the memory limit")
        if self._ws is not None:
            try:
                self._ws.send(text)
            except Exception:
                self._disconnect()

    def _read_acks(self, timeout: float) -> None:
        assert self._ws is not None
        try:
            while True:
                reply = json.loads(self._ws.recv(timeout=timeout))
                timeout = 0.0
                if reply.get("type") == "ack":
                    self._acknowledge(int(reply["seq"]))
                elif reply.get("type") == "error":
                    log.warning("gradwatch: the server refused a message: %s", reply.get("message"))
        except TimeoutError:
            return
        except ConnectionClosed as exc:
            self._refused(exc)
            self._disconnect()

    def _refused(self, exc: ConnectionClosed) -> None:
        """Drop the first unacknowledged message when the server closed because it is invalid."""
        rcvd = exc.rcvd
        if rcvd is None:
            return
        if rcvd.code == _CLOSE_INVALID and self._unacked:
            seq, text = self._unacked.popleft()
            self._unacked_bytes -= len(text)
            log.warning("gradwatch: the server refused message %d (%s); it was dropped", seq, rcvd.reason)
        elif rcvd.code == _CLOSE_POLICY:
            log.warning("gradwatch: the server refused the connection (%s): check the token "
                        "(watch(token=...) or GRADWATCH_TOKEN)", rcvd.reason)

    def _acknowledge(self, seq: int) -> None:
        while self._unacked and self._unacked[0][0] <= seq:
            _, text = self._unacked.popleft()
            self._unacked_bytes -= len(text)

    def _connect(self) -> None:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else None
        ws = self._ws_scope.enter_context(connect(self.ws_url, additional_headers=headers, open_timeout=5,
                                                  close_timeout=2, max_size=16 << 20, compression=None))
        self._ws = ws
        ws.send(wire.dumps(self.hello))
        reply = json.loads(ws.recv(timeout=10))
        if reply.get("type") != "welcome":
            raise ConnectionError(f"server answered hello with {reply!r}")
        self._acknowledge(int(reply.get("last_seq", 0)))
        for _, text in list(self._unacked):
            ws.send(text)

    def _disconnect(self) -> None:
        self._ws = None
        try:
            self._ws_scope.close()
        except Exception as exc:  # already broken: nothing more to tell the server
            log.debug("gradwatch: closing the connection: %s", exc)

    def _drop(self, why: str) -> None:
        if self.dropped == 0:
            log.warning("gradwatch: dropping telemetry: %s", why)
        self.dropped += 1

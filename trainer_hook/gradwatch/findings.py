"""Findings the server sends back over the ingest websocket, shown in the training process.

The server diagnoses the run as it streams (a forgotten `zero_grad()`, a layer left out of the
optimizer, AMP skipped steps, ...) and sends each new one as ``{"type": "finding", "finding":
{code, severity, message, params, first_step, ...}}`` (docs/protocol.md). `FindingWarner`
shows each code once per run as a `GradwatchWarning` (once more if it turns graver, e.g. AMP
skipped steps going from info to warning), unless ``watch(..., warn=False)``, and passes the same
new findings to the user's ``watch(..., on_finding=callback)``.

The warner runs on the sender thread and never raises there: with warnings turned into errors
(``-W error``) a finding is logged instead. Silence them with
``warnings.filterwarnings("ignore", category=gradwatch.findings.GradwatchWarning)``.

The user's callback runs on a thread of its own (`CallbackThread`), fed by a small bounded queue:
user code (saving a checkpoint, posting a message) may take seconds, and the sender must never wait
on it, or it would stop spooling and sending, and steps would be dropped once its queue filled. A
finding that arrives while the queue is full is dropped, with one log line. What the callback
raises is logged.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import warnings
from typing import Any, Callable, Optional

from .options import http_url

log = logging.getLogger("gradwatch")

#: findings waiting for the user's callback; findings are few (one per code), so a full queue
#: means a callback stuck for good
CALLBACK_QUEUE = 64


class GradwatchWarning(UserWarning):
    """A mistake gradwatch's server found in this training run (one warning per finding code)."""


def run_page(server: str, run_id: str) -> str:
    """The dashboard page of a run on `server` (a ws:// URL becomes http://)."""
    return http_url(server, f"/runs/{run_id}")


def describe(finding: dict[str, Any], page: Optional[str] = None) -> str:
    """How a finding reads in the terminal: 'gradwatch error: <message> [code, step 5; page]'."""
    where = f"step {finding['first_step']}" if isinstance(finding.get("first_step"), int) else "from the start"
    tail = f"; {page}" if page else ""
    return (
        f"gradwatch {finding.get('severity', 'info')}: {finding.get('message', '')} [{finding['code']}, {where}{tail}]"
    )


class CallbackThread:
    """Runs `callback(finding)` for each finding put, in order, on a daemon thread started at the
    first one; `put` never blocks."""

    def __init__(self, callback: Callable[[dict[str, Any]], Any], maxsize: int = CALLBACK_QUEUE) -> None:
        self.callback = callback
        self._queue: queue.Queue[dict[str, Any]] = queue.Queue(maxsize)
        self._thread: Optional[threading.Thread] = None
        self._start = threading.Lock()

    def put(self, finding: dict[str, Any]) -> None:
        with self._start:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="gradwatch-on-finding", daemon=True)
                self._thread.start()
        try:
            self._queue.put_nowait(finding)
        except queue.Full:
            log.warning(
                "gradwatch: the on_finding callback is %d findings behind; %s is not passed to it",
                self._queue.maxsize,
                finding.get("code"),
            )

    def is_current(self) -> bool:
        """Whether the caller runs on this thread (inside the user's callback)."""
        return self._thread is not None and threading.current_thread() is self._thread

    def wait(self, timeout: float) -> bool:
        """Wait at most `timeout` seconds until every finding put was passed to the callback and it
        returned; whether it did."""
        deadline = time.monotonic() + max(timeout, 0.0)
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)
        return not self._queue.unfinished_tasks

    def _run(self) -> None:
        while True:
            finding = self._queue.get()
            try:
                self.callback(finding)
            except BaseException:  # SystemExit too: it would end this thread, not the training
                log.exception("gradwatch: the on_finding callback raised on %s; the run goes on", finding.get("code"))
            finally:
                self._queue.task_done()


class FindingWarner:
    """Called with each `finding` the server sends; warns once per code (if `enabled`) and has
    `callback` called, on its own thread, with each new one (a new code, or one turned graver)."""

    def __init__(
        self,
        enabled: bool = True,
        page: Optional[str] = None,
        callback: Optional[Callable[[dict[str, Any]], Any]] = None,
    ) -> None:
        self.enabled = enabled
        self.page = page
        self.callback = callback
        self.callbacks = None if callback is None else CallbackThread(callback)
        self.findings: dict[str, dict[str, Any]] = {}  # latest finding per code, warned or not
        self._warned: set[tuple[str, Any]] = set()  # (code, severity) already shown
        self._lock = threading.Lock()

    def __call__(self, finding: Any) -> None:
        try:
            if not isinstance(finding, dict) or not isinstance(finding.get("code"), str):
                log.debug("gradwatch: ignoring a malformed finding: %r", finding)
                return
            key = (finding["code"], finding.get("severity"))
            with self._lock:
                new = key not in self._warned
                self._warned.add(key)
                self.findings[finding["code"]] = finding
            if new and self.callbacks is not None:  # its own copy, with the run's page
                self.callbacks.put(dict(finding, page=self.page))
            if new and self.enabled:
                warnings.warn(describe(finding, self.page), GradwatchWarning, stacklevel=2)
        except Exception as exc:  # e.g. -W error: the sender thread must carry on
            log.warning(
                "gradwatch: %s (%s)",
                describe(finding, self.page) if isinstance(finding, dict) and "code" in finding else finding,
                exc,
            )

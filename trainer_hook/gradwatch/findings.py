"""Findings the server sends back over the ingest websocket, shown in the training process.

The server diagnoses the run as it streams (a forgotten `zero_grad()`, a layer left out of the
optimizer, AMP skipped steps, ...) and sends each new one as ``{"type": "finding", "finding":
{code, severity, message, params, first_step, ...}}`` (docs/protocol.md). `FindingWarner`
shows each code once per run as a `GradwatchWarning` (once more if it turns graver, e.g. AMP
skipped steps going from info to warning), unless ``watch(..., warn=False)``, and passes the same
new findings to the user's ``watch(..., on_finding=callback)``.

It runs on the sender thread and never raises there: with warnings turned into errors
(``-W error``) a finding is logged instead, and what the user's callback raises is logged. Silence them with
``warnings.filterwarnings("ignore", category=gradwatch.findings.GradwatchWarning)``.
"""
from __future__ import annotations

import logging
import threading
import warnings
from typing import Any, Callable, Optional
from urllib.parse import urlsplit, urlunsplit

log = logging.getLogger("gradwatch")


class GradwatchWarning(UserWarning):
    """A mistake gradwatch's server found in this training run (one warning per finding code)."""


def run_page(server: str, run_id: str) -> str:
    """The dashboard page of a run on `server` (a ws:// URL becomes http://)."""
    parts = urlsplit(server.strip())
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    return urlunsplit((scheme, parts.netloc, parts.path.rstrip("/") + f"/runs/{run_id}", "", ""))


def describe(finding: dict[str, Any], page: Optional[str] = None) -> str:
    """How a finding reads in the terminal: 'gradwatch error: <message> [code, step 5; page]'."""
    where = f"step {finding['first_step']}" if isinstance(finding.get("first_step"), int) else "from the start"
    tail = f"; {page}" if page else ""
    return f"gradwatch {finding.get('severity', 'info')}: {finding.get('message', '')} [{finding['code']}, {where}{tail}]"


class FindingWarner:
    """Called with each `finding` the server sends; warns once per code (if `enabled`) and calls
    `callback` with each new one (a new code, or one turned graver)."""

    def __init__(self, enabled: bool = True, page: Optional[str] = None,
                 callback: Optional[Callable[[dict[str, Any]], Any]] = None) -> None:
        self.enabled = enabled
        self.page = page
        self.callback = callback
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
            if new and self.callback is not None:
                self._call(finding)
            if new and self.enabled:
                warnings.warn(describe(finding, self.page), GradwatchWarning, stacklevel=2)
        except Exception as exc:  # e.g. -W error: the sender thread must carry on
            log.warning("gradwatch: %s (%s)", describe(finding, self.page) if isinstance(finding, dict)
                        and "code" in finding else finding, exc)

    def _call(self, finding: dict[str, Any]) -> None:
        """The user's callback gets its own copy, with the run's `page`; whatever it raises stays here,
        logged (SystemExit too: it would end the sender thread, not the training)."""
        assert self.callback is not None
        try:
            self.callback(dict(finding, page=self.page))
        except BaseException:
            log.exception("gradwatch: the on_finding callback raised on %s; the run goes on", finding["code"])

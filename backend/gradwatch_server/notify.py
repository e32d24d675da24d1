"""Findings that reach people: each new error or warning finding POSTed to webhook URLs
(`gradwatch serve --notify URL`, `$GRADWATCH_NOTIFY`).

The body is one JSON object that Slack and Discord incoming webhooks and ntfy take as it is:
`text` (Slack) and `content` (Discord) carry the whole line; `title`, `message`, `click`,
`priority`, `tags` and `topic` are ntfy's JSON publishing fields (post to the ntfy server's root
URL with the topic as the URL's fragment: ``https://ntfy.sh/#my-topic``); `run`, `code`,
`severity`, `first_step`, `params` and `url` are the finding for any other receiver.

Ingest only enqueues (`Notifier.finding` never blocks and never raises): one daemon thread per
URL posts, retrying a failure (network error, 429 or 5xx) with exponential backoff, and logs what
it could not deliver. A receiver that is down or slow delays only its own notifications.

Credentials in a URL (``https://user:pass@host/...``, percent-encoded) are not sent in the URL
(urllib would take them for part of the host): they become an HTTP Basic ``Authorization`` header.
"""

from __future__ import annotations

import base64
import json
import logging
import queue
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

log = logging.getLogger("gradwatch.notify")

#: Severities worth a message; info findings (intentional accumulation, ...) stay on the dashboard.
NOTIFY_SEVERITIES = ("error", "warning")
#: Notifications waiting per URL; past this a receiver that is away loses the newest (logged).
MAX_QUEUED = 1000
#: Discord refuses a `content` longer than this.
DISCORD_MAX = 2000


@dataclass(frozen=True)
class Told:
    """What to do with a finding against what was told of its code before (`tell`)."""

    changed: bool  # any field differs: browsers get it
    news: bool  # new, or its severity changed: hooks and webhooks get it


def tell(known: dict[str, dict[str, object]], finding: dict[str, object]) -> Told:
    """The one rule for telling a finding (`known`: code -> the finding as last told, updated
    here): a hook and a webhook hear of a code once, and again when its severity changes (an
    info turning warning is graver news); a browser gets every change (message, parameters,
    figure), to redraw it."""
    before = known.get(str(finding["code"]))
    known[str(finding["code"])] = finding
    return Told(
        changed=before != finding,
        news=before is None or before["severity"] != finding["severity"],
    )


def check_url(url: str) -> str:
    """An http(s) URL with a host, as given; ValueError otherwise (a typo must not fail silently)."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"a notification URL must be http:// or https:// with a host, not {url!r}")
    return url.strip()


@dataclass(frozen=True)
class RunRef:
    """The run a finding belongs to, as a notification names it."""

    id: str
    name: str
    project: str


def payload(run: RunRef, finding: Mapping[str, Any], page: str, topic: str | None = None) -> dict[str, Any]:
    """The JSON body for one finding (see the module docstring for who reads which key)."""
    severity = str(finding.get("severity", "warning"))
    step = finding.get("first_step")
    where = f"from step {step}" if isinstance(step, int) else "from the start"
    line = (
        f"gradwatch {severity} in run {run.name} ({run.project}): {finding.get('message', '')} "
        f"[{finding.get('code')}, {where}] {page}"
    )
    body: dict[str, Any] = {
        "text": line,
        "content": line[:DISCORD_MAX],
        "title": f"gradwatch {severity}: {run.name}",
        "message": finding.get("message", ""),
        "click": page,
        "priority": 4 if severity == "error" else 3,
        "tags": ["rotating_light" if severity == "error" else "warning", "gradwatch"],
        "run": {"id": run.id, "name": run.name, "project": run.project},
        "code": finding.get("code"),
        "severity": severity,
        "first_step": step,
        "params": list(finding.get("params") or []),
        "url": page,
    }
    if topic:
        body["topic"] = topic
    return body


class _Channel:
    """One URL's queue and the thread that posts from it."""

    def __init__(self, url: str, attempts: int, backoff_s: float, timeout_s: float) -> None:
        parts = urlsplit(url)
        host = parts.netloc.rpartition("@")[2]
        self.url = urlunsplit((parts.scheme, host, parts.path, parts.query, ""))
        self.topic = parts.fragment or None
        self.shown = urlunsplit((parts.scheme, host, parts.path, "", ""))  # no credentials, no query
        self.headers = {"Content-Type": "application/json", "User-Agent": "gradwatch"}
        if "@" in parts.netloc:
            user, _, password = parts.netloc.rpartition("@")[0].partition(":")
            secret = f"{unquote(user)}:{unquote(password)}".encode()
            self.headers["Authorization"] = "Basic " + base64.b64encode(secret).decode("ascii")
        self.attempts, self.backoff_s, self.timeout_s = attempts, backoff_s, timeout_s
        self.queue: queue.Queue[bytes | None] = queue.Queue(MAX_QUEUED)
        self.delivered = 0
        self.failed = 0
        self.thread = threading.Thread(target=self._run, name="gradwatch-notify", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while (body := self.queue.get()) is not None:
            try:
                self._deliver(body)
            except Exception:  # a bug here must not end the thread: the next finding still goes
                log.exception("notification to %s failed", self.shown)
            finally:
                self.queue.task_done()
        self.queue.task_done()

    def _deliver(self, body: bytes) -> None:
        for attempt in range(1, self.attempts + 1):
            problem = self._post(body)
            if problem is None:
                self.delivered += 1
                return
            final = attempt == self.attempts or problem.startswith("refused")
            log.warning(
                "notification to %s failed (%s)%s",
                self.shown,
                problem,
                "; giving up on it" if final else f"; retrying ({attempt}/{self.attempts})",
            )
            if final:
                break
            time.sleep(self.backoff_s * 2 ** (attempt - 1))
        self.failed += 1

    def _post(self, body: bytes) -> str | None:
        """None when the receiver took it; else what went wrong ("refused ..." is not retried)."""
        request = urllib.request.Request(self.url, data=body, method="POST", headers=self.headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                response.read()
            return None
        except urllib.error.HTTPError as exc:
            if exc.code == 429 or exc.code >= 500:
                return f"HTTP {exc.code}"
            return f"refused with HTTP {exc.code}"
        except (OSError, ValueError) as exc:  # URLError, timeouts, connection refused
            return str(getattr(exc, "reason", exc)) or type(exc).__name__


class Notifier:
    """Posts findings to `urls` from background threads; `public_url` makes the run page's link."""

    def __init__(
        self,
        urls: Sequence[str],
        public_url: str,
        *,
        attempts: int = 4,
        backoff_s: float = 1.0,
        timeout_s: float = 10.0,
    ) -> None:
        self.public_url = public_url.rstrip("/")
        self.channels = [_Channel(check_url(u), attempts, backoff_s, timeout_s) for u in urls]

    def page(self, run_id: str) -> str:
        return f"{self.public_url}/runs/{run_id}"

    def finding(self, run: RunRef, finding: Mapping[str, Any]) -> None:
        """Queue a new finding for every URL (errors and warnings only); never blocks, never raises."""
        if finding.get("severity") not in NOTIFY_SEVERITIES:
            return
        for channel in self.channels:
            body = json.dumps(
                payload(run, finding, self.page(run.id), channel.topic), allow_nan=False, default=str
            ).encode()
            try:
                channel.queue.put_nowait(body)
            except queue.Full:
                log.warning("notification to %s dropped: %d are waiting already", channel.shown, MAX_QUEUED)

    def close(self, timeout: float = 5.0) -> None:
        """Let the threads post what is queued, for `timeout` seconds at most (they are daemons)."""
        deadline = time.monotonic() + timeout
        for channel in self.channels:
            try:
                channel.queue.put(None, timeout=max(0.0, deadline - time.monotonic()))
            except queue.Full:
                continue
        for channel in self.channels:
            channel.thread.join(max(0.0, deadline - time.monotonic()))

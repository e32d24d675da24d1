"""`watch()`'s options, declared and checked in one place, and the server's URL.

`WatchOptions` is what `watch()`, the framework callbacks (integrations/) and the `gradwatch-run`
launcher (launch.py, autowatch.py) take: made once, checked once, so that a typo fails where it
is written, not after the framework has set up the model and data. The rules each check states
(`check_name`, `check_every`, `ingest_url`) are also the launcher's, with its flags' names.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union
from urllib.parse import urlsplit, urlunsplit

from .sampling import make_sampler

DEFAULT_SERVER = "http://127.0.0.1:8765"
#: a run's or a project's name
NAME = re.compile(r"^[^\x00-\x1f\x7f]{1,200}$")
#: a logged scalar's name (`Watcher.log`)
METRIC_NAME = re.compile(r"^[A-Za-z0-9_.:-][A-Za-z0-9_./:-]{0,127}$")


def check_name(kind: str, value: Optional[str]) -> None:
    """A run's or a project's name (None: a default one); `kind` names it in the error."""
    if value is None:
        return
    if not isinstance(value, str):
        raise TypeError(f"{kind} must be a string, not {type(value).__name__}")
    if not NAME.match(value):
        raise ValueError(f"{kind} must be 1 to 200 printable characters; got {value!r}")


def check_every(every: object, kind: str = "every") -> None:
    """`every=N` (a whole number >= 1) or "auto"; ValueError naming `kind` otherwise."""
    try:
        make_sampler(every)
    except ValueError as exc:
        raise ValueError(f"{kind}{str(exc).removeprefix('every')}") from None


def server_url(server: Optional[str], env: Mapping[str, str] = os.environ) -> str:
    """The server to use: `server`, else $GRADWATCH_SERVER, else the default (not checked)."""
    return server or env.get("GRADWATCH_SERVER") or DEFAULT_SERVER


def _server_parts(server: str, schemes: Mapping[str, str], expected: str) -> tuple[str, str, str]:
    """(scheme, host[:port], path without a trailing slash) of a server URL, its scheme mapped by
    `schemes`; TypeError/ValueError saying `expected` if it is unusable."""
    if not isinstance(server, str):
        raise TypeError(f"server must be a URL string like {DEFAULT_SERVER!r}, not {type(server).__name__}")
    parts = urlsplit(server.strip())
    scheme = schemes.get(parts.scheme)
    if scheme is None or not parts.hostname:
        raise ValueError(f"server must be {expected} URL with a host, like {DEFAULT_SERVER!r}; got {server!r}")
    try:
        parts.port  # noqa: B018  (raises ValueError on a bad port)
    except ValueError as exc:
        raise ValueError(f"server URL {server!r} has an invalid port") from exc
    return scheme, parts.netloc, parts.path.rstrip("/")


def ingest_url(server: str) -> str:
    """The websocket ingest URL of a server URL (http->ws, https->wss); ValueError if unusable."""
    schemes = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}
    scheme, netloc, path = _server_parts(server, schemes, "an http(s):// or ws(s)://")
    return urlunsplit((scheme, netloc, path + "/ws/ingest", "", ""))


def http_url(server: str, path: str = "") -> str:
    """`path` on the server's http(s) side (ws->http, wss->https); ValueError if unusable."""
    schemes = {"http": "http", "https": "https", "ws": "http", "wss": "https"}
    scheme, netloc, base = _server_parts(server, schemes, "an http(s)://")
    return urlunsplit((scheme, netloc, base + path, "", ""))


@dataclass(frozen=True)
class WatchOptions:
    """How to watch: `watch()`'s keyword arguments but the training's own objects (the model,
    the GradScaler, the user's config), checked when made. Their meanings: `gradwatch.watch`."""

    run: Optional[str] = None
    project: Optional[str] = None
    server: Optional[str] = None
    every: Union[int, str] = 1
    token: Optional[str] = None
    updates: bool = False
    warn: bool = True
    on_finding: Optional[Callable[[dict[str, Any]], Any]] = None
    optimizer_signals: bool = False
    flight_recorder: Optional[bool] = None

    def __post_init__(self) -> None:
        if self.on_finding is not None and not callable(self.on_finding):
            raise TypeError(
                f"on_finding must be a function taking a finding (a dict), not {type(self.on_finding).__name__}"
            )
        check_every(self.every)
        if not all(isinstance(b, bool) for b in (self.updates, self.warn, self.optimizer_signals)):
            raise TypeError("updates, warn and optimizer_signals must be True or False")
        if self.flight_recorder is not None and not isinstance(self.flight_recorder, bool):
            raise TypeError("flight_recorder must be True, False or None (on where the parameters are on a GPU)")
        check_name("run", self.run)
        check_name("project", self.project)
        if self.server is not None:
            ingest_url(self.server)
        if self.token is not None and not isinstance(self.token, str):
            raise TypeError(f"token must be a string, not {type(self.token).__name__}")

    @property
    def server_url(self) -> str:
        """The server to use: `server`, else $GRADWATCH_SERVER (read now), else the default."""
        return server_url(self.server)

    @property
    def token_or_env(self) -> Optional[str]:
        """The server's token: `token`, else $GRADWATCH_TOKEN (read now), else None."""
        return self.token or os.environ.get("GRADWATCH_TOKEN") or None

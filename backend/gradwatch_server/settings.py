"""The server's configuration: one immutable object, built from CLI arguments and an environment.

Nothing here reads ``os.environ`` at import time: callers pass the environment mapping, so a
test builds a `Settings` from a plain dict and no module keeps a stale global.
"""

from __future__ import annotations

import math
import socket
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .notify import check_url

DEFAULT_DB = "sqlite:///./gradwatch.db"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
#: Where the hook sends by default (the hook's own `gradwatch.wire.DEFAULT_SERVER` says the same).
DEFAULT_SERVER = f"http://{DEFAULT_HOST}:{DEFAULT_PORT}"

#: Environment variables read by `Settings.from_env`, by field name.
ENV_VARS = {
    "db_url": "GRADWATCH_DB",
    "host": "GRADWATCH_HOST",
    "port": "GRADWATCH_PORT",
    "token": "GRADWATCH_TOKEN",
    "crash_grace_s": "GRADWATCH_CRASH_GRACE_S",
    "frontend_dir": "GRADWATCH_FRONTEND_DIR",
    "allowed_hosts": "GRADWATCH_ALLOWED_HOSTS",
    "workers": "GRADWATCH_WORKERS",
    "notify": "GRADWATCH_NOTIFY",
    "public_url": "GRADWATCH_PUBLIC_URL",
    "rank_timeout_s": "GRADWATCH_RANK_TIMEOUT_S",
}


#: Shortest `--rank-timeout` (seconds): the timer that looks for lost ranks wakes four times per
#: timeout, so a tinier one would keep it spinning.
MIN_RANK_TIMEOUT_S = 0.1


def check_rank_timeout(value: float) -> float:
    """`--rank-timeout` / GRADWATCH_RANK_TIMEOUT_S: a finite number of seconds, at least
    MIN_RANK_TIMEOUT_S (infinity would wait forever for a rank that is gone)."""
    if not math.isfinite(value) or value < MIN_RANK_TIMEOUT_S:
        raise ValueError(
            f"must be a finite number of seconds of at least {MIN_RANK_TIMEOUT_S}, not {value}; "
            "pass e.g. 30 (the default)"
        )
    return value


def normalize_db_url(value: str) -> str:
    """Accept a bare file path as an SQLite database: ``runs.db`` -> ``sqlite:///runs.db``."""
    value = value.strip()
    if not value:
        raise ValueError("the database URL is empty; pass e.g. sqlite:///./gradwatch.db")
    if "://" in value:
        return value
    return f"sqlite:///{value}"


class Settings(BaseModel):
    """Everything the server can be told; validated once, then read-only."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    db_url: str = DEFAULT_DB
    host: str = DEFAULT_HOST
    port: int = Field(DEFAULT_PORT, ge=0, le=65535)
    token: str | None = None
    #: Seconds a run may stay disconnected (without a `close`) before it is marked crashed.
    crash_grace_s: float = Field(10.0, ge=0)
    #: Seconds a rank of a distributed job may send nothing while another rank is ahead before
    #: it is lost: the job's steps are then assembled without it and marked partial.
    rank_timeout_s: float = 30.0
    #: Largest websocket frame accepted from a hook; bigger ones are closed with 1009.
    max_frame_bytes: int = Field(16 * 1024 * 1024, ge=1024)
    #: Messages queued per browser on /ws/live before that browser is dropped (1013).
    live_queue_size: int = Field(256, ge=1)
    #: Serve the dashboard from this folder instead of the packaged copy (frontend work).
    frontend_dir: Path | None = None
    #: Host names the server answers to (DNS rebinding); None: the loopback names when bound to
    #: loopback, any name otherwise. "*" allows any. Comma-separated in the environment.
    allowed_hosts: tuple[str, ...] | None = None
    #: Worker processes serving one port (`serve --workers N`); more than one needs PostgreSQL,
    #: which carries live updates between them (relay.py).
    workers: int = Field(1, ge=1)
    #: Webhook URLs that get each new error or warning finding (notify.py); comma-separated in
    #: the environment.
    notify: tuple[str, ...] = ()
    #: The dashboard's address as people reach it, for the links in notifications; None: the
    #: address the server binds (this machine's name when it binds every interface).
    public_url: str | None = None

    @field_validator("db_url")
    @classmethod
    def _db_url(cls, value: str) -> str:
        return normalize_db_url(value)

    @field_validator("rank_timeout_s")
    @classmethod
    def _rank_timeout(cls, value: float) -> float:
        return check_rank_timeout(value)

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _hosts(cls, value: object) -> object:
        if isinstance(value, str):
            value = tuple(h.strip() for h in value.split(",") if h.strip())
        if value is not None and not value:
            raise ValueError("name at least one host, or * for any")
        return value

    @field_validator("notify", mode="before")
    @classmethod
    def _notify(cls, value: object) -> object:
        if isinstance(value, str):
            value = [u for u in value.split(",") if u.strip()]
        if isinstance(value, (list, tuple)):
            return tuple(check_url(u) if isinstance(u, str) else u for u in value)
        return value

    @field_validator("public_url")
    @classmethod
    def _public_url(cls, value: str | None) -> str | None:
        return None if not value else check_url(value).rstrip("/")

    def dashboard_url(self) -> str:
        """Where people open the dashboard: `public_url`, else the address the server binds."""
        if self.public_url:
            return self.public_url
        host = socket.gethostname() if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}"

    @field_validator("token")
    @classmethod
    def _token(cls, value: str | None) -> str | None:
        return value or None  # an empty --token or GRADWATCH_TOKEN means "no token"

    @classmethod
    def from_env(cls, env: Mapping[str, str], **overrides: object) -> Settings:
        """Settings from `env` (e.g. ``os.environ``); explicit `overrides` (not None) win."""
        values: dict[str, object] = {
            field: env[var] for field, var in ENV_VARS.items() if env.get(var) not in (None, "")
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls.model_validate(values)

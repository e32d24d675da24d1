"""`watch()`: attach gradwatch to an optimizer through its step hooks."""
from __future__ import annotations

import atexit
import os
import re
import secrets
import time
import weakref
from typing import Any, Mapping, Optional
from urllib.parse import urlsplit, urlunsplit

import torch

from . import __version__, wire
from .layout import Layout, build_layout
from .measure import Probe, Snapshot
from .sender import Sender

DEFAULT_SERVER = "http://127.0.0.1:8765"
_NAME_RE = re.compile(r"^[^\x00-\x1f\x7f]{1,200}$")


def ingest_url(server: str) -> str:
    """The websocket ingest URL of a server URL (http->ws, https->wss); ValueError if unusable."""
    if not isinstance(server, str):
        raise TypeError(f"server must be a URL string like {DEFAULT_SERVER!r}, not {type(server).__name__}")
    parts = urlsplit(server.strip())
    scheme = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}.get(parts.scheme)
    if scheme is None or not parts.hostname:
        raise ValueError(f"server must be an http(s):// or ws(s):// URL with a host, like {DEFAULT_SERVER!r}; got {server!r}")
    try:
        parts.port  # noqa: B018  (raises ValueError on a bad port)
    except ValueError as exc:
        raise ValueError(f"server URL {server!r} has an invalid port") from exc
    path = parts.path.rstrip("/") + "/ws/ingest"
    return urlunsplit((scheme, parts.netloc, path, "", ""))


def _check_name(kind: str, value: Optional[str]) -> None:
    if value is None:
        return
    if not isinstance(value, str):
        raise TypeError(f"{kind} must be a string, not {type(value).__name__}")
    if not _NAME_RE.match(value):
        raise ValueError(f"{kind} must be 1 to 200 printable characters; got {value!r}")


class Watcher:
    """Measures an optimizer at every sampled step and streams it to a gradwatch server.

    Use `gradwatch.watch(...)` to make one. `log()` adds user scalars (loss, accuracy) to the
    next step; `close()` (also run by `with` and at interpreter exit) sends what is pending,
    waiting a few seconds at most.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, *, model: Optional[torch.nn.Module] = None,
                 run: Optional[str] = None, project: Optional[str] = None, server: Optional[str] = None,
                 every: int = 1, scaler: Any = None, token: Optional[str] = None) -> None:
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"watch() needs a torch.optim.Optimizer as its first argument, not {type(optimizer).__name__}")
        if model is not None and not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module (used to name parameters), not {type(model).__name__}")
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be a whole number >= 1 (sample every N-th optimizer step); got {every!r}")
        if scaler is not None and not (hasattr(scaler, "_per_optimizer_states") and hasattr(scaler, "is_enabled")):
            raise TypeError(f"scaler must be a torch.amp.GradScaler, not {type(scaler).__name__}")
        _check_name("run", run)
        _check_name("project", project)
        server = server or os.environ.get("GRADWATCH_SERVER") or DEFAULT_SERVER
        url = ingest_url(server)
        if token is not None and not isinstance(token, str):
            raise TypeError("token must be a string")
        token = token or os.environ.get("GRADWATCH_TOKEN") or None

        self.run_id: str = secrets.token_hex(6)
        self.server = server
        self.every = every
        self.step = 0  # optimizer.step() calls so far
        self.layout: Layout = build_layout([optimizer], model)
        if not self.layout.params:
            raise ValueError("the optimizer has no parameters to watch")
        self._probe = Probe(self.layout, scaler=scaler)
        self._logged: dict[str, Any] = {}
        self._closed = False
        hello = wire.hello(
            run={"id": self.run_id, "name": run or time.strftime("run-%Y%m%d-%H%M%S"), "project": project or "default",
                 "started_at": time.time(), "hook_version": __version__, "optimizer": type(optimizer).__name__,
                 "config": {"every": every, "amp": scaler is not None, "unoptimized_params": self.layout.unoptimized}},
            params=self.layout.hello_params(), groups=self.layout.hello_groups())
        self._sender = Sender(url, hello, token=token)
        self._handles = [optimizer.register_step_pre_hook(self._before_step),
                         optimizer.register_step_post_hook(self._after_step)]
        self_ref = weakref.ref(self)
        atexit.register(lambda: (w := self_ref()) is not None and w.close())

    # -- hooks (training thread) -----------------------------------------------------------
    def _before_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self.step += 1
        if (self.step - 1) % self.every == 0:
            self._probe.before_step(self.step)

    def _after_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        logged, self._logged = self._logged, {}
        snapshot = self._probe.after_step(logged)
        if snapshot is not None:
            self._sender.submit(lambda seq, s=snapshot: self._render(seq, s))

    # -- public ----------------------------------------------------------------------------
    def log(self, metrics: Optional[Mapping[str, Any]] = None, **kwargs: Any) -> None:
        """Record user scalars (``w.log(loss=loss)``) with the next optimizer step.

        Values may be numbers or one-element tensors; a CUDA tensor is not read now (that would
        synchronise) but copied with the step's measurements.
        """
        items = dict(metrics or {}, **kwargs)
        for key, value in items.items():
            if not isinstance(key, str) or not re.match(r"^[A-Za-z0-9_.:-][A-Za-z0-9_./:-]{0,127}$", key):
                raise ValueError(f"metric names are 1-128 characters of letters, digits and _ . / : -; got {key!r}")
            if isinstance(value, torch.Tensor):
                if value.numel() != 1:
                    raise ValueError(f"{key}: a logged tensor must have one element, not shape {tuple(value.shape)}")
                value = value.detach()
            elif isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"{key}: logged values must be numbers or one-element tensors, not {type(value).__name__}")
            self._logged[key] = value

    def close(self, timeout: float = 5.0) -> None:
        """Detach the hooks and deliver what is pending, waiting at most `timeout` seconds."""
        if self._closed:
            return
        self._closed = True
        for handle in self._handles:
            handle.remove()
        self._sender.close("finished", timeout=timeout)

    @property
    def pending(self) -> int:
        """Messages the server has not acknowledged yet."""
        return self._sender.pending

    def __enter__(self) -> "Watcher":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- sender thread ---------------------------------------------------------------------
    def _render(self, seq: int, snapshot: Snapshot) -> dict[str, Any]:
        metrics, status, scalars = snapshot.resolve()
        self._probe.recycle(snapshot)
        rss = _rss_bytes()
        if rss is not None:
            scalars["mem/rss_bytes"] = rss
        return wire.step(seq, snapshot.step, snapshot.time, scalars, metrics, status)


def _rss_bytes() -> Optional[float]:
    try:
        with open("/proc/self/statm", "rb") as f:
            return float(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, IndexError):
        return None


def watch(optimizer: torch.optim.Optimizer, *, model: Optional[torch.nn.Module] = None,
          run: Optional[str] = None, project: Optional[str] = None, server: Optional[str] = None,
          every: int = 1, scaler: Any = None, token: Optional[str] = None) -> Watcher:
    """Watch `optimizer`; see `Watcher`. Raises TypeError/ValueError on bad arguments."""
    return Watcher(optimizer, model=model, run=run, project=project, server=server,
                   every=every, scaler=scaler, token=token)


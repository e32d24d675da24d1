"""`watch()`: attach gradwatch to an optimizer through its step hooks."""
from __future__ import annotations

import atexit
import logging
import os
import re
import secrets
import threading
import time
import weakref
from typing import Any, Mapping, Optional, Union

import torch

from . import __version__, wire
from .wire import DEFAULT_SERVER, ingest_url
from .accumulation import GradTracker
from .findings import FindingWarner, run_page
from .layout import Layout, build_layout
from .measure import Probe, Snapshot
from .sampling import make_sampler
from .sender import Sender
from .spool import SpoolWriter, pending_spools, replay, spool_dir

log = logging.getLogger("gradwatch")
_NAME_RE = re.compile(r"^[^\x00-\x1f\x7f]{1,200}$")


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
                 every: Union[int, str] = 1, scaler: Any = None, token: Optional[str] = None,
                 updates: bool = False, warn: bool = True) -> None:
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"watch() needs a torch.optim.Optimizer as its first argument, not {type(optimizer).__name__}")
        if model is not None and not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module (used to name parameters), not {type(model).__name__}")
        self._sampler = make_sampler(every)
        if not isinstance(updates, bool) or not isinstance(warn, bool):
            raise TypeError("updates and warn must be True or False")
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
        self.warn = warn
        self._probe = Probe(self.layout, scaler=scaler, updates=updates)
        self._tracker = GradTracker(self._probe.params)
        self._logged: dict[str, Any] = {}
        self._closed = False
        self._sampled = False
        self._last_step_start: Optional[float] = None
        self._step_time = 0.0
        self._scaler = scaler
        self._skipped = 0  # optimizer steps a GradScaler skipped (they never reach our hooks)
        self._stepped = False
        hello = wire.hello(
            run={"id": self.run_id, "name": run or time.strftime("run-%Y%m%d-%H%M%S"), "project": project or "default",
                 "started_at": time.time(), "hook_version": __version__, "optimizer": type(optimizer).__name__,
                 "config": {"every": every, "amp": scaler is not None, "updates": updates,
                            "unoptimized_params": self.layout.unoptimized, "frozen_params": self.layout.frozen}},
            params=self.layout.hello_params(), groups=self.layout.hello_groups())
        self._sender = Sender(url, hello, token=token, spool=_open_spool(self.run_id, hello))
        _replay_in_background(url, token)
        self._sender.on_finding = FindingWarner(warn, run_page(server, self.run_id))
        self._handles = [optimizer.register_step_pre_hook(self._before_step),
                         optimizer.register_step_post_hook(self._after_step)]
        if scaler is not None:
            self._wrap_scaler(scaler, optimizer)
        self_ref = weakref.ref(self)
        atexit.register(lambda: (w := self_ref()) is not None and w.close())

    # -- hooks (training thread) -----------------------------------------------------------
    def _before_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self.step += 1
        self._stepped = True
        now = time.perf_counter()
        if self._last_step_start is not None:
            self._step_time = now - self._last_step_start
        self._last_step_start = now
        self._sampled = self._sampler(self.step)
        if self._sampled:
            self._probe.before_step(self.step)

    def _after_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        passes, clear = self._tracker.end_step()  # every step: it marks where the next one starts
        if not self._sampled:
            return
        logged, self._logged = self._logged, {}
        if self._scaler is not None:
            logged.setdefault("amp/skipped_steps", self._skipped)
            if getattr(self._scaler, "_scale", None) is not None:
                logged.setdefault("amp/scale", self._scaler._scale)
        logged["backward_passes"] = float(passes.max()) if passes.size else 0.0
        snapshot = self._probe.after_step(logged, {"backward_passes": passes, "grad_clear": clear})
        if snapshot is not None:
            step_time = self._step_time
            self._sender.submit(lambda seq, s=snapshot: self._render(seq, s, step_time))

    def _wrap_scaler(self, scaler: Any, optimizer: torch.optim.Optimizer) -> None:
        """See the steps GradScaler skips: they never call `optimizer.step()`, so no hook fires."""
        original = scaler.step

        def step(opt: Any, *args: Any, **kwargs: Any) -> Any:
            if opt is not optimizer or self._closed:
                return original(opt, *args, **kwargs)
            self._stepped = False
            out = original(opt, *args, **kwargs)
            if not self._stepped:
                self._skipped += 1
                self._tracker.end_step()
            return out

        scaler.step = step
        self._unwrap = lambda: scaler.__dict__.pop("step", None) if scaler.__dict__.get("step") is step else None

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
        self._tracker.remove()
        if self._scaler is not None:
            self._unwrap()
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
    def _render(self, seq: int, snapshot: Snapshot, step_time: float) -> dict[str, Any]:
        started = time.thread_time()
        metrics, status, scalars = snapshot.resolve()
        self._probe.recycle(snapshot)
        rss = _rss_bytes()
        if rss is not None:
            scalars["mem/rss_bytes"] = rss
        message = wire.step(seq, snapshot.step, snapshot.time, scalars, metrics, status)
        self._sampler.observe(snapshot.cost_s + time.thread_time() - started, step_time)
        return message


def _open_spool(run_id: str, hello: dict[str, Any]) -> Optional[SpoolWriter]:
    directory = spool_dir()
    try:
        return SpoolWriter(directory, run_id, wire.dumps(hello))
    except OSError as exc:
        log.warning("gradwatch: no spool in %s (%s): unsent data will live in memory only; "
                    "set GRADWATCH_SPOOL to a writable folder", directory, exc)
        return None


def _replay_in_background(ws_url: str, token: Optional[str]) -> None:
    """Deliver what earlier runs left in the spool (a server that was down, a killed process).

    Everything, the listing included, happens on a daemon thread: nothing here can raise into
    watch() or delay it.
    """

    def replay_all() -> None:
        try:
            files = pending_spools(spool_dir())
        except OSError as exc:
            log.debug("gradwatch: cannot list the spool: %s", exc)
            return
        for path in files:
            try:
                sent, _ = replay(path, ws_url, token)
                log.info("gradwatch: replayed %d spooled messages of run %s", sent, path.stem)
            except Exception as exc:  # server still away: the file waits for the next chance
                log.debug("gradwatch: could not replay %s: %s", path, exc)

    threading.Thread(target=replay_all, name="gradwatch-replay", daemon=True).start()


def _rss_bytes() -> Optional[float]:
    try:
        with open("/proc/self/statm", "rb") as f:
            return float(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, IndexError):
        return None


def watch(optimizer: torch.optim.Optimizer, *, model: Optional[torch.nn.Module] = None,
          run: Optional[str] = None, project: Optional[str] = None, server: Optional[str] = None,
          every: Union[int, str] = 1, scaler: Any = None, token: Optional[str] = None,
          updates: bool = False, warn: bool = True) -> Watcher:
    """Watch `optimizer`; see `Watcher`. Raises TypeError/ValueError on bad arguments.

    every: measure every N-th `optimizer.step()`, or "auto" to keep the hook's cost within 1% of
        the step time. updates: also measure `update_norm`/`update_ratio` (holds one copy of the
        parameters during sampled steps). warn: show each diagnostic once as a Python warning.
    """
    return Watcher(optimizer, model=model, run=run, project=project, server=server, every=every,
                   scaler=scaler, token=token, updates=updates, warn=warn)


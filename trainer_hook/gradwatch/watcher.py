"""`watch()` and the `Watcher`: a watched run's handle (the training thread's side of it: rounds.py)."""

from __future__ import annotations

import atexit
import html
import ipaddress
import logging
import secrets
import sys
import threading
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Callable, Optional, Union
from urllib.parse import urlsplit

import torch

from . import __version__, autowatch, distributed, wire
from .amp import AmpScaler, check_scaler
from .context import context_config, user_config
from .findings import FindingWarner, run_page
from .layout import Layout, build_layout
from .measure import Probe
from .options import METRIC_NAME, WatchOptions, ingest_url
from .recorder import FlightRecorder
from .replay import Rejected, replay
from .rounds import Rounds
from .sampling import CostMeter, make_sampler
from .sender import FINDING_LINGER_S, MAX_LINGER_S, Sender
from .spool import SpoolWriter, pending_spools, spool_dir
from .states import shards_state
from .unwrap import find_scaler, qualified_name, unwrap

log = logging.getLogger("gradwatch")


class Watcher:
    """Measures an optimizer at every sampled step and streams it to a gradwatch server.

    Use `gradwatch.watch(...)` to make one. The watcher is the run's handle: it makes the run's
    parts (layout, probe, sender, sampler) and hands the training thread's side to its `Rounds`
    (rounds.py). `log()` adds user scalars (loss, accuracy) to the next step; `close()` (also run
    by `with` and at interpreter exit) sends what is pending, waiting a few seconds at most.
    """

    def __init__(
        self,
        optimizer: Union[torch.optim.Optimizer, Sequence[torch.optim.Optimizer]],
        options: WatchOptions,
        *,
        model: Union[torch.nn.Module, Iterable[tuple[str, torch.Tensor]], None] = None,
        scaler: Any = None,
        config: Optional[Mapping[str, Any]] = None,
    ) -> None:
        optimizers, wrappers = _optimizers(optimizer)
        if scaler is None:  # accelerate's AcceleratedOptimizer steps with its own GradScaler
            scaler = next((s for s in map(find_scaler, wrappers) if s is not None), None)
        user = user_config(config)
        run, project, every = options.run, options.project, options.every
        updates, warn, optimizer_signals = options.updates, options.warn, options.optimizer_signals
        on_finding, flight_recorder = options.on_finding, options.flight_recorder
        self._sampler = make_sampler(every)
        if scaler is not None:
            check_scaler(scaler)  # before anything else is made
        server = options.server_url
        url = ingest_url(server)  # $GRADWATCH_SERVER is checked here, where it is read
        token = options.token_or_env

        self.project: str = project or "default"
        self.server = server
        self.every = every
        named = run or time.strftime("run-%Y%m%d-%H%M%S")
        #: this rank's place in a distributed job (None: a run of one process); the job is the run.
        #: Agreed with the other ranks before anything that differs between ranks can raise.
        self.dist: Optional[distributed.Rank] = distributed.join(named)
        if self.dist is not None:  # the ranks measure the same steps
            self._sampler.align()
        #: a default name is rank 0's on every rank of a job
        self.name: str = run or (self.dist.name if self.dist is not None and self.dist.name else named)
        #: the run's id on the server: the job's in a distributed job (each rank streams as `dist.stream_id`)
        self.run_id: str = secrets.token_hex(6) if self.dist is None else self.dist.job
        self.layout: Layout = build_layout(optimizers, model, rank=None if self.dist is None else self.dist.rank)
        if not self.layout.params:
            raise ValueError("the optimizer has no parameters to watch")
        self.warn = warn
        self._amp = None if scaler is None else AmpScaler(scaler)
        self._probe = Probe(self.layout, amp=self._amp, updates=updates, signals=optimizer_signals)
        if (
            flight_recorder is None
        ):  # on a GPU its norms run beside the step; on CPU they are a pass over every gradient
            flight_recorder = any(p.device.type == "cuda" for p in self._probe.params)
        self._closed = False
        hello = wire.hello(
            run={
                "id": self.run_id if self.dist is None else self.dist.stream_id,
                "name": self.name,
                "project": self.project,
                "started_at": time.time(),
                "hook_version": __version__,
                "optimizer": "+".join(type(o).__name__ for o in optimizers),
                "config": {
                    "every": every,
                    "amp": scaler is not None,
                    "updates": updates,
                    "optimizer_signals": optimizer_signals,
                    "flight_recorder": flight_recorder and every != 1,
                    "optimizers": [type(o).__name__ for o in optimizers],
                    "unoptimized_params": self.layout.unoptimized,
                    "frozen_params": self.layout.frozen,
                    **_wrapper_config(wrappers),
                    **context_config(self.layout, model, user),
                    **({} if self.dist is None else {"dist": self.dist.config(self._probe.params)}),
                },
            },
            params=self.layout.hello_params(),
            groups=self.layout.hello_groups(),
            dist=None if self.dist is None else self.dist.hello(),
        )
        self._sender = Sender(
            url,
            hello,
            token=token,
            spool=_open_spool(hello["run"]["id"], hello),
            # a callback acts on findings: they must reach it within a second of their step
            max_linger=MAX_LINGER_S if on_finding is None else FINDING_LINGER_S,
            # a replica that owns optimizer state (ZeroRedundancyOptimizer) sends its state norms
            replica_state=any(shards_state(o) for o in optimizers),
        )
        # a server on this machine: its CPU per step is part of what watching costs
        self._cost = CostMeter(self._sampler, _on_this_machine(url), lambda: self._sender.server_cpu_per_step)
        _replay_in_background(url, token)
        # A job's findings are one set: rank 0 shows them, as training scripts print on rank 0 only.
        shows = warn and (self.dist is None or self.dist.rank == 0)
        self._findings = FindingWarner(shows, self.url, callback=on_finding)
        self._sender.on_finding = self._findings
        autowatch.claim(optimizers)  # under gradwatch-run: watched once, by this watch()
        #: every=N (N > 1) or "auto": recent steps' gradient norms kept on the device (recorder.py)
        self._recorder: Optional[FlightRecorder] = (
            None
            if every == 1 or not flight_recorder
            else FlightRecorder(self._probe.params, [v is None for v in self._probe.views], self._probe.inverse_scale)
        )
        #: the optimizers' hooks and the round they are in (rounds.py): the training thread's side
        self._rounds = Rounds(
            self.layout,
            probe=self._probe,
            sampler=self._sampler,
            amp=self._amp,
            sender=self._sender,
            cost=self._cost,
            recorder=self._recorder,
            dist=self.dist,
            run_id=self.run_id,
            owner=self,
        )
        self_ref = weakref.ref(self)

        def close_at_exit() -> None:
            w = self_ref()
            if w is not None:
                w.close(status="crashed" if _died_of_an_exception else "finished")

        _note_uncaught_exceptions()
        atexit.register(close_at_exit)

    # -- public ----------------------------------------------------------------------------
    def log(self, metrics: Optional[Mapping[str, Any]] = None, **kwargs: Any) -> None:
        """Record user scalars (``w.log(loss=loss)``) with the next optimizer step.

        Values may be numbers or one-element tensors; a CUDA tensor is not read now (that would
        synchronise) but copied with the step's measurements.
        """
        items = dict(metrics or {}, **kwargs)
        for key, value in items.items():
            if not isinstance(key, str) or not METRIC_NAME.match(key):
                raise ValueError(f"metric names are 1-128 characters of letters, digits and _ . / : -; got {key!r}")
            if isinstance(value, torch.Tensor):
                if value.numel() != 1:
                    raise ValueError(f"{key}: a logged tensor must have one element, not shape {tuple(value.shape)}")
                value = value.detach()
            elif isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(
                    f"{key}: logged values must be numbers or one-element tensors, not {type(value).__name__}"
                )
            self._rounds.logged[key] = value

    def close(self, timeout: float = 5.0, status: str = "finished") -> None:
        """Detach the hooks and deliver what is pending, waiting at most `timeout` seconds (the
        on_finding callbacks of findings already received included).

        `status` is how the run ended, "finished" or "crashed" (a training that raised): the
        server records it with the run. Called inside the on_finding callback, it only asks to
        stop watching: the training thread stops at its next step, and the script's own `close()`
        (or the one at exit) delivers."""
        if status not in ("finished", "crashed"):
            raise ValueError(f'status must be "finished" or "crashed", not {status!r}')
        callbacks = self._findings.callbacks
        if callbacks is not None and callbacks.is_current():
            self._rounds.request_stop()
            return
        if self._closed:
            return
        deadline = time.monotonic() + timeout
        self._closed = True
        self._rounds.finish()
        self._sender.close(status, timeout=timeout)
        if callbacks is not None:
            callbacks.wait(deadline - time.monotonic())

    @property
    def step(self) -> int:
        """`optimizer.step()` calls so far (rounds, with several optimizers: see `watch`)."""
        return self._rounds.step

    @property
    def measured_steps(self) -> int:
        """Of those, the steps measured in full (every="auto": how often it measures)."""
        return self._rounds.measured_steps

    @property
    def url(self) -> str:
        """The run's page on the dashboard."""
        return run_page(self.server, self.run_id)

    def _repr_html_(self) -> str:
        """In Jupyter, a watcher shows as a link to its run's page."""
        url = html.escape(self.url, quote=True)
        rank = "" if self.dist is None else f", rank {self.dist.rank} of {self.dist.world_size}"
        return (
            f'<a href="{url}" target="_blank" rel="noopener">gradwatch run {html.escape(self.name)}</a> '
            f"<span>({html.escape(self.project)}, id {self.run_id}{rank}, step {self.step})</span>"
        )

    def show(self, height: int = 800) -> Any:
        """The live run page, embedded in a notebook: an `IPython.display.IFrame` (display it, or
        let it be a cell's last value). `height` in pixels."""
        if isinstance(height, bool) or not isinstance(height, int) or not 100 <= height <= 10000:
            raise ValueError(f"height must be a whole number of pixels from 100 to 10000; got {height!r}")
        try:
            from IPython.display import IFrame
        except ImportError as exc:
            raise ImportError(
                "Watcher.show() embeds the run page in a Jupyter notebook and needs IPython "
                f"(pip install ipython); outside a notebook open {self.url}"
            ) from exc
        return IFrame(self.url, width="100%", height=height)

    @property
    def pending(self) -> int:
        """Messages the server has not acknowledged yet (and steps the flight recorder holds)."""
        return self._sender.pending + (0 if self._recorder is None else len(self._recorder.held))

    def __enter__(self) -> Watcher:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _open_spool(run_id: str, hello: dict[str, Any]) -> Optional[SpoolWriter]:
    directory = spool_dir()
    try:
        return SpoolWriter(directory, run_id, wire.dumps(hello))
    except OSError as exc:
        log.warning(
            "gradwatch: no spool in %s (%s): unsent data will live in memory only; "
            "set GRADWATCH_SPOOL to a writable folder",
            directory,
            exc,
        )
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
                done = replay(path, ws_url, token)
                if done.claimed:
                    log.info("gradwatch: replayed %d spooled messages of run %s", done.sent, path.stem)
            except Rejected as exc:  # moved aside: never sent again, so say it once
                log.warning("gradwatch: spooled run %s not replayed: %s", path.stem, exc)
            except Exception as exc:  # server still away: the file waits for the next chance
                log.debug("gradwatch: could not replay %s: %s", path, exc)

    threading.Thread(target=replay_all, name="gradwatch-replay", daemon=True).start()


def _on_this_machine(url: str) -> bool:
    """Whether the server is reached over loopback (`gradwatch serve` beside the training)."""
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback or address.is_unspecified


#: an uncaught exception is ending the interpreter: the runs closed at exit crashed
_died_of_an_exception = False


def _note_uncaught_exceptions() -> None:
    """Chain `sys.excepthook` once, so that a script that dies of an exception (Ctrl-C
    included) closes its runs as "crashed": Python calls the hook before the atexit hooks that
    close them. Notebooks do not use the hook, so a failed cell ends nothing."""
    previous = sys.excepthook
    if getattr(previous, "_gradwatch", False):
        return

    def note(kind: type[BaseException], value: BaseException, tb: Optional[TracebackType]) -> None:
        global _died_of_an_exception
        _died_of_an_exception = True
        previous(kind, value, tb)

    note._gradwatch = True  # type: ignore[attr-defined]
    sys.excepthook = note


def _optimizers(optimizer: Any) -> tuple[list[torch.optim.Optimizer], list[list[Any]]]:
    """One optimizer or a non-empty list/tuple of distinct ones, each unwrapped to the torch
    optimizer that steps (unwrap.py), with the wrappers around each; TypeError/ValueError otherwise."""
    many = list(optimizer) if isinstance(optimizer, (list, tuple)) else [optimizer]
    if not many:
        raise ValueError("watch() got an empty list of optimizers")
    unwrapped = [unwrap(opt) for opt in many]
    optimizers = [inner for inner, _ in unwrapped]
    if len({id(o) for o in optimizers}) != len(optimizers):
        raise ValueError("watch() got the same optimizer twice")
    return optimizers, [wrappers for _, wrappers in unwrapped]


def _wrapper_config(wrappers: list[list[Any]]) -> dict[str, Any]:
    """`wrappers` for the run's config: per optimizer, the classes unwrapped (outermost first);
    nothing when no optimizer was wrapped."""
    if not any(wrappers):
        return {}
    return {"wrappers": [[qualified_name(w) for w in ws] for ws in wrappers]}


def watch(
    optimizer: Union[torch.optim.Optimizer, Sequence[torch.optim.Optimizer]],
    *,
    model: Union[torch.nn.Module, Iterable[tuple[str, torch.Tensor]], None] = None,
    run: Optional[str] = None,
    project: Optional[str] = None,
    server: Optional[str] = None,
    every: Union[int, str] = 1,
    scaler: Any = None,
    token: Optional[str] = None,
    updates: bool = False,
    warn: bool = True,
    config: Optional[Mapping[str, Any]] = None,
    on_finding: Optional[Callable[[dict[str, Any]], Any]] = None,
    optimizer_signals: bool = False,
    flight_recorder: Optional[bool] = None,
) -> Watcher:
    """Watch `optimizer` (or a list of optimizers); see `Watcher`. Raises TypeError/ValueError on bad arguments.

    Several optimizers (`watch([opt_d, opt_g], ...)`) make one run: a step is a round in which
    every optimizer stepped at least once, and `opt/K/steps` counts each one's own steps.
    Steps that are not sampled still send their cheap facts (learning rates, backward passes, AMP
    scale, CUDA memory counters): no device work, and nothing per parameter. Per-parameter
    backward passes and how each `.grad` was cleared are exact on every measured step.

    every: measure every N-th `optimizer.step()`, or "auto" to keep all that watching costs within
        0.4% of the step time (measured steps spread over the interval, every step's hooks, the
        hook's threads, and a server on this machine: its acks say its CPU).
        A step that is not measured does no work per tensor: a few tens of µs where the hook's
        code stays in the CPU caches, more where each step's tensors evict it (docs/benchmarks.md).
    updates: also measure `update_norm`/`update_ratio` (holds one copy of the
        parameters during sampled steps).
    warn: show each diagnostic once as a Python warning.
    config: the user's own mapping (hyperparameters...), recorded with the run (its config's `user`),
        beside the context the hook records (optimizer, versions, host, command line, git commit:
        gradwatch/context.py).
    on_finding: called with each new diagnostic (a dict: code, severity, message, params,
        first_step, page), on a gradwatch thread of its own, never inside a step nor on the sender
        thread (a slow callback delays no step's delivery); what it raises is logged. `close()`
        inside it stops the watching; the script's `close()` delivers.
    optimizer_signals: also measure, at measured steps, Adam's epsilon-regime share and
        second-moment decoupling and the momentum-gradient cosine per parameter (gradwatch/signals.py;
        passes over the optimizer state: docs/diagnostics.md). The total norm a loop's
        `torch.nn.utils.clip_grad_norm_` returns is recorded every step in any case (`clip/total_norm`).
    flight_recorder: with every=N (N > 1) or "auto", keep the recent steps' gradient norms on the
        device (a fused norm per unmeasured step, no host copy) and send the steps around an
        incident between measured steps at full resolution (gradwatch/recorder.py). None (the
        default): on where the parameters are on a GPU, where those norms run beside the step;
        off on CPU, where they are a pass over every gradient on the training thread.
    """
    options = WatchOptions(
        run=run,
        project=project,
        server=server,
        every=every,
        token=token,
        updates=updates,
        warn=warn,
        on_finding=on_finding,
        optimizer_signals=optimizer_signals,
        flight_recorder=flight_recorder,
    )
    return Watcher(optimizer, options, model=model, scaler=scaler, config=config)

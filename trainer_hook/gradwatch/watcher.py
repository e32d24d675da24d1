"""`watch()`: attach gradwatch to an optimizer through its step hooks."""

from __future__ import annotations

import atexit
import functools
import html
import ipaddress
import logging
import os
import secrets
import sys
import threading
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Callable, Optional, Union
from urllib.parse import urlsplit

import numpy as np
import torch

from . import __version__, autowatch, distributed, wire
from .accumulation import GradTracker
from .amp import AmpScaler, check_scaler
from .clipping import KEY as CLIP_KEY
from .clipping import ClipNorms
from .closures import CountedClosure, step_closure, with_closure
from .context import context_config, user_config
from .findings import FindingWarner, run_page
from .layout import Layout, build_layout
from .measure import Probe, Snapshot
from .options import METRIC_NAME, WatchOptions, ingest_url
from .recorder import FlightRecorder
from .replay import Rejected, replay
from .sampling import CostMeter, make_sampler
from .sender import FINDING_LINGER_S, MAX_LINGER_S, Sender
from .spool import SpoolWriter, pending_spools, spool_dir
from .unwrap import find_scaler, qualified_name, unwrap

log = logging.getLogger("gradwatch")


class Watcher:
    """Measures an optimizer at every sampled step and streams it to a gradwatch server.

    Use `gradwatch.watch(...)` to make one. `log()` adds user scalars (loss, accuracy) to the
    next step; `close()` (also run by `with` and at interpreter exit) sends what is pending,
    waiting a few seconds at most.
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
        self.step = 0  # optimizer.step() calls so far (rounds, with several optimizers: see `watch`)
        self.measured_steps = 0  # of those, the ones measured in full (every="auto": how often it measures)
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
        self._memory: dict[str, float] = {}  # CUDA allocator counters read as the current round began
        if (
            flight_recorder is None
        ):  # on a GPU its norms run beside the step; on CPU they are a pass over every gradient
            flight_recorder = any(p.device.type == "cuda" for p in self._probe.params)
        self._tracker = GradTracker(
            [w.shard.accumulated for w in self.layout.params],
            on_node=all(w.view is None and w.shard.accumulates is None for w in self.layout.params),
        )
        #: parameter indices of each optimizer; None stands for all (one optimizer)
        self._members: list[Optional[list[int]]] = (
            [None]
            if len(optimizers) == 1
            else [[i for i, w in enumerate(self.layout.params) if w.optimizer == k] for k in range(len(optimizers))]
        )
        # Per-parameter gradient hooks cost every backward pass, so they are armed only for the
        # steps that are measured (from the previous step of each optimizer, where their counts
        # start); the other steps hook one sentinel parameter per optimizer (docs/design.md).
        #: per optimizer, the parameter whose hook stays armed (None: none can be hooked)
        self._sentinels: list[Optional[int]] = [self._first_sentinel(k) for k in range(len(optimizers))]
        self._upcoming = self._sampler(1)  # whether the next round is measured (decided a round ahead)
        self._armed = [self._upcoming] * len(optimizers)  # per optimizer: all its parameters hooked
        self._switch_s = 0.0  # training-thread seconds spent arming and disarming since the last measured step
        if self._upcoming:
            self._tracker.arm()
        else:
            self._tracker.arm(self._sentinel_list())
        self._round: dict[int, int] = {}  # optimizer -> its steps in the open round
        self._opt_steps = [0] * len(optimizers)
        n = len(self.layout.params)
        self._passes: list[int] = [0] * n  # per parameter, as its optimizer's last step left them
        self._clear: list[Optional[float]] = [None] * n
        self._closures: dict[int, CountedClosure] = {}  # optimizer -> the closure of its step in flight
        self._taken: dict[int, tuple[list[int], list[Optional[float]]]] = {}  # passes up to its first evaluation
        self._closure_calls: Optional[int] = None  # closure evaluations in the open round; None: no closure
        self._logged: dict[str, Any] = {}
        self._closed = False
        self._close_requested = False  # by close() inside the on_finding callback
        self._sampled = False
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
        )
        # a server on this machine: its CPU per step is part of what watching costs
        self._cost = CostMeter(self._sampler, _on_this_machine(url), lambda: self._sender.server_cpu_per_step)
        _replay_in_background(url, token)
        # A job's findings are one set: rank 0 shows them, as training scripts print on rank 0 only.
        shows = warn and (self.dist is None or self.dist.rank == 0)
        self._findings = FindingWarner(shows, self.url, callback=on_finding)
        self._sender.on_finding = self._findings
        self._step_began = time.perf_counter()  # where the first step's `time/step_s` starts
        autowatch.claim(optimizers)  # under gradwatch-run: watched once, by this watch()
        self._clip = ClipNorms().open()  # the total norm the loop's clip_grad_norm_ returns
        #: every=N (N > 1) or "auto": recent steps' gradient norms kept on the device (recorder.py)
        self._recorder: Optional[FlightRecorder] = (
            None
            if every == 1 or not flight_recorder
            else FlightRecorder(self._probe.params, [v is None for v in self._probe.views], self._probe.inverse_scale)
        )
        self._handles = []
        for k, opt in enumerate(optimizers):
            self._handles += [
                opt.register_step_pre_hook(functools.partial(self._before_step, k)),
                opt.register_step_post_hook(functools.partial(self._after_step, k)),
            ]
        if self._amp is not None:
            self._amp.watch_steps(optimizers, self._skipped_step)
        self_ref = weakref.ref(self)

        def close_at_exit() -> None:
            w = self_ref()
            if w is not None:
                w.close(status="crashed" if _died_of_an_exception else "finished")

        _note_uncaught_exceptions()
        atexit.register(close_at_exit)

    # -- hooks (training thread) -----------------------------------------------------------
    # With several optimizers a step is a round: it opens with the first `optimizer.step()`
    # after the previous round and closes when every optimizer has stepped at least once (a GAN's
    # D then G step; a critic stepped 5 times per generator step). Each optimizer is measured at
    # its first step of a sampled round: its gradients just before, its state just after.
    def _before_step(self, k: int, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> Any:
        try:
            if self._close_requested:
                self._stop_watching()
                return None
            if self._amp is not None:
                self._amp.stepped(optimizer)
            if not self._round:
                self.step += 1
                self._memory = self._probe.cuda_memory()
                self._cost.begin_step(previous_measured=self._sampled)
                self._sampled, self._upcoming = self._upcoming, self._sampler(self.step + 1)
                if self._sampled:
                    self.measured_steps += 1
                    self._probe.begin(self.step)
            first = k not in self._round
            self._taken.pop(k, None)
            closure = step_closure(args, kwargs)
            if closure is not None:  # this step's gradients come from its closure: read them there
                counted = self._closures[k] = CountedClosure(functools.partial(self._closure_returned, k, first))
                return with_closure(args, kwargs, counted.wrap(closure))
            if self._sampled and first:
                self._read_grads(k)
            elif not self._sampled and not self._round and self._recorder is not None:
                self._recorder.record(self.step)  # one call per unmeasured step: device work only
        except Exception as exc:
            self._give_up(exc)
        return None

    def _closure_returned(self, k: int, first: bool) -> None:
        """The first evaluation of optimizer `k`'s closure returned: its gradients are the step's
        (see closures.py); the backward passes so far are the step's, those after it no step's."""
        try:
            if not self._handles:  # stopped watching meanwhile
                return
            if self._sampled and first:
                self._read_grads(k)
            self._taken[k] = self._tracker.end_step(self._hooked(k))
        except Exception as exc:
            self._give_up(exc)

    def _read_grads(self, k: int) -> None:
        self._probe.read_grads(self._members[k], k if len(self._members) > 1 else None)

    def _after_step(self, k: int, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        try:
            started = time.perf_counter()
            first = k not in self._round
            self._round[k] = self._round.get(k, 0) + 1
            self._opt_steps[k] += 1
            counted = self._closures.pop(k, None)
            if counted is not None:
                self._closure_calls = (self._closure_calls or 0) + counted.calls
                if counted.calls == 0 and self._sampled and first:  # the optimizer ignored its closure
                    self._read_grads(k)
            # every step: it marks where the next one starts (a closure evaluated once already did)
            self._end_passes(k, keep=first, taken=self._taken.pop(k, None), again=counted is None or counted.calls != 1)
            switched = self._switch_s
            if self._upcoming and not self._armed[k]:  # the next round is measured: count from here
                self._arm(k)
            if self._sampled and first:
                self._probe.read_state(self._members[k])
            if len(self._round) == len(self._members):
                self._emit(started)
                # what the round taught the sampler (every="auto") may change its mind about the next
                self._upcoming = self._sampler.revise(self.step + 1, self._upcoming)
                if self._upcoming:
                    for j in range(len(self._members)):
                        if not self._armed[j]:
                            self._arm(j)
                elif not self._closed:
                    self._disarm()
                if not self._sampled:  # what this hook costs every step, for every="auto"
                    self._cost.light_hook(time.perf_counter() - started - (self._switch_s - switched))
        except Exception as exc:
            self._give_up(exc)

    # -- arming (training thread) ------------------------------------------------------------
    def _first_sentinel(self, k: int) -> Optional[int]:
        """Optimizer `k`'s first sentinel: its last hookable parameter (the output layer's, in
        the usual order, where a backward pass begins), until a measured step names a better one."""
        members = self._members[k]
        indices = range(len(self.layout.params)) if members is None else members
        return next((i for i in reversed(indices) if self._tracker.hookable(i)), None)

    def _sentinel_list(self, k: Optional[int] = None) -> list[int]:
        chosen = self._sentinels if k is None else [self._sentinels[k]]
        return [i for i in chosen if i is not None]

    def _hooked(self, k: int) -> Optional[list[int]]:
        """The parameters of optimizer `k` whose hooks are armed (None: all, one optimizer)."""
        return self._members[k] if self._armed[k] else self._sentinel_list(k)

    def _arm(self, k: int) -> None:
        """Hook every parameter of optimizer `k`; their counts start now, as the step's do."""
        started = time.perf_counter()
        self._tracker.arm(self._members[k])
        self._tracker.end_step(self._members[k])
        self._armed[k] = True
        self._switch_s += time.perf_counter() - started

    def _disarm(self) -> None:
        """Leave only the sentinels hooked; first make each optimizer's sentinel the parameter
        that the measured round saw the most backward passes into (they tell unmeasured steps)."""
        if not any(self._armed):
            return
        started = time.perf_counter()
        if self._sampled:
            for k, members in enumerate(self._members):
                indices = range(len(self._passes)) if members is None else members
                best = max(
                    (i for i in indices if self._tracker.hookable(i)), key=self._passes.__getitem__, default=None
                )
                current = self._sentinels[k]
                if best is not None and (current is None or self._passes[best] > self._passes[current]):
                    self._sentinels[k] = best
        self._tracker.disarm(keep=self._sentinel_list())
        self._armed = [False] * len(self._armed)
        self._switch_s += time.perf_counter() - started

    def _give_up(self, exc: Exception) -> None:
        """A failure inside gradwatch must not end the training: say so, with the traceback, and
        stop watching (the steps sent so far stay; `close()` still finishes the run)."""
        log.error(
            "gradwatch: stopped watching run %s at step %d after an error of its own; the training goes "
            "on. Please report it with this traceback.",
            self.run_id,
            self.step,
            exc_info=exc,
        )
        self._detach()

    def _end_passes(
        self, k: int, keep: bool, taken: Optional[tuple[list[int], list[Optional[float]]]] = None, again: bool = True
    ) -> None:
        """End optimizer `k`'s backward passes; keep them as the round's when `keep`. `taken`: the
        passes of a closure step up to its first evaluation, which are the step's in their place;
        they are ended again only if `again` (later evaluations' passes belong to no step)."""
        members = self._hooked(k)
        if taken is None or again:
            passes, clear = self._tracker.end_step(members)
        if taken is not None:
            passes, clear = taken
        if not keep:
            return
        if members is None:
            self._passes, self._clear = passes, clear
        else:
            for j, i in enumerate(members):
                self._passes[i], self._clear[i] = passes[j], clear[j]

    def _emit(self, ended: Optional[float] = None) -> None:
        """The round is complete (its last `optimizer.step()` returned at perf_counter `ended`,
        default now): send the measured step, or the cheap facts of an unmeasured one."""
        self._round.clear()
        logged, self._logged = self._logged, {}
        clipped = self._clip.take()
        if clipped is not None:
            logged.setdefault(CLIP_KEY, clipped)
        if self.dist is not None:
            self._time_step(logged, time.perf_counter() if ended is None else ended)
        if self._amp is not None:
            self._amp.scalars(logged)
        if self._closure_calls is not None:
            logged.setdefault("closure_calls", self._closure_calls)
            self._closure_calls = None
        if len(self._members) > 1:
            for k, n in enumerate(self._opt_steps):
                logged[f"opt/{k}/steps"] = n
        for key, value in self._memory.items():  # as the round began: the hook's own tensors not yet made
            logged.setdefault(key, value)
        if self._sampled:
            self._flush_recorder()  # the held steps go before this one
            passes, clear = list(self._passes), self._clear
            self._clear = [None] * len(clear)
            logged["backward_passes"] = float(max(passes, default=0))
            snapshot = self._probe.finish(logged, _host_arrays(passes, clear))
            switched, self._switch_s = self._switch_s, 0.0  # arming for this step is part of its cost
            steps = self._cost.measured(None if snapshot is None else snapshot.cost_s + switched)
            if snapshot is not None:
                self._sender.submit_step(functools.partial(self._render, snapshot, steps))
            return
        # An unmeasured step: what its sentinels saw, and no per-parameter array (docs/protocol.md).
        sentinels = self._sentinel_list()
        logged["backward_passes"] = float(max((self._passes[i] for i in sentinels), default=0))
        for i in sentinels:
            self._clear[i] = None
        self._cost.unmeasured()
        for key in [key for key, v in logged.items() if isinstance(v, torch.Tensor) and v.device.type != "cpu"]:
            logged.pop(key)  # a CUDA tensor is read only at measured steps: reading it now would sync
        scalars = self._probe.cheap_facts(logged)
        step, now = self.step, time.time()
        make = functools.partial(wire.UnsentStep, step, now, scalars, {}, None)
        if self._recorder is None:
            self._sender.submit_step(make)
        elif self._recorder.hold(step, make):
            self._flush_recorder()

    def _flush_recorder(self) -> None:
        """Send the steps the flight recorder holds, with one copy of their ring rows."""
        batch = None if self._recorder is None else self._recorder.flush()
        if batch is not None:
            self._sender.submit_step(batch.render)

    def _time_step(self, logged: dict[str, Any], ended: float) -> None:
        """A rank's step times (perf_counter reads only, no device work): `time/step_s` since the
        previous step ended (or watch()), and of that `time/before_backward_s`, until the step's
        first gradient (forward pass, data loading): the straggler's is the longest."""
        began, self._step_began = self._step_began, ended
        logged["time/step_s"] = ended - began
        first = self._tracker.first_grad
        if first:  # no backward since the last step (a step without gradients) leaves it out
            logged["time/before_backward_s"] = min(max(first[0] - began, 0.0), ended - began)
            first.clear()

    def _skipped_step(self, optimizer: torch.optim.Optimizer) -> None:
        """A GradScaler skipped `optimizer`'s step: its backward passes end there all the same."""
        if self._closed:
            return
        k = next(k for k, o in enumerate(self.layout.optimizers) if o is optimizer)
        self._tracker.end_step(self._hooked(k))

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
            self._logged[key] = value

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
            self._close_requested = True
            return
        if self._closed:
            return
        deadline = time.monotonic() + timeout
        self._closed = True
        if self._round and self._handles:  # an optimizer never stepped in the last round: send what there is
            self._emit()
        self._flush_recorder()
        self._detach()
        self._sender.close(status, timeout=timeout)
        if callbacks is not None:
            callbacks.wait(deadline - time.monotonic())

    def _stop_watching(self) -> None:
        """On the training thread, as close() inside the callback asked: send the open round and
        detach; the sender goes on until the script's close()."""
        if self._round and self._handles:
            self._emit()
        self._detach()

    def _detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._clip.close()
        self._tracker.remove()
        if self._amp is not None:
            self._amp.remove()

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

    # -- sender thread ---------------------------------------------------------------------
    def _render(self, snapshot: Snapshot, steps: int) -> wire.UnsentStep:
        sender_cpu_s = self._cost.render_began(steps)
        metrics, status, scalars = snapshot.resolve()
        self._probe.recycle(snapshot)
        rss = _rss_bytes()
        if rss is not None:
            scalars["mem/rss_bytes"] = rss
        # The hook's own cost, so that users can see it: training-thread seconds of this step,
        # and sender-thread CPU per step since the previous measured step (sending included).
        scalars["hook/train_s"] = snapshot.cost_s
        scalars["hook/sender_cpu_s"] = sender_cpu_s
        record = wire.UnsentStep(snapshot.step, snapshot.time, scalars, metrics, status)
        self._cost.render_done()
        return record


def _host_arrays(passes: list[int], clear: list[Optional[float]]) -> dict[str, np.ndarray]:
    """`backward_passes` and `grad_clear` per parameter (NaN where nothing accumulated)."""
    return {
        "backward_passes": np.array(passes, dtype=np.float32),
        "grad_clear": np.array([np.nan if c is None else c for c in clear], dtype=np.float32),
    }


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


def _rss_bytes() -> Optional[float]:
    try:
        with open("/proc/self/statm", "rb") as f:
            return float(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, IndexError):
        return None


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

    every: measure every N-th `optimizer.step()`, or "auto" to keep what measuring costs within 1%
        of the step time (the hook's threads, and a server on this machine: its acks say its CPU).
        A step that is not measured costs a few tens of µs, whatever the model's size
        (docs/benchmarks.md).
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

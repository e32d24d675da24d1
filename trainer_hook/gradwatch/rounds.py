"""The optimizer rounds of a watched run, on the training thread (`Rounds`).

A `Watcher` is the public handle; its `Rounds` is what the optimizers' step hooks call: which
step is a round and which round is measured (the sampler), each optimizer's measurement at its
first step of a measured round (`Probe`: gradients before, state after), the backward passes of
each step (`GradTracker`, with the per-parameter hooks armed only for measured steps), closures,
the GradScaler's skipped steps, each rank's step times, and, as a round ends, its step handed to
the sender: a measured one as its `Snapshot`, rendered on the sender thread by a `StepRenderer`
(render.py); an unmeasured one as its cheap facts. Nothing here raises into the training loop: a
failure of gradwatch's own stops the watching (`_give_up`).
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any, Optional

import numpy as np
import torch

from . import distributed
from .accumulation import GradTracker, process_group
from .amp import AmpScaler
from .clipping import KEY as CLIP_KEY
from .clipping import ClipNorms
from .closures import CountedClosure, step_closure, with_closure
from .layout import Layout
from .measure import Probe
from .recorder import FlightRecorder
from .render import StepRenderer
from .sampling import CostMeter, Sampler
from .sender import Sender
from .wire import UnsentStep

log = logging.getLogger("gradwatch")

#: With `GradTracker.scan`, one measured round in this many is counted with hooks again, which
#: checks that every backward still reaches a sentinel (its cost spread over the others).
VERIFY_EVERY = 16


class Rounds:
    """The training-thread side of a watched run: the optimizers' step hooks and what they do.

    Made by `Watcher`, which holds the parts it shares with it (the sampler, the probe, the
    sender, the cost meter, the flight recorder). `logged` takes the user's scalars for the next
    round; `finish()` ends the watching (the open round sent, the hooks removed).
    """

    def __init__(
        self,
        layout: Layout,
        *,
        probe: Probe,
        sampler: Sampler,
        amp: Optional[AmpScaler],
        sender: Sender,
        cost: CostMeter,
        recorder: Optional[FlightRecorder],
        dist: Optional[distributed.Rank],
        run_id: str,
        owner: object,
    ) -> None:
        optimizers = layout.optimizers
        self.layout = layout
        self._probe = probe
        self._sampler = sampler
        self._amp = amp
        self._sender = sender
        self._cost = cost
        self._recorder = recorder
        self._renderer = StepRenderer(probe, cost)
        self.dist = dist
        self.run_id = run_id
        #: the Watcher: the optimizers' hooks hold it through this, so that a script that keeps no
        #: reference to what watch() returned is still watched, and closed at exit
        self._owner = owner
        self.step = 0  # optimizer.step() calls so far (rounds, with several optimizers: see `watch`)
        self.measured_steps = 0  # of those, the ones measured in full (every="auto": how often it measures)
        self._memory: dict[str, float] = {}  # CUDA allocator counters read as the current round began
        self._tracker = GradTracker(
            [w.shard.accumulated for w in layout.params],
            on_node=all(w.view is None and w.shard.accumulates is None for w in layout.params),
        )
        #: parameter indices of each optimizer; None stands for all (one optimizer)
        self._members: list[Optional[list[int]]] = (
            [None]
            if len(optimizers) == 1
            else [[i for i, w in enumerate(layout.params) if w.optimizer == k] for k in range(len(optimizers))]
        )
        #: per optimizer, its parameters that can be hooked (the candidates for its sentinel)
        self._hookable = [
            [i for i in (range(len(layout.params)) if members is None else members) if self._tracker.hookable(i)]
            for members in self._members
        ]
        # Per-parameter gradient hooks cost every backward pass, so they are armed only for the
        # steps that are measured (from the previous step of each optimizer, where their counts
        # start); the other steps hook one sentinel parameter per optimizer (docs/design.md).
        #: per optimizer, the parameter whose hook stays armed (None: none can be hooked)
        self._sentinels: list[Optional[int]] = [self._first_sentinel(k) for k in range(len(optimizers))]
        self._upcoming = self._sampler(1)  # whether the next round is measured (decided a round ahead)
        self._armed = [self._upcoming] * len(optimizers)  # per optimizer: all its parameters hooked
        self._switch_s = 0.0  # training-thread seconds spent arming and disarming since the last measured step
        #: count the measured steps' passes by `GradTracker.scan` (one pass over the `.grad`s per
        #: backward) rather than a hook per parameter: one process, plain tensors, and a measured
        #: round with hooks that showed every backward reaching a sentinel (`_choose_counting`)
        self._scan_ok = False
        self._scan_doubted = False  # a scan was in doubt: hooks for good
        self._scanned_rounds = 0  # measured rounds counted by `scan`
        if self._upcoming:
            self._tracker.arm()
        else:
            self._tracker.arm(self._sentinel_list(), lasting=True)
            self._tracker.count_at_step(self._may_count_at_step())
        self._round: dict[int, int] = {}  # optimizer -> its steps in the open round
        self._opt_steps = [0] * len(optimizers)
        n = len(layout.params)
        self._passes: list[int] = [0] * n  # per parameter, as its optimizer's last step left them
        self._clear: list[Optional[float]] = [None] * n
        self._closures: dict[int, CountedClosure] = {}  # optimizer -> the closure of its step in flight
        self._taken: dict[int, tuple[list[int], list[Optional[float]]]] = {}  # passes up to its first evaluation
        self._closure_calls: Optional[int] = None  # closure evaluations in the open round; None: no closure
        #: the user's scalars (`Watcher.log`) for the open round
        self.logged: dict[str, Any] = {}
        self._closed = False
        self._close_requested = False  # by close() inside the on_finding callback
        self._sampled = False
        self._step_began = time.perf_counter()  # where the first step's `time/step_s` starts
        self._clip = ClipNorms().open()  # the total norm the loop's clip_grad_norm_ returns
        #: the next round may take the lean path (`_lean_before`): one optimizer, this round and
        #: the next unmeasured, nothing armed, no closure in flight
        self._lean = self._may_be_lean()
        self._lean_round = False  # the open round took the lean path at its pre-step hook
        #: a lean round's pre-step work is done by its post-step hook (`_lean_after`): nothing of
        #: it must precede the update (no GradScaler, flight recorder or CUDA counters)
        self._fold = amp is None and recorder is None and not probe.reads_memory
        self._handles = []
        for k, opt in enumerate(optimizers):
            self._handles += [
                opt.register_step_pre_hook(functools.partial(self._before_step, k)),
                opt.register_step_post_hook(functools.partial(self._after_step, k)),
            ]
        if self._amp is not None:
            self._amp.watch_steps(optimizers, self._skipped_step)

    # -- the watcher -----------------------------------------------------------------------
    def request_stop(self) -> None:
        """Stop at the next step (close() inside the on_finding callback, not on this thread)."""
        self._close_requested = True
        self._lean = False

    def finish(self) -> None:
        """The watching ends (`Watcher.close`): send the open round and what the flight recorder
        holds, and remove every hook."""
        self._closed = True
        self._lean = False
        if self._round and self._handles:  # an optimizer never stepped in the last round: send what there is
            self._emit()
        self._flush_recorder()
        self._detach()

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

    # -- the optimizers' hooks -----------------------------------------------------------
    # With several optimizers a step is a round: it opens with the first `optimizer.step()`
    # after the previous round and closes when every optimizer has stepped at least once (a GAN's
    # D then G step; a critic stepped 5 times per generator step). Each optimizer is measured at
    # its first step of a sampled round: its gradients just before, its state just after.
    def _before_step(self, k: int, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> Any:
        if self._lean and len(args) == 1 and not kwargs:  # `args[0]` is the optimizer: no closure
            if self._fold:
                self._lean_round = True
            else:
                self._lean_before(optimizer)
            return None
        self._lean_round = False
        started = time.perf_counter()
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
        finally:
            if not self._sampled:  # what this hook costs every step, for every="auto"
                self._cost.pre_hook(time.perf_counter() - started)
        return None

    def _lean_before(self, optimizer: torch.optim.Optimizer) -> None:
        """`_before_step` where the round is unmeasured and so was the last, one optimizer and no
        closure: what every unmeasured step pays, so the same work in as few calls and objects as
        can be (each step's tensors evict the hook's code and data from the CPU caches, so every
        call and object touched costs a miss)."""
        started = time.perf_counter()
        try:
            self._lean_round = True
            if self._amp is not None:
                self._amp.stepped(optimizer)
            self.step += 1
            self._memory = self._probe.cuda_memory()
            self._cost.begin_step(previous_measured=False)
            self._upcoming = self._sampler(self.step + 1)
            if self._recorder is not None:
                self._recorder.record(self.step)
        except Exception as exc:
            self._give_up(exc)
        self._cost.pre_hook(time.perf_counter() - started)

    def _lean_after(self) -> None:
        """`_after_step` of a round that took the lean path at its pre-step hook whose next round
        is not measured (as the sampler said then): `_lean_before`'s work where it was folded
        into this hook, its sentinel's passes, its cheap facts sent, the next round decided
        (`_after_step` and `_emit` do the same in the general case)."""
        started = time.perf_counter()
        try:
            self._lean_round = False
            fold = self._fold
            if fold:  # `_lean_before`'s work, which needs to precede nothing
                self.step += 1
            self._opt_steps[0] += 1
            sentinel = self._sentinels[0]
            passes = 0
            if sentinel is not None:
                self._passes[sentinel] = passes = self._tracker.end_one(sentinel)
            self._send_unmeasured(self._round_scalars(started), float(passes))
            self._upcoming = upcoming = self._sampler.revise(self.step + 1, False)
            self._cost.unmeasured(started if fold else None, time.perf_counter() - started)
            if upcoming:
                self._lean = False
                self._prepare_measured()
        except Exception as exc:
            self._give_up(exc)

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
        if self._lean_round and not self._upcoming:
            self._lean_after()
            return
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
            passes, clear = self._step_passes(k, counted)  # every step: it marks where the next one starts
            if first:
                self._keep_passes(k, passes, clear)
            switched = self._switch_s
            if self._upcoming and not self._armed[k]:  # the next round is measured: count from here
                self._arm(k)
            if self._sampled and first:
                self._probe.read_state(self._members[k])
            if len(self._round) == len(self._members):
                self._emit(started)
                # what the round taught the sampler (every="auto") may change its mind about the next
                self._upcoming = self._sampler.revise(self.step + 1, self._upcoming)
                if self._sampled:
                    self._choose_counting()
                if self._upcoming:
                    self._prepare_measured()
                elif not self._closed:
                    self._disarm()
                self._lean = self._may_be_lean()
                if not self._sampled:  # what this hook costs every step, for every="auto"
                    self._cost.light_hook(time.perf_counter() - started - (self._switch_s - switched))
        except Exception as exc:
            self._give_up(exc)

    def _may_be_lean(self) -> bool:
        """Whether the next round may take the lean path (`_lean_before`), as a round ends."""
        return (
            len(self._members) == 1
            and not (self._sampled or self._upcoming or self._closed or self._close_requested)
            and not (self._closures or self._taken or self._round or any(self._armed))
        )

    def _prepare_measured(self) -> None:
        """The next round is measured: count every parameter's passes from here."""
        for j in range(len(self._members)):
            if not self._armed[j]:
                self._arm(j)
        if self._scan_ok and not self._tracker.scanning:
            self._tracker.to_scan(keep=self._sentinel_list())

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
        self._tracker.count_at_step(False)
        if self._scan_ok:
            self._tracker.scan(self._members[k])
        else:
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
        self._tracker.disarm(keep=self._sentinel_list())
        self._tracker.arm(self._sentinel_list(), lasting=True)  # a sentinel that `scan` counted gets its hook
        self._tracker.count_at_step(self._may_count_at_step())
        self._armed = [False] * len(self._armed)
        self._switch_s += time.perf_counter() - started

    def _may_count_at_step(self) -> bool:
        """Whether the sentinels' passes may be counted at the step, with no end-of-backward
        callback (`GradTracker.count_at_step`): no process group writes `.grad` inside a backward
        and no rank times its backward (`time/before_backward_s`)."""
        return self.dist is None and not process_group()

    def _choose_counting(self) -> None:
        """After a measured round: make each optimizer's sentinel the parameter that the round saw
        the most backward passes into (they tell unmeasured steps), and choose how the next
        measured rounds count passes. `scan` is exact when every backward that touches an
        optimizer's parameters reaches its sentinel: a round counted with hooks in which every
        parameter had either its sentinel's passes or none says so, one process and plain
        tensors, no process group (DDP and FSDP write `.grad` inside the backward) are its others; a
        scan in doubt (`GradTracker.doubtful`) goes back to hooks for good."""
        tracker, passes = self._tracker, self._passes
        scanned = tracker.scanning
        uniform, moved = True, False
        for k, hookable in enumerate(self._hookable):
            current = self._sentinels[k]
            top = max(map(passes.__getitem__, hookable), default=None)  # in C; the argmax only if it moves
            if top is not None and (current is None or top > passes[current]):
                self._sentinels[k] = current = max(hookable, key=passes.__getitem__)
                moved = True
            if not scanned:  # `uniform` is read after a round counted with hooks only
                most = 0 if current is None else passes[current]
                uniform = uniform and most > 0 and all(passes[i] in (0, most) for i in hookable)
        if scanned:
            self._scanned_rounds += 1
            self._scan_doubted |= tracker.doubtful
        ok = not self._scan_doubted and tracker.plain and not process_group()
        if not scanned:  # a round counted with hooks says whether the next may scan
            ok = ok and uniform
        else:  # and every VERIFY_EVERY-th measured round is counted with hooks again, to check
            ok = ok and self._scan_ok and self._scanned_rounds % VERIFY_EVERY != 0
        self._scan_ok = ok
        if scanned and not ok:
            tracker.to_hooks()
        if moved and tracker.scanning:  # a new sentinel that `scan` counted gets its hook, an old one loses it
            tracker.arm(self._sentinel_list(), lasting=True)
            tracker.to_scan(keep=self._sentinel_list())

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

    def _step_passes(self, k: int, counted: Optional[CountedClosure]) -> tuple[list[int], list[Optional[float]]]:
        """Optimizer `k`'s backward passes of the step that just returned (`counted`: its closure),
        ended where its next step's begin: those since its previous step or, where its closure
        was evaluated, those up to the first evaluation (taken then: `_closure_returned`)."""
        taken = self._taken.pop(k, None)
        if taken is None:
            return self._tracker.end_step(self._hooked(k))
        if counted is None or counted.calls != 1:  # later evaluations' passes belong to no step
            self._tracker.end_step(self._hooked(k))
        return taken

    def _keep_passes(self, k: int, passes: list[int], clear: list[Optional[float]]) -> None:
        """Keep optimizer `k`'s passes (of its hooked parameters) as the round's."""
        members = self._hooked(k)
        if members is None:
            self._passes, self._clear = passes, clear
        else:
            for j, i in enumerate(members):
                self._passes[i], self._clear[i] = passes[j], clear[j]

    def _emit(self, ended: Optional[float] = None) -> None:
        """The round is complete (its last `optimizer.step()` returned at perf_counter `ended`,
        default now): send the measured step, or the cheap facts of an unmeasured one."""
        self._round.clear()
        logged = self._round_scalars(time.perf_counter() if ended is None else ended)
        if self._sampled:
            self._flush_recorder()  # the held steps go before this one
            passes, clear = list(self._passes), self._clear
            self._clear = [None] * len(clear)
            logged["backward_passes"] = float(max(passes, default=0))
            # their arrays are made on the sender thread: the lists are this step's alone
            snapshot = self._probe.finish(logged, functools.partial(_host_arrays, passes, clear))
            switched, self._switch_s = self._switch_s, 0.0  # arming for this step is part of its cost
            steps = self._cost.measured(None if snapshot is None else snapshot.cost_s + switched)
            if snapshot is not None:
                self._sender.submit_step(functools.partial(self._renderer.render, snapshot, steps))
            return
        sentinels = self._sentinel_list()
        for i in sentinels:
            self._clear[i] = None
        self._cost.unmeasured()
        self._send_unmeasured(logged, float(max((self._passes[i] for i in sentinels), default=0)))

    def _round_scalars(self, ended: float) -> dict[str, Any]:
        """The round's scalars, measured or not: the user's, the clipped norm, the step's times
        (ended at perf_counter `ended`), AMP's, closures', each optimizer's steps, CUDA memory."""
        logged, self.logged = self.logged, {}
        clipped = self._clip.take()
        if clipped is not None:
            logged.setdefault(CLIP_KEY, clipped)
        if self.dist is not None:
            self._time_step(logged, ended)
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
        return logged

    def _send_unmeasured(self, logged: dict[str, Any], passes: float) -> None:
        """An unmeasured step: `passes`, the most backward passes its sentinels saw, its scalars
        and cheap facts, and no per-parameter array (docs/protocol.md)."""
        logged["backward_passes"] = passes
        scalars = self._probe.cheap_facts(logged)  # never reads a CUDA tensor: that would sync
        step, now = self.step, time.time()
        make = functools.partial(UnsentStep, step, now, scalars, {}, None)
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


def _host_arrays(passes: list[int], clear: list[Optional[float]]) -> dict[str, np.ndarray]:
    """`backward_passes` and `grad_clear` per parameter (NaN where nothing accumulated)."""
    return {
        "backward_passes": np.array(passes, dtype=np.float32),
        "grad_clear": np.array([np.nan if c is None else c for c in clear], dtype=np.float32),
    }

"""How each `.grad` was filled: backward passes since the last step, and how it was cleared.

A hook per parameter counts the backward passes. The watcher arms the hooks of every parameter
only for the steps it measures, and one sentinel parameter per optimizer otherwise (`arm`,
`disarm`; docs/design.md). A sentinel's hook runs right after autograd adds into its `.grad` (a
post hook of its AccumulateGrad node); a measured round's hooks run right before (tensor
pre-hooks, which torch drops entirely once removed), and their notes are read as the ones a hook
after the accumulation would have made (`_take_found`). At
the first of them after an optimizer step it looks at tensor metadata only (no device work):
- a different `.grad` tensor than the step left behind: it was set to `None` (`zero_grad()`,
  `model.zero_grad()`, `p.grad = None`) and autograd made a new one;
- the same tensor whose version counter moved by one: only this accumulation wrote to it, so it
  still held the previous step's gradient (a forgotten `zero_grad()`);
- the same tensor, moved by more: something wrote to it in place in between (`zero_()`, as
  `zero_grad(set_to_none=False)` does).
This tells intentional accumulation (K passes after a clear) from a forgotten clear exactly.

Passes that land before a clear do not count toward the next step: in a GAN the generator's loss
backpropagates through the discriminator after D's step and fills D's `.grad`, which D's
`zero_grad()` then clears before D's own backward. So every later pass compares `.grad` with what
the previous pass left (a cheap look at metadata, as above): the same tensor, one version on, is
one more pass accumulated; anything else was a clear, and counting starts again from it, with its
kind as the step's `grad_clear`. Accumulation that autograd does out of place (a backward with
`create_graph=True`) makes a new tensor and reads as a clear, at the first pass as at later ones.

Writes inside a backward are no clear: DistributedDataParallel's reducer writes the all-reduced
gradient into `.grad` in place at the end of every backward. So "what the previous pass left" is
taken when that backward ends: the first hook of a backward queues an autograd final callback,
which queues one more, so that it runs after the callbacks queued during the backward (DDP's), and
that one notes the version of each `.grad` the backward touched.

The hooks themselves only note which `.grad` they found and its version; that callback (or the
step's `end_step`, for a backward that never ran it) makes the comparisons above for the whole
backward in one loop, in the hooks' order: the same counts, at a cost per tensor that a measured
step pays once rather than inside each hook (docs/benchmarks.md). Where no process group is up
and only the sentinels are hooked (an unmeasured step), nothing writes `.grad` inside a backward:
the notes wait for the step and no callback is queued (`count_at_step`), which spares every
unmeasured step most of what its sentinel cost.
"""

from __future__ import annotations

import logging
import operator
import time
import weakref
from collections import deque
from collections.abc import Callable, Collection, Iterable
from itertools import repeat
from typing import Any, NamedTuple, Optional

import torch
from torch.utils.hooks import RemovableHandle

from .pieces import to_local

log = logging.getLogger("gradwatch")

#: `grad_clear` codes (see docs/protocol.md); None (sent as ABSENT) when nothing accumulated since the last step.
CLEAR_NOT, CLEAR_NONE, CLEAR_ZERO = 0.0, 1.0, 2.0

#: notes held for the step at most (`count_at_step`): more backward passes than this without a
#: step are counted as they come, so that the `.grad`s they hold do not pile up
MAX_NOTED = 64

#: a weak reference that is already dead: what a step that left `.grad` None is compared with
_DEAD: weakref.ref[Any] = weakref.ref(set())
_NO_GRAD = (_DEAD, 0)


class _Fresh:
    """What a pass that found no `.grad` made: a tensor no reference names (`_take_found`)."""


_FRESH: Any = _Fresh()
_GRAD = operator.attrgetter("grad")
_VERSION = operator.attrgetter("_version")
_FIRST = operator.itemgetter(0)
_SECOND = operator.itemgetter(1)
_DEREF: Callable[[weakref.ref[Any]], Any] = weakref.ref.__call__  # operator.call is Python 3.11+
_consume: Callable[[Iterable[Any]], None] = deque(maxlen=0).extend  # runs an iterator of calls (`map`) to its end, in C


def grad_nbytes(grad: torch.Tensor) -> int:
    """Bytes a `.grad` holds: a sparse one (`nn.Embedding(sparse=True)`), its indices and values
    (its `nbytes` raises: asked first, it costs dense grads nothing more)."""
    try:
        return grad.nbytes
    except RuntimeError:
        return grad._indices().nbytes + grad._values().nbytes


def local_nbytes(t: torch.Tensor) -> int:
    """Bytes this rank holds for `t`: a DTensor's local tensor's (`grad_nbytes` otherwise)."""
    return grad_nbytes(to_local(t))


class GradTracker:
    """Backward passes and clears per reported parameter, for the parameters armed. Several
    reported parameters may share one tensor (the original parameters of an FSDP1
    FlatParameter): the tensor is hooked once and each of them reads its counts."""

    def __init__(self, params: list[torch.Tensor], on_node: bool = True) -> None:
        """`on_node`: hook plain tensors on their accumulator node (see `arm`); False where a
        framework reshapes parameters between steps (FSDP: a node held from one step to the
        next would expect the sharded shape)."""
        slots: dict[int, int] = {}
        #: per reported parameter, the index of its tensor among the distinct ones
        self._slot = [slots.setdefault(id(p), len(slots)) for p in params]
        self._shared = len(slots) != len(params)
        params = list({id(p): p for p in params}.values())
        n = len(params)
        # Changed in place, never replaced: each hook holds these lists.
        self._passes = [0] * n
        self._clear: list[Optional[float]] = [None] * n
        # per parameter, as the last step left it: (weakref to .grad, its version), or None before
        # the first step; (_DEAD, 0) when .grad was None then
        self._ref: list[Optional[tuple[weakref.ref[Any], int]]] = [None] * n
        # per parameter, the `.grad` the last backward pass since the step left and its version
        self._pass_ref: list[Optional[weakref.ref[torch.Tensor]]] = [None] * n
        self._pass_version = [0] * n
        #: (parameter, its `.grad`, that tensor's version) per hook run since the last `_drain`
        self._seen: list[tuple[int, Optional[torch.Tensor], int]] = []
        #: (parameter, the `.grad` it found, that tensor's version) per run of a pre-hook (`arm`,
        #: not `lasting`) since the last `_drain`, which reads them as the passes they began
        self._found: list[tuple[int, Optional[torch.Tensor], int]] = []
        #: the parameters `_drain` took from `_found`: what their passes left is read after it
        self._began: list[int] = []
        self._settling = [False]  # the end-of-backward callback of the running backward is queued
        self._can_settle = True  # the autograd engine takes final callbacks
        #: the hooks' notes wait for the step to be counted, with no end-of-backward callback (`count_at_step`)
        self._at_step = [False]
        #: perf_counter of the first gradient since the watcher last cleared it (its step timing)
        self.first_grad: list[float] = []
        self._params = params
        #: the distinct tensors that can be hooked (as torch allows: leaves that require grad)
        self._hookable = [p.requires_grad and p.is_leaf for p in params]
        #: distinct tensor -> its hook (`_Hook`)
        self._nodes: dict[int, _Hook] = {}
        #: plain tensors are hooked on their accumulator node; others on the tensor: FSDP fills
        #: the `.grad` of its sharded DTensor and flat parameters itself and runs their tensor
        #: hooks, not an accumulator node
        self._on_node = [on_node and type(p) in (torch.nn.Parameter, torch.Tensor) for p in params]
        self._plain = all(self._on_node) and not self._shared  # `plain`: the tensors stay what they are
        #: distinct tensors counted without a hook of their own (`scan`): the end-of-backward
        #: callback that a hooked sentinel queues looks at their `.grad`s instead
        self._scanned: list[int] = []
        #: a scan saw what only a backward pass it missed explains (see `scan`)
        self.doubtful = False
        #: `_scan_new`'s look-ups for the scanned tensors: (the slots, their tensors, a getter of
        #: their items in per-tensor lists), made again when the scanned tensors change
        self._scan_cache: Optional[tuple[tuple[int, ...], list[torch.Tensor], Any]] = None

    # -- arming: which tensors are hooked --------------------------------------------------
    def arm(self, indices: Optional[Collection[int]] = None, lasting: bool = False) -> None:
        """Hook the reported parameters `indices` (default: all) that are not hooked yet. Their
        counts start at their next `end_step`, which notes the `.grad` they compare with.

        A hook for a few rounds is a tensor pre-hook, which torch lets go of entirely once
        removed (`_unhook`): it notes the `.grad` a pass finds, and the end-of-backward callback
        reads what the pass left. A `lasting` one (a sentinel, hooked for the whole run, whose
        passes may be counted at the step with no callback: `count_at_step`) goes on the node.

        The hook goes on the parameter's gradient accumulator node (autograd's AccumulateGrad,
        which runs it right after adding into `.grad`), held here while armed so that the next
        forward passes use that node; disarming removes it. A node that is no longer held dies
        with the last graph that used it, and the next forward makes a fresh one without hooks.
        A loop that keeps its last loss until its next forward keeps the node alive for good:
        there an inert hook would cost every backward a call into Python per tensor, and even a
        removed one leaves torch's emptied hook dict, which costs about half that (a tensor's own
        post-accumulate-grad hook leaves the same: docs/benchmarks.md)."""
        slots = range(len(self._params)) if indices is None else {self._slot[i] for i in indices}
        self.arm_slots(slots, lasting)

    def arm_slots(self, slots: Collection[int], lasting: bool = False) -> None:
        """`arm` by distinct tensor."""
        if self._scanned:
            self._scanned = [u for u in self._scanned if u not in slots]
        nodes, hookable = self._nodes, self._hookable
        if lasting:  # a pre-hook counts only with the callback: a lasting hook goes on the node
            for u in [u for u in slots if u in nodes and nodes[u].before is not None]:
                _unhook(*nodes.pop(u))
        todo = [u for u in slots if u not in nodes and hookable[u]]
        if todo:
            with torch.enable_grad():  # once for every node `_accumulator` finds
                self._hook(todo, lasting or not self._can_settle)

    def _hook(self, slots: list[int], lasting: bool) -> None:
        """`arm_slots` of tensors not hooked yet, grad mode on."""
        nodes, params = self._nodes, self._params
        for u in slots:
            on = [True]
            p = params[u]
            if not self._on_node[u]:
                hook = self._counter(u, on)
                nodes[u] = _Hook(p.register_post_accumulate_grad_hook(lambda _, hook=hook: hook((), ())), on)
            elif not lasting:
                nodes[u] = _Hook(p.register_hook(self._finder(u, on)), on, before=p)
            else:
                node = _accumulator(p)
                nodes[u] = _Hook(node.register_hook(self._counter(u, on)), on, node=node)

    def scan(self, indices: Optional[Collection[int]] = None) -> None:
        """Count the reported parameters `indices` (default: all) without hooking them: at the
        end of every backward pass that reaches a hooked sentinel, one pass over their `.grad`s
        notes each that the backward touched (a different tensor, or a version moved since what
        the last pass or step left) as its hook would have, and `_drain` counts them the same.

        Exact where every backward pass that touches them also reaches a sentinel and nothing
        writes to a `.grad` inside a backward after its accumulation (the caller's guard: one
        process, plain tensors, and a measured step with hooks that showed every parameter
        counted with its sentinel). A pass that reached no sentinel shows at a later scan as a
        version moved by more than one after a pass: `doubtful` is set, for the caller to go
        back to hooks. Counts start at the next `end_step`, as `arm`'s do."""
        self.count_at_step(False)
        slots = range(len(self._params)) if indices is None else {self._slot[i] for i in indices}
        known = set(self._scanned)
        self._scanned += [u for u in slots if u not in known and u not in self._nodes and self._hookable[u]]

    @property
    def plain(self) -> bool:
        """Whether every tensor is hooked on its accumulator node and reported once (what `scan`
        needs besides one process)."""
        return self._plain

    @property
    def scanning(self) -> bool:
        return bool(self._scanned)

    def to_scan(self, keep: Collection[int]) -> None:
        """Count every hooked parameter but the reported parameters `keep` (the sentinels, which
        stay hooked) by `scan` from now on; the counts so far carry on."""
        self.count_at_step(False)
        kept = {self._slot[i] for i in keep}
        moved = [u for u in self._nodes if u not in kept]
        for u in moved:
            _unhook(*self._nodes.pop(u))
        self._scanned += moved

    def to_hooks(self) -> None:
        """Hook the scanned parameters again (`scan` was in doubt); the counts so far carry on."""
        scanned, self._scanned = self._scanned, []
        self.arm_slots(scanned)
        self.doubtful = False

    def disarm(self, keep: Collection[int] = ()) -> None:
        """Unhook every parameter but the reported parameters `keep` (the sentinels), and stop
        scanning."""
        for u in self._scanned:
            self._passes[u], self._clear[u] = 0, None
        self._scanned = []
        kept = {self._slot[i] for i in keep}
        for u in [u for u in self._nodes if u not in kept]:
            _unhook(*self._nodes.pop(u))
            self._passes[u], self._clear[u] = 0, None

    @property
    def armed(self) -> int:
        """How many distinct tensors are hooked."""
        return len(self._nodes)

    def hookable(self, i: int) -> bool:
        """Whether reported parameter `i` can be hooked."""
        return self._hookable[self._slot[i]]

    def _counter(self, i: int, on: list[bool]) -> Any:
        """The hook of parameter `i` (a post hook of its accumulator node), active while `on[0]`.
        It runs in every backward pass for every armed parameter, so it only notes which `.grad`
        it found and its version (no device work, no comparison): `_drain` compares, once per
        backward for all the parameters it touched, in the order the hooks ran."""
        seen, settling, settle, at_step = self._seen, self._settling, self._settle_at_end, self._at_step
        note = seen.append
        p = self._params[i]

        def on_accumulate(grad_inputs: Any, grad_outputs: Any) -> None:
            if not on[0]:
                return
            grad = p.grad
            note((i, grad, 0 if grad is None else grad._version))
            if not settling[0]:
                settle()
            elif at_step[0] and len(seen) > MAX_NOTED:  # backward passes and no step: count them now
                self._drain().clear()

        return on_accumulate

    def _finder(self, i: int, on: list[bool]) -> Callable[[torch.Tensor], None]:
        """The pre-hook of parameter `i`, active while `on[0]`: it runs before autograd adds into
        `.grad` and notes the `.grad` it found and its version, for `_drain` (`_take_found`)."""
        found, settling, settle = self._found.append, self._settling, self._settle_at_end
        p = self._params[i]

        def on_pass(_: torch.Tensor) -> None:
            if on[0]:
                grad = p.grad
                found((i, grad, 0 if grad is None else grad._version))
                if not settling[0]:
                    settle()

        return on_pass

    def count_at_step(self, on: bool) -> None:
        """Whether the hooks' notes are counted at the step (`end_step`, `end_one`) rather than
        by an end-of-backward callback: the versions as the hooks saw them, exact where nothing
        writes to a `.grad` inside a backward after its accumulation (no process group: the
        caller's guard) and nothing is scanned (`scan` and `to_scan` turn it off). It spares
        each backward the callback, most of what a step that hooks one sentinel costs."""
        if on and not self._scanned:
            self._drain().clear()
            self._left()
            self._at_step[0] = self._settling[0] = True
        elif self._at_step[0]:
            self._at_step[0] = False
            self._settling[0] = not self._can_settle

    def _settle_at_end(self) -> None:
        """Queue `_settled` to run when the running backward has ended (see the module docstring)."""
        if not self.first_grad:  # the first hook of a backward: once per pass, not per parameter
            self.first_grad.append(time.perf_counter())
        queue = _QUEUE_CALLBACK
        try:
            queue(lambda: queue(self._settled))
            self._settling[0] = True
        except Exception as exc:  # no engine to call back: from now on, versions as the hooks saw them
            log.debug("gradwatch: cannot queue an end-of-backward callback: %s", exc)
            self._can_settle = False
            self._settling[0] = True  # for good: the hooks stop asking, `end_step` compares

    def _settled(self) -> None:
        """The backward has ended: count its passes (`_drain`), then what each touched `.grad`
        holds now is what its pass left (DDP's in-place write of the reduced gradient included).
        A `.grad` replaced after its hook ran reads as a clear at the next pass, whatever its
        version, so the version is read from the tensor the hook saw (no second `.grad` read)."""
        if self._scanned:
            self._scan_touched()
        seen = self._drain()
        pass_versions = self._pass_version
        for i, grad, _ in seen:
            if grad is not None and grad is not _FRESH:
                pass_versions[i] = grad._version
        seen.clear()
        self._left()
        self._settling[0] = False

    def _scan_touched(self) -> None:
        """Note, as their hooks would have, the scanned tensors whose `.grad` the ending backward
        touched: not the tensor, or not the version, that the last pass (or the step) left."""
        if self._scan_new():
            return
        note, params, passes = self._seen.append, self._params, self._passes
        refs, pass_refs, pass_versions = self._ref, self._pass_ref, self._pass_version
        for u in self._scanned:
            grad = params[u].grad
            if grad is None:
                continue
            version = grad._version
            if passes[u]:
                last = pass_refs[u]
                if last is not None and last() is grad:
                    moved = version - pass_versions[u]
                    if moved == 0:
                        continue
                    if moved > 1:  # a pass that reached no sentinel, or a write in between
                        self.doubtful = True
                note((u, grad, version))
                continue
            ref = refs[u]
            if ref is not None:
                old, old_version = ref
                if old() is grad:
                    if version == old_version:
                        continue
                    if version - old_version > 2:  # more than a clear (`zero_()`) and one pass
                        self.doubtful = True
            note((u, grad, version))

    def _scan_new(self) -> bool:
        """`_scan_touched` and `_drain` at once for the usual first backward after a step, where
        every scanned tensor has a `.grad` that is not the one the step left (`zero_grad()` set
        them to None): each is one pass after a clear to None, counted with no loop in Python
        (the `map`s run in C). False, having changed nothing, where any tensor differs (no step
        yet, a pass already counted, a `.grad` absent or the step's): the loops then."""
        scanned = self._scanned
        if len(scanned) < 2:
            return False
        key = tuple(scanned)
        cache = self._scan_cache
        if cache is None or cache[0] != key:
            params = self._params
            cache = self._scan_cache = (key, [params[u] for u in key], operator.itemgetter(*key))
        _, params, get = cache
        if any(get(self._passes)):
            return False
        refs = get(self._ref)
        if any(map(operator.is_, refs, repeat(None))):
            return False
        grads = list(map(_GRAD, params))
        if any(map(operator.is_, grads, repeat(None))) or any(map(operator.is_, map(_DEREF, map(_FIRST, refs)), grads)):
            return False
        passes, clear, pass_refs, pass_versions = self._passes, self._clear, self._pass_ref, self._pass_version
        _consume(map(passes.__setitem__, key, repeat(1)))
        _consume(map(clear.__setitem__, key, repeat(CLEAR_NONE)))
        _consume(map(pass_refs.__setitem__, key, map(weakref.ref, grads)))
        _consume(map(pass_versions.__setitem__, key, map(_VERSION, grads)))
        return True

    def _drain(self) -> list[tuple[int, Optional[torch.Tensor], int]]:
        """Count the passes the hooks noted, in their order, each against what the previous pass
        of its parameter left (see the module docstring); returns what they noted, for the
        caller to clear."""
        if self._found:
            self._take_found()
        seen = self._seen
        if not seen:
            return seen
        passes, clear, refs = self._passes, self._clear, self._ref
        pass_refs, pass_versions = self._pass_ref, self._pass_version
        ref_to = weakref.ref
        for i, grad, version in seen:
            if grad is None:  # nothing to compare (a hook of the user's own set it to None)
                passes[i] += 1
                continue
            if passes[i]:  # a later pass: compare with what the previous pass left
                last = pass_refs[i]
                if last is not None and last() is grad:
                    before, pass_versions[i] = pass_versions[i], version
                    if version - before <= 1:
                        passes[i] += 1
                    else:  # zero-filled since the previous pass
                        passes[i], clear[i] = 1, CLEAR_ZERO
                    continue
                passes[i], clear[i] = 1, CLEAR_NONE  # set to None since the previous pass
                pass_refs[i], pass_versions[i] = ref_to(grad), version
                continue
            passes[i] = 1
            ref = refs[i]
            old, old_version = _NO_GRAD if ref is None else ref
            if old() is grad:
                pass_refs[i], pass_versions[i] = old, version
                clear[i] = CLEAR_NOT if version - old_version <= 1 else CLEAR_ZERO
            else:
                pass_refs[i], pass_versions[i] = ref_to(grad), version
                if ref is not None:
                    clear[i] = CLEAR_NONE
        return seen

    def _take_found(self) -> None:
        """The pre-hooks' notes as the notes a hook after the accumulation would have made: a
        `.grad` found is one more pass into it, in place (its version one on), and none found is a
        new tensor (`_FRESH`, like no tensor left before), or, after a pass that left none (a hook
        of the user's own set it to None), nothing to compare. What each pass left is read after
        the count (`_left`): autograd's new tensor, or one that replaced it inside the backward
        (DDP's bucket view), which no note here names."""
        found, passes = self._found, self._passes
        slots = list(map(_FIRST, found))
        self._began += slots
        if (
            not any(map(operator.is_not, map(_SECOND, found), repeat(None)))
            and not any(map(passes.__getitem__, slots))
            and not any(map(operator.is_, map(self._ref.__getitem__, slots), repeat(None)))
            and len(set(slots)) == len(slots)
        ):  # the usual first pass after a step whose zero_grad() set every `.grad` to None: each
            # one pass after a clear to None, as `_drain` reads it, with no loop in Python
            _consume(map(passes.__setitem__, slots, repeat(1)))
            _consume(map(self._clear.__setitem__, slots, repeat(CLEAR_NONE)))
            found.clear()
            return
        note, pass_refs = self._seen.append, self._pass_ref
        for i, grad, version in found:
            if grad is not None:
                note((i, grad, version + 1))
            elif passes[i] and pass_refs[i] is _DEAD:
                note((i, None, 0))
            else:
                note((i, _FRESH, 0))
        found.clear()

    def _left(self) -> None:
        """What the passes `_take_found` counted left in `.grad`: what the next pass is compared with."""
        began = self._began
        if not began:
            return
        params, pass_refs, pass_versions = self._params, self._pass_ref, self._pass_version
        grads = list(map(_GRAD, map(params.__getitem__, began)))
        if not any(map(operator.is_, grads, repeat(None))):  # in C, as `_scan_new`
            _consume(map(pass_refs.__setitem__, began, map(weakref.ref, grads)))
            _consume(map(pass_versions.__setitem__, began, map(_VERSION, grads)))
        else:
            for i, grad in zip(began, grads):
                if grad is None:
                    pass_refs[i], pass_versions[i] = _DEAD, 0
                else:
                    pass_refs[i], pass_versions[i] = weakref.ref(grad), grad._version
        began.clear()

    def end_step(self, indices: Optional[Collection[int]] = None) -> tuple[list[int], list[Optional[float]]]:
        """Passes and clear codes (None = nothing to say) of the reported parameters `indices`
        (default: all) since the last step; starts a new step. See `_end_step`."""
        if not self._shared:
            return self._end_step(indices)
        reported = range(len(self._slot)) if indices is None else indices
        slot = self._slot
        distinct = list(dict.fromkeys(slot[i] for i in reported))
        passes, clear = self._end_step(distinct)
        at = {u: k for k, u in enumerate(distinct)}
        return [passes[at[slot[i]]] for i in reported], [clear[at[slot[i]]] for i in reported]

    def _end_step(self, indices: Optional[Collection[int]] = None) -> tuple[list[int], list[Optional[float]]]:
        """Passes and clear codes (None = nothing to say) since the last step; starts a new step.

        Called after every optimizer step, and for steps a GradScaler skipped, with the hooked
        parameters of the optimizer that stepped (default: all); the lists cover those only.
        Plain lists, no numpy: this runs on the training thread at every step.
        """
        params, refs = self._params, self._ref
        self._drain().clear()  # a backward that failed never ran its callback, nor one that could not queue it
        self._left()
        if self._can_settle and not self._at_step[0]:
            self._settling[0] = False
        if indices is None:  # one optimizer: whole lists at once
            passes, clear = self._passes[:], self._clear[:]
            self._passes[:] = [0] * len(params)
            self._clear[:] = [None] * len(params)
            # each `.grad` read and weakly held by `map`s, in C (no loop in Python)
            grads = list(map(_GRAD, params))
            if not any(map(operator.is_, grads, repeat(None))):
                refs[:] = zip(map(weakref.ref, grads), map(_VERSION, grads))
                return passes, clear
            indices = range(len(params))
        else:
            passes, clear = [self._passes[i] for i in indices], [self._clear[i] for i in indices]
            for i in indices:
                self._passes[i], self._clear[i] = 0, None
        for i in indices:
            g = params[i].grad
            refs[i] = _NO_GRAD if g is None else (weakref.ref(g), g._version)
        return passes, clear

    def end_one(self, i: int) -> int:
        """`end_step([i])`'s passes for one reported parameter (an unmeasured step's sentinel),
        on the training thread at every step: no lists, and the `.grad` the step leaves is not
        noted, as it tells only the next pass's clear, which no unmeasured step asks (the step
        before a measured one notes every `.grad`: `end_step`)."""
        u = self._slot[i]
        seen = self._seen
        if seen:  # counted at the step, or a backward that never ran its callback
            if len(seen) == 1 and seen[0][0] == u and not self._passes[u]:
                self._passes[u] = 1  # one pass: how `.grad` was cleared before it is not asked
                seen.clear()
            else:
                self._drain().clear()
                self._left()
        if self._can_settle and not self._at_step[0]:
            self._settling[0] = False
        passes = self._passes[u]
        self._passes[u], self._clear[u] = 0, None
        return passes

    def remove(self) -> None:
        self._scanned = []
        for hooked in self._nodes.values():
            _unhook(*hooked)
        self._nodes.clear()


#: autograd's queue for callbacks run when the running backward ends
_QUEUE_CALLBACK = torch.autograd.Variable._execution_engine.queue_callback


def process_group() -> bool:
    """Whether a process group is up: DDP or FSDP may write `.grad` inside a backward (DDP's
    reducer does at world size 1 too, where the watcher has no `dist`)."""
    return _DIST_AVAILABLE and _dist_initialized()


_DIST_AVAILABLE = torch.distributed.is_available()
_dist_initialized: Callable[[], bool] = torch.distributed.is_initialized if _DIST_AVAILABLE else bool


class _Hook(NamedTuple):
    """A hook of the tracker's: its handle and on-flag, and what it holds (`GradTracker.arm`)."""

    handle: RemovableHandle
    on: list[bool]
    #: the gradient accumulator node it is on, held while armed (a node hook)
    node: Any = None
    #: the tensor whose pre-hook it is
    before: Optional[torch.Tensor] = None


def _unhook(handle: RemovableHandle, on: list[bool], node: Any = None, before: Optional[torch.Tensor] = None) -> None:
    """Turn a hook off and remove it. A tensor left with no pre-hook has its hook dict cleared,
    which drops torch's side of it too (the dict torch keeps for a node's hooks, or for a
    tensor's post-accumulate-grad hooks, costs every backward a call even empty)."""
    on[0] = False
    handle.remove()
    if before is not None and not before._backward_hooks:
        before._backward_hooks = None


def _accumulator(p: torch.Tensor) -> Any:
    """The AccumulateGrad node of leaf `p` (made if no graph holds one now), as DDP finds it.
    Called with grad mode on (`arm_slots`)."""
    view = p.view_as(p).grad_fn
    if view is None:
        raise RuntimeError("no autograd graph for a parameter that requires grad")
    return view.next_functions[0][0]

"""The training hot path: fused norms on the training device, one device-to-host copy per step.

A measured step is `Probe.begin`, then per optimizer `Probe.read_grads` (the gradients as its
step uses them, just before it) and `Probe.read_state` (the parameters and optimizer state as the
step left them), then `Probe.finish`; all only enqueue device work. The norms
of one step are concatenated into one vector per device and copied to the host once: on CUDA into
pinned memory with ``non_blocking=True`` and an event, so the training thread never waits for the
GPU. `Snapshot.resolve` (on the sender thread) waits for that copy and scatters the vector back
into per-parameter arrays. Each read makes one vector of norms; one `cat` per device joins
them, on the training thread (on the sender thread joining costs that thread more than it saves
this one). Why: docs/design.md, The hook; figures: docs/benchmarks.md.

Every norm is of this rank's local piece of a parameter (`WatchedParam.view`: a DTensor's local
tensor, an FSDP1 FlatParameter's slice; pieces.py), never of a gathered tensor: no collective.
"""

from __future__ import annotations

import operator
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, Optional, Union

import numpy as np
import torch

from .accumulation import grad_nbytes, local_nbytes
from .amp import AmpScaler
from .layout import Layout
from .pieces import View
from .signals import optimizer_signals
from .states import Quantized, quantized, state_of
from .wire import ABSENT_BITS, GRAD_STATUS_NONE, GRAD_STATUS_NONFINITE, GRAD_STATUS_NONZERO, GRAD_STATUS_ZERO

#: Optimizer state keys that are not per-element buffers even when shaped like a scalar parameter.
_SCALAR_STATE_KEYS = frozenset({"step"})


#: On CPU `_foreach_norm` reduces each tensor on one thread. A tensor of at least this many
#: elements is reduced by rows of `_CPU_ROW` instead (`vector_norm(dim=1)` spreads rows over
#: torch's threads), then the rows' norms in the one fused call: large tensors then read at close
#: to the speed of a multi-threaded `.sum()` over the same bytes (docs/benchmarks.md).
_CPU_ROWS_MIN_NUMEL = 1 << 17
_CPU_ROW = 4096
#: On CPU the fused norm costs each tensor a few microseconds of dispatch, more than reading a
#: small one: tensors of one shape and dtype with at most `_STACK_MAX_NUMEL` elements are copied
#: into one matrix (at most `_STACK_CHUNK` elements, which stay in the cache) whose row norms are
#: theirs, bit for bit (docs/benchmarks.md).
_STACK_MAX_NUMEL = 4096
_STACK_CHUNK = 1 << 18


def fused_norms(tensors: list[torch.Tensor], plan: Optional[NormPlan] = None) -> torch.Tensor:
    """L2 norm of each tensor, as one float32 vector on their device: one fused call per device
    (on CPU, plus a row-parallel reduction per large tensor and one per run of small ones).
    `plan`, from `norm_plan`, says how; worked out here when not given."""
    if not tensors:
        return torch.zeros(0)
    if plan is None:
        plan = norm_plan(tensors)
    return planned_norms(plan, *plan.gather(tensors))


def planned_norms(plan: NormPlan, fused: Tensors, runs: Sequence[Tensors], ordered: bool = True) -> torch.Tensor:
    """`fused_norms` of the tensors that `plan.gather` gave as `fused` and `runs` (a caller that
    reads the same tensors at every step gathers them once). `ordered=False`: in the order they
    are computed, where norm k is tensor `plan.slots[k]`'s (one indexing op less, for a caller
    that places each norm by its own index)."""
    parts = []
    if fused:
        if plan.prep:
            fused = [f(t) if f else t for t, f in zip(fused, plan.prep)]
        try:
            parts.append(torch.stack(torch._foreach_norm(fused, 2, dtype=torch.float32)))
        except TypeError:  # torch < 2.3 has no dtype argument: norms come in the tensors' dtype
            parts.append(torch.stack([n.float() for n in torch._foreach_norm(fused, 2)]))
    for run in runs:
        rows = torch.stack(run)
        if rows.dim() != 2:  # a run of vectors stacks as the matrix of their rows already
            rows = rows.view(len(run), -1)
        parts.append(torch.linalg.vector_norm(rows, dim=1, dtype=torch.float32))
    norms = parts[0] if len(parts) == 1 else torch.cat(parts)
    return norms if plan.order is None or not ordered else norms[plan.order]


#: Tensors as `NormPlan.gather` gives them (itemgetter makes tuples).
Tensors = Union[list[torch.Tensor], tuple[torch.Tensor, ...]]
#: What `fused_norms` does to a tensor before the fused call: a tensor with the same norm.
Prep = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class NormPlan:
    """How `fused_norms` reads a list of tensors (`norm_plan`). It depends on their devices,
    dtypes, shapes and layouts only: a plan made from parameters holds for their `.grad`s where
    it has no prep (a `.grad` has its parameter's device, dtype and shape, not always its layout)."""

    #: per tensor of the fused call, what is done to it first (`norm_preps`); [] where nothing
    prep: list[Optional[Prep]]
    #: the tensors read by the fused call; None: all of them
    fused: Optional[list[int]] = None
    #: runs of small CPU tensors of one shape and dtype, each read as the rows of one matrix
    stacked: tuple[list[int], ...] = ()
    #: where each tensor's norm is among the fused call's then the runs' (None: in order)
    order: Optional[torch.Tensor] = None
    #: the tensor whose norm each of those is (`order`'s inverse; None: in order)
    slots: Optional[np.ndarray] = None

    #: `gather`'s getters (operator.itemgetter: the lists are made in C, not by a loop here)
    _fused: Optional[Callable[[Tensors], Tensors]] = field(init=False, repr=False, compare=False, default=None)
    _runs: list[Callable[[Tensors], Tensors]] = field(init=False, repr=False, compare=False, default_factory=list)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_fused", None if self.fused is None else _items(self.fused))
        object.__setattr__(self, "_runs", [_items(run) for run in self.stacked])

    def gather(self, tensors: Tensors) -> tuple[Tensors, list[Tensors]]:
        """The tensors of the fused call and of each stacked run, out of `tensors`."""
        fused = tensors if self._fused is None else self._fused(tensors)
        return fused, [get(tensors) for get in self._runs]


def _items(indices: list[int]) -> Callable[[Tensors], Tensors]:
    """A getter of the items `indices` of a sequence, as a tuple (`itemgetter` of one index
    gives the item itself)."""
    if len(indices) < 2:
        only = indices[:1]
        return lambda seq: tuple(seq[i] for i in only)
    return operator.itemgetter(*indices)


def norm_plan(tensors: list[torch.Tensor]) -> NormPlan:
    """`fused_norms`' plan for `tensors`."""
    prep = norm_preps(tensors)
    runs: dict[tuple[torch.Size, torch.dtype], list[int]] = {}
    for i, (t, f) in enumerate(zip(tensors, prep)):
        if f is None and t.device.type == "cpu" and t.layout == torch.strided and 0 < t.numel() <= _STACK_MAX_NUMEL:
            runs.setdefault((t.shape, t.dtype), []).append(i)
    stacked: list[list[int]] = []
    for (shape, _), idx in runs.items():
        if len(idx) > 1:
            per = max(1, _STACK_CHUNK // max(1, shape.numel()))
            stacked += [idx[j : j + per] for j in range(0, len(idx), per)]
    if not stacked:
        return NormPlan(prep if any(prep) else [])
    taken = {i for run in stacked for i in run}
    fused = [i for i in range(len(tensors)) if i not in taken]
    fused_prep = [prep[i] for i in fused]
    slots = fused + [i for run in stacked for i in run]  # the tensor whose norm each slot holds
    order = torch.empty(len(slots), dtype=torch.long)
    order[torch.tensor(slots)] = torch.arange(len(slots))
    return NormPlan(fused_prep if any(fused_prep) else [], fused, tuple(stacked), order, np.asarray(slots))


def norm_preps(tensors: list[torch.Tensor]) -> list[Optional[Prep]]:
    """Per tensor, what `fused_norms` does to it first, or None: a large contiguous float32 one
    on CPU is reduced by rows; one the fused float32 norm refuses (float64 and complex, which it
    would have to narrow; integers and bools, a custom optimizer's per-element counts or masks)
    gets its own norm, in its own precision."""
    return [
        _norm_apart
        if t.dtype not in _FUSED_DTYPES
        else _rows_norms
        if (
            t.numel() >= _CPU_ROWS_MIN_NUMEL
            and t.numel() % _CPU_ROW == 0
            and t.device.type == "cpu"
            and t.dtype == torch.float32
            and t.is_contiguous()
        )
        else None
        for t in tensors
    ]


#: The dtypes whose norms `_foreach_norm` computes as float32.
_FUSED_DTYPES = frozenset({torch.float32, torch.float16, torch.bfloat16})
_GRAD = operator.attrgetter("grad")
_IS_SPARSE = operator.attrgetter("is_sparse")


def _norm_apart(t: torch.Tensor) -> torch.Tensor:
    """`t`'s norm as a float32 0-d tensor, whose own norm it is: float64 and complex in their
    precision, anything else (integers, bools) as float32."""
    exact = t.is_complex() or t.dtype == torch.float64
    norm: torch.Tensor = torch.linalg.vector_norm(t if exact else t.float()).float()
    return norm


def _rows_norms(t: torch.Tensor) -> torch.Tensor:
    """The norms of `t`'s rows of `_CPU_ROW` elements: their norm is the norm of `t`."""
    norms: torch.Tensor = torch.linalg.vector_norm(t.view(-1, _CPU_ROW), dim=1)
    return norms


@dataclass
class _StatePlan:
    """What `read_state` reads for a set of parameters, kept between steps.

    torch optimizers update their state tensors in place, so the same tensors are read every
    step; rebuilding the lists from the state dicts cost more than the norms on models of many
    small tensors. A plan is used only while each optimizer's state mapping, every parameter's
    state dict, its size and every listed tensor are still the ones it was built from (identity
    checks), else it is rebuilt. `load_state_dict` replaces the mapping (its old dicts and
    tensors stay in the old one, which nothing updates any more).
    """

    checks: list[
        tuple[dict[Any, Any], torch.Tensor, Optional[dict[str, Any]], int, tuple[str, ...], tuple[torch.Tensor, ...]]
    ]
    #: per device: the tensors in reading order, how `fused_norms` reads them (`norm_plan`), and
    #: the segments they make: (metric, parameter indices, count)
    reads: list[tuple[list[torch.Tensor], NormPlan, list[tuple[str, np.ndarray, int]]]]
    optimizer_bytes: int  # every tensor in the states, the scalar ones (`step`) included
    #: per device, parallel to its tensors: the view of this rank's piece (DTensor, FSDP1) to
    #: take at each step, or None everywhere when no tensor needs one
    views: list[Optional[list[Optional[View]]]] = field(default_factory=list)
    #: quantized state (states.py): (metric, parameter index, its codes and scales), read apart
    quantized: list[tuple[str, int, Quantized]] = field(default_factory=list)
    #: each optimizer read, with the state mapping it had (`state_of`)
    mappings: list[tuple[torch.optim.Optimizer, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        # `checks` flattened for `valid`, whose loops then run in C (map, all): per distinct
        # state mapping, its parameters with a state and those without; every state's expected
        # size; every (state, key, tensor) listed
        self._with: dict[int, tuple[dict[Any, Any], list[torch.Tensor], list[dict[str, Any]]]] = {}
        self._without: dict[int, tuple[dict[Any, Any], list[torch.Tensor]]] = {}
        self._sizes: list[int] = []
        self._owners: list[dict[str, Any]] = []
        self._keys: list[str] = []
        self._tensors: list[torch.Tensor] = []
        for states, p, state, size, keys, tensors in self.checks:
            if state is None:
                self._without.setdefault(id(states), (states, []))[1].append(p)
                continue
            _, ps, expected = self._with.setdefault(id(states), (states, [], []))
            ps.append(p)
            expected.append(state)
            self._sizes.append(size)
            self._owners += [state] * len(keys)
            self._keys += keys
            self._tensors += tensors
        self._expected = [state for _, _, expected in self._with.values() for state in expected]
        self._dicts = all(isinstance(state, dict) for state in self._expected)  # else `valid` asks each one
        #: per device, its tensors as `fused_norms` reads them (`NormPlan.gather`), gathered once
        #: where they are read as they are (None where pieces' views are taken at each step)
        self.gathered = [
            None if views is not None else how.gather(tensors)
            for (tensors, how, _), views in zip(self.reads, self.views)
        ]
        #: per device, its norms' stretches in the order they are computed (`planned_norms`
        #: unordered): (metric, parameter indices, count), a stretch per metric where none is stacked
        self.layouts = [_layout(segments, how.slots) for _, how, segments in self.reads]

    def valid(self) -> bool:
        is_ = operator.is_
        if not all(state_of(o) is states for o, states in self.mappings):
            return False
        if not self._dicts:  # a custom optimizer's state mappings
            for states, p, state, size, keys, tensors in self.checks:
                now = states.get(p)
                if state is None:
                    if now:
                        return False
                elif now is not state or len(now) != size or not all(map(is_, map(now.get, keys), tensors)):
                    return False
            return True
        return (
            all(
                # a mapping of these parameters alone, in this order (the optimizer's first step
                # made their states in it), is compared entry by entry without hashing a tensor
                (len(states) == len(ps) and all(map(is_, states, ps)) and all(map(is_, states.values(), expected)))
                or all(map(is_, map(states.get, ps), expected))
                for states, ps, expected in self._with.values()
            )
            and not any(any(map(states.get, ps)) for states, ps in self._without.values())
            and list(map(len, self._expected)) == self._sizes
            and all(map(is_, map(dict.get, self._owners, self._keys), self._tensors))
        )


def _layout(
    segments: list[tuple[str, np.ndarray, int]], slots: Optional[np.ndarray]
) -> list[tuple[str, np.ndarray, int]]:
    """`segments` (metric, parameter indices, count: the tensors in reading order) as the
    stretches of norms computed in the order `slots` (None: reading order) says."""
    if slots is None:
        return segments
    metrics = np.repeat(np.arange(len(segments)), [count for _, _, count in segments])[slots]
    params = np.concatenate([idx for _, idx, _ in segments])[slots]
    cuts = [0, *(np.flatnonzero(metrics[1:] != metrics[:-1]) + 1).tolist(), len(slots)]
    return [(segments[metrics[a]][0], params[a:b], b - a) for a, b in zip(cuts, cuts[1:])]


@dataclass
class _Segment:
    """`values[k]` (a float32 vector on the device) is metric `metric` of parameter `index[k]`
    (a scalar when `index` is None)."""

    metric: str
    index: Optional[np.ndarray]
    values: torch.Tensor
    #: where `values` holds several metrics' stretches: (metric, parameter indices, count) of
    #: each, in order (`metric` and `index` then unused)
    layout: Optional[Sequence[tuple[str, Optional[np.ndarray], int]]] = None


@dataclass
class _DeviceBuffer:
    """One device's norms on the host: (metric, parameter indices, count) per stretch of `host`.
    Only counts, not the segments: their tensors are freed on the training thread, as soon as
    they are joined, rather than on the sender thread."""

    segments: list[tuple[str, Optional[np.ndarray], int]]
    host: torch.Tensor
    event: Optional[torch.cuda.Event] = None


#: per-parameter metrics made on the host (`Snapshot.host_metrics`), or what makes them
HostMetrics = Union[dict[str, np.ndarray], Callable[[], dict[str, np.ndarray]]]


@dataclass
class Snapshot:
    """One sampled step's measurements, on their way from the device to the sender thread."""

    step: int
    time: float
    num_params: int
    buffers: list[_DeviceBuffer]
    scalars: dict[str, float]
    grad_bytes: np.ndarray  # bytes of each parameter's .grad (0 where None)
    #: per-parameter metrics made on the host, NaN = ABSENT; or what makes them, called on the
    #: sender thread (`host_arrays`): the training thread hands over its lists as they are
    host_metrics: HostMetrics = field(default_factory=dict)
    cost_s: float = 0.0  # training-thread seconds spent measuring this step

    def host_arrays(self) -> dict[str, np.ndarray]:
        """`host_metrics`, made now where it was handed over as what makes them."""
        if callable(self.host_metrics):
            self.host_metrics = self.host_metrics()
        return self.host_metrics

    def resolve(self) -> tuple[dict[str, np.ndarray], np.ndarray, dict[str, float]]:
        """Wait for the copies, then build per-parameter arrays, grad status and scalars."""
        metrics: dict[str, np.ndarray] = {"grad_norm": _absent(self.num_params)}
        scalars = dict(self.scalars)
        for buf in self.buffers:
            if buf.event is not None:
                buf.event.synchronize()
            host = buf.host.numpy()
            offset = 0
            for metric, index, n in buf.segments:
                chunk = host[offset : offset + n]
                offset += n
                if index is None:
                    scalars[metric] = float(chunk[0])
                else:
                    metrics.setdefault(metric, _absent(self.num_params))[index] = chunk
        for name, values in self.host_arrays().items():
            metrics[name] = np.where(np.isnan(values), _absent(self.num_params), values).astype(np.float32)
        status = grad_status(metrics["grad_norm"])
        grads = metrics["grad_norm"][status != GRAD_STATUS_NONE].astype(np.float64)
        scalars["grad_norm_total"] = float(np.sqrt(np.sum(grads * grads)))
        scalars["mem/grads_bytes"] = float(self.grad_bytes.sum())
        scalars["mem/zero_grad_bytes"] = float(self.grad_bytes[status == GRAD_STATUS_ZERO].sum())
        return metrics, status, scalars


def _absent(n: int) -> np.ndarray:
    return np.full(n, ABSENT_BITS, dtype=np.uint32).view(np.float32)


def is_absent(values: np.ndarray) -> np.ndarray:
    absent: np.ndarray = values.view(np.uint32) == ABSENT_BITS
    return absent


def grad_status(grad_norm: np.ndarray) -> np.ndarray:
    """Status code per parameter from its grad norm (ABSENT means `.grad is None`)."""
    status = np.full(grad_norm.shape, GRAD_STATUS_NONZERO, dtype=np.uint8)
    status[grad_norm == 0] = GRAD_STATUS_ZERO
    status[~np.isfinite(grad_norm)] = GRAD_STATUS_NONFINITE
    status[is_absent(grad_norm)] = GRAD_STATUS_NONE
    return status


@dataclass
class _Pending:
    step: int
    time: float
    segments: list[_Segment] = field(default_factory=list)
    grad_bytes: Optional[np.ndarray] = None
    before: dict[int, torch.Tensor] = field(default_factory=dict)  # parameter copies, with updates=True
    optimizer_bytes: int = 0
    cost_s: float = 0.0


class Probe:
    """Measures one step of the optimizers of a `Layout`."""

    def __init__(
        self, layout: Layout, amp: Optional[AmpScaler] = None, updates: bool = False, signals: bool = False
    ) -> None:
        self.layout = layout
        self.amp = amp
        self.updates = updates
        #: also the optimizer signals of signals.py (eps_share, v_decoupling, momentum_cosine)
        self.signals = signals
        self.params = [w.param for w in layout.params]
        #: per parameter, the view of this rank's piece (pieces.py); None: the tensor itself
        self.views: list[Optional[View]] = [w.view for w in layout.params]
        self._owns_bytes = [w.shard.owns_bytes for w in layout.params]
        #: with updates, a distributed run also sends `param_before_norm` (the server's update_ratio)
        self._before_norms = layout.rank is not None
        self.params_bytes = float(sum(local_nbytes(w.param) for w in layout.params if w.shard.owns_bytes))
        self._devices = {p.device for p in self.params}
        self._cuda = any(d.type == "cuda" for d in self._devices)
        #: `cuda_memory` reads counters (some parameter is on a GPU); else it is always empty
        self.reads_memory = self._cuda
        #: `lr/G` per param group so far: made once, not formatted (and hashed) anew every step
        self._lr_names: list[str] = []
        #: one device and whole tensors (no pieces): `read_grads` takes its short path
        self._plain = len(self._devices) == 1 and all(v is None for v in self.views)
        #: how `fused_norms` reads every parameter's `.grad`, made from the parameters where it
        #: holds for them (see `NormPlan`): no parameter is large enough to be read by rows
        self._grad_plan: Optional[NormPlan] = None
        if all(p.numel() < _CPU_ROWS_MIN_NUMEL for p in self.params):
            self._grad_plan = norm_plan(self.params)
        #: every parameter's bytes, where `read_plain_grads` may take them for its dense `.grad`'s
        self._param_nbytes: Optional[np.ndarray] = None
        if self._plain and not any(p.is_sparse for p in self.params):
            self._param_nbytes = np.array([p.nbytes for p in self.params], dtype=np.int64)
        self._every_index = np.arange(len(self.params))
        #: the parameter of each norm of every `.grad`, in the order `_grad_plan` computes them
        self._grad_index = self._every_index
        if self._grad_plan is not None and self._grad_plan.slots is not None:
            self._grad_index = self._every_index[self._grad_plan.slots]
        self._plans: dict[Optional[tuple[int, ...]], _StatePlan] = {}  # by the indices read_state is given
        self._pending: Optional[_Pending] = None
        self._pinned: dict[int, list[torch.Tensor]] = {}  # free pinned host buffers by length

    # -- training thread -------------------------------------------------------------------
    def begin(self, step: int) -> None:
        """Start measuring `step`: `read_grads` and `read_state` add to it until `finish`."""
        self._pending = _Pending(step=step, time=time.time(), grad_bytes=np.zeros(len(self.params), dtype=np.int64))

    @torch.no_grad()
    def read_grads(self, indices: Optional[Collection[int]] = None, optimizer: Optional[int] = None) -> None:
        """Gradient norms as the step will use them (unscaled when a GradScaler scaled them).

        `indices` (default: all) are the parameters of `optimizer`, which is about to step: with
        several optimizers each one's gradients are read just before its own step. With
        `updates`, also a copy of those parameters (memory: one more copy of the parameters,
        held during the step) so that `read_state` can measure ‖p_after − p_before‖ exactly.
        """
        pending = self._pending
        if pending is None:
            return
        started = time.perf_counter()
        assert pending.grad_bytes is not None
        if self._plain:
            self._read_plain_grads(pending, indices, optimizer)
        else:
            self._read_grads(pending, indices, optimizer)
        if self.updates:
            views = self.views
            for i in range(len(self.params)) if indices is None else indices:
                p, view = self.params[i].detach(), views[i]
                pending.before[i] = (p if view is None else view(p)).clone()
        pending.cost_s += time.perf_counter() - started

    def _read_plain_grads(
        self, pending: _Pending, indices: Optional[Collection[int]], optimizer: Optional[int]
    ) -> None:
        """`read_grads` on one device without pieces (a single-process run): one pass over the
        `.grad`s, and what `fused_norms` does to each worked out only where it can matter (a
        measured step's Python is a share of its cost that grows with the tensor count)."""
        params, idx, ts, nbytes = self.params, [], [], []
        if indices is None and self._param_nbytes is not None:  # one optimizer: every parameter
            grads = list(map(_GRAD, params))
            if all(map(operator.is_not, grads, repeat(None))) and not any(map(_IS_SPARSE, grads)):
                # every `.grad` there and dense: it has its parameter's size and dtype (torch
                # enforces both), so its bytes are the parameter's; the lists are made by `map`, in C
                assert pending.grad_bytes is not None
                pending.grad_bytes[:] = self._param_nbytes
                self._plain_norms(pending, self._grad_index, grads, optimizer, self._grad_plan)
                return
        for i in range(len(params)) if indices is None else indices:
            g = params[i].grad
            if g is not None:
                if g.is_sparse:  # nn.Embedding(sparse=True): fused norms take dense tensors only
                    nbytes.append(grad_nbytes(g))
                    g = g.coalesce().values()
                else:
                    nbytes.append(g.nbytes)
                idx.append(i)
                ts.append(g)
        if not ts:
            return
        index = np.asarray(idx)
        assert pending.grad_bytes is not None
        pending.grad_bytes[index] = nbytes
        self._plain_norms(pending, index, ts, optimizer)

    def _plain_norms(
        self,
        pending: _Pending,
        index: np.ndarray,
        ts: list[torch.Tensor],
        optimizer: Optional[int],
        plan: Optional[NormPlan] = None,
    ) -> None:
        """The norms of `read_plain_grads`' gradients `ts` (of the parameters `index`), read as
        `plan` says (worked out here when None), in the order the plan computes them: a given
        `plan`'s `index` is in that order already (`plan.slots`)."""
        if plan is None:
            plan = norm_plan(ts)
            if plan.slots is not None:
                index = index[plan.slots]
        norms = planned_norms(plan, *plan.gather(ts), ordered=False)  # placed by their index instead
        inv_scale = self._inverse_scale(ts[0].device, optimizer)
        if inv_scale is not None:
            norms = norms * inv_scale
        pending.segments.append(_Segment("grad_norm", index, norms))

    def _read_grads(self, pending: _Pending, indices: Optional[Collection[int]], optimizer: Optional[int]) -> None:
        """`read_grads` in general: grouped by device, each rank's piece of a parameter."""
        assert pending.grad_bytes is not None
        by_device: dict[torch.device, tuple[list[int], list[torch.Tensor]]] = {}
        views, owns = self.views, self._owns_bytes
        for i in range(len(self.params)) if indices is None else indices:
            g = self.params[i].grad
            if g is not None:
                view = views[i]
                if view is not None:  # this rank's piece; a shared tensor's bytes count once
                    pending.grad_bytes[i] = local_nbytes(g) if owns[i] else 0
                    g = view(g)
                else:
                    pending.grad_bytes[i] = grad_nbytes(g)
                if g.is_sparse:  # nn.Embedding(sparse=True): fused norms take dense tensors only
                    g = g.coalesce().values()
                idx, ts = by_device.setdefault(g.device, ([], []))
                idx.append(i)
                ts.append(g)
        for device, (idx, ts) in by_device.items():
            norms = fused_norms(ts)
            inv_scale = self._inverse_scale(device, optimizer)
            if inv_scale is not None:
                norms = norms * inv_scale
            pending.segments.append(_Segment("grad_norm", np.asarray(idx), norms))

    @torch.no_grad()
    def read_state(self, indices: Optional[Collection[int]] = None) -> None:
        """Parameter and optimizer-state norms of `indices` (default: all) as the step left them."""
        pending = self._pending
        if pending is None:
            return
        started = time.perf_counter()
        if pending.before:
            before, pending.before = pending.before, {}
            pending.segments.extend(self._updates(before))
        key = None if indices is None else tuple(indices)
        plan = self._plans.get(key)
        if plan is None or not plan.valid():
            plan = self._plans[key] = self._state_plan(range(len(self.params)) if indices is None else indices)
        pending.optimizer_bytes += plan.optimizer_bytes
        for (tensors, how, _), views, gathered, layout in zip(plan.reads, plan.views, plan.gathered, plan.layouts):
            if gathered is None:  # pieces' views are taken anew: FSDP swaps its params' storage
                gathered = how.gather([t if v is None else v(t) for t, v in zip(tensors, views or ())])
            # in the order they are computed: the layout places each stretch (no indexing op, no slices)
            pending.segments.append(_Segment("", None, planned_norms(how, *gathered, ordered=False), layout))
        for metric, i, q in plan.quantized:
            pending.segments.append(_Segment(metric, np.asarray([i]), q.norm().reshape(1)))
        if self.signals:
            pending.segments.extend(self._signals(range(len(self.params)) if indices is None else indices))
        pending.cost_s += time.perf_counter() - started

    @torch.no_grad()
    def finish(self, extra_scalars: dict[str, Any], host_metrics: Optional[HostMetrics] = None) -> Optional[Snapshot]:
        """Add the step's scalars and enqueue the one device-to-host copy per device."""
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        started = time.perf_counter()
        segments = pending.segments
        scalars: dict[str, float] = {
            "mem/params_bytes": self.params_bytes,
            "mem/optimizer_bytes": float(pending.optimizer_bytes),
        }
        for key, value in self.group_lrs(extra_scalars).items():
            if isinstance(value, torch.Tensor):
                if value.device.type == "cpu":
                    scalars[key] = float(value.detach().reshape(-1)[0]) if value.numel() else float("nan")
                elif value.numel():  # rides along with the one device-to-host copy instead of syncing now
                    segments.append(_Segment(key, None, value.detach().reshape(-1)[:1].float()))
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                scalars[key] = float(value)
        buffers = self._to_host(segments)
        return Snapshot(
            step=pending.step,
            time=pending.time,
            num_params=len(self.params),
            buffers=buffers,
            scalars=scalars,
            grad_bytes=pending.grad_bytes if pending.grad_bytes is not None else np.zeros(0),
            host_metrics=host_metrics or {},
            cost_s=pending.cost_s + time.perf_counter() - started,
        )

    def group_lrs(self, scalars: dict[str, Any]) -> dict[str, Any]:
        """`scalars` with `lr/G` of every param group added (read now: schedulers change them)."""
        layout, names = self.layout, self._lr_names
        keys = layout.group_keys
        if len(names) != len(keys):  # a group added since (`add_param_group`)
            names[:] = [f"lr/{g}" for g in range(len(keys))]
        optimizers = layout.optimizers
        for name, (o, gi) in zip(names, keys):
            scalars.setdefault(name, optimizers[o].param_groups[gi].get("lr"))
        return scalars

    def cheap_facts(self, scalars: dict[str, Any]) -> dict[str, float]:
        """What a step not measured still records, at a cost that does not grow with the number
        of parameters (no device work, no pass over the parameters): learning rates, the
        parameters' bytes and the user's numbers (the CUDA counters come with `scalars`): every
        number as a float, a CPU tensor of one element read, anything else left out."""
        out: dict[str, float] = {}
        for k, v in self.group_lrs(scalars).items():
            if type(v) is float:  # the usual case, first: no conversion, no isinstance
                out[k] = v
            elif (isinstance(v, (int, float)) and not isinstance(v, bool)) or (
                isinstance(v, torch.Tensor) and v.device.type == "cpu" and v.numel() == 1
            ):
                out[k] = float(v)
        out["mem/params_bytes"] = self.params_bytes
        return out

    def cuda_memory(self) -> dict[str, float]:
        """The CUDA allocator's counters for the parameters' devices (none on CPU), host-side reads.
        The watcher reads them as a step begins (after backward, before the update), before the
        hook makes any tensor of its own, so that they are the training's alone."""
        return cuda_memory(self._devices) if self._cuda else {}

    def recycle(self, snapshot: Snapshot) -> None:
        """Give a snapshot's pinned buffers back for reuse (sender thread, after `resolve`)."""
        for buf in snapshot.buffers:
            if buf.event is not None:
                self._pinned.setdefault(buf.host.numel(), []).append(buf.host)

    # -- helpers ---------------------------------------------------------------------------
    def _state_plan(self, indices: Iterable[int]) -> _StatePlan:
        """Parameter norms of `indices`, then each state key's (named `<key>_norm`), grouped by device."""
        by_device: dict[torch.device, dict[str, tuple[list[int], list[torch.Tensor], list[Optional[View]]]]] = {}
        checks: list[
            tuple[
                dict[Any, Any], torch.Tensor, Optional[dict[str, Any]], int, tuple[str, ...], tuple[torch.Tensor, ...]
            ]
        ] = []
        nbytes = 0
        quantized: list[tuple[str, int, Quantized]] = []
        used: set[int] = set()  # the optimizers of `indices`
        for i in indices:
            w = self.layout.params[i]
            used.add(w.optimizer)
            p = w.param
            idx, ts, vs = by_device.setdefault(p.device, {}).setdefault("param_norm", ([], [], []))
            idx.append(i)
            ts.append(p)
            vs.append(w.view)
            states = state_of(self.layout.optimizers[w.optimizer])  # a sharded optimizer's: this rank's
            state = states.get(p)
            if not state:
                checks.append((states, p, None, 0, (), ()))
                continue
            tensors, size, packed = _state_tensors(p, state)
            if w.shard.owns_bytes:  # the pieces of one FSDP1 FlatParameter share its state
                nbytes += size
            kept = tensors + [(k, state[k]) for k, _ in packed]
            checks.append((states, p, state, len(state), tuple(k for k, _ in kept), tuple(t for _, t in kept)))
            quantized += [(f"{k}_norm", i, q) for k, q in packed]
            for k, t in tensors:
                idx, ts, vs = by_device.setdefault(t.device, {}).setdefault(f"{k}_norm", ([], [], []))
                idx.append(i)
                ts.append(t)
                vs.append(w.view)
        reads, views = [], []
        for metrics in by_device.values():
            on_device = [t for _, ts, _ in metrics.values() for t in ts]
            viewed: Optional[list[Optional[View]]] = [v for _, _, vs in metrics.values() for v in vs]
            if viewed is not None and any(viewed):
                on_device = [t if v is None else v(t) for t, v in zip(on_device, viewed)]
            else:
                viewed = None
            segments = [(m, np.asarray(idx), len(ts)) for m, (idx, ts, _) in metrics.items()]
            # the plan is worked out on the local views: their shapes and layouts stay the same
            reads.append(([t for _, ts, _ in metrics.values() for t in ts], norm_plan(on_device), segments))
            views.append(viewed)
        mappings = [(o, state_of(o)) for o in (self.layout.optimizers[k] for k in sorted(used))]
        return _StatePlan(checks, reads, nbytes, views, quantized, mappings)

    def _updates(self, before: dict[int, torch.Tensor]) -> list[_Segment]:
        """`update_norm` = ‖p_after − p_before‖ and `update_ratio` = update_norm / ‖p_before‖."""
        segments = []
        by_device: dict[torch.device, list[int]] = {}
        for i in before:
            by_device.setdefault(self.params[i].device, []).append(i)
        views = self.views
        for idx in by_device.values():
            old = [before[i] for i in idx]
            old_norms = fused_norms(old)
            after = [self.params[i].detach() for i in idx]
            after = [p if views[i] is None else views[i](p) for p, i in zip(after, idx)]  # type: ignore[misc]
            torch._foreach_sub_(old, after)  # old := p_before - p_after
            update = fused_norms(old)
            index = np.asarray(idx)
            segments.append(_Segment("update_norm", index, update))
            segments.append(_Segment("update_ratio", index, update / old_norms))
            if self._before_norms:  # the server divides the global norms: update_ratio is per rank
                segments.append(_Segment("param_before_norm", index, old_norms))
        return segments

    def _signals(self, indices: Iterable[int]) -> list[_Segment]:
        """signals.py's per-parameter signals of `indices` (a rank's pieces: of its local piece,
        with the norms the server combines them from), per device."""
        layout = self.layout
        states = [layout.optimizers[w.optimizer].state.get(w.param) or {} for w in layout.params]
        groups = [layout.optimizers[o].param_groups[g] for o, g in (layout.group_keys[w.group] for w in layout.params)]
        by_device: dict[torch.device, list[int]] = {}
        for i in indices:
            by_device.setdefault(self.params[i].device, []).append(i)
        return [
            _Segment(metric, np.asarray(idx), torch.stack(values))
            for on_device in by_device.values()
            for metric, idx, values in optimizer_signals(
                self.params, on_device, states, groups, self.views, pieces=self._before_norms
            )
        ]

    def inverse_scale(self, device: torch.device) -> Optional[torch.Tensor]:
        """1/scale of the GradScaler for gradients on `device` (None: not scaled)."""
        return self._inverse_scale(device)

    def _inverse_scale(self, device: torch.device, optimizer: Optional[int] = None) -> Optional[torch.Tensor]:
        """1/scale of the GradScaler unless the gradients of `optimizer` (of every optimizer when
        None) are not scaled."""
        if self.amp is None:
            return None
        optimizers = self.layout.optimizers if optimizer is None else [self.layout.optimizers[optimizer]]
        return self.amp.inverse_scale(device, optimizers)

    def _to_host(self, segments: list[_Segment]) -> list[_DeviceBuffer]:
        by_device: dict[torch.device, list[_Segment]] = {}
        for seg in segments:
            if seg.values.numel():
                by_device.setdefault(seg.values.device, []).append(seg)
        buffers = []
        for device, segs in by_device.items():
            flat = torch.cat([s.values for s in segs])
            placed: list[tuple[str, Optional[np.ndarray], int]] = []
            for s in segs:
                placed.extend(s.layout or [(s.metric, s.index, s.values.numel())])
            if device.type == "cpu":
                buffers.append(_DeviceBuffer(placed, flat))
                continue
            free = self._pinned.get(flat.numel())
            host = free.pop() if free else torch.empty(flat.numel(), dtype=torch.float32, pin_memory=True)
            with torch.cuda.device(device):
                host.copy_(flat, non_blocking=True)
                event = torch.cuda.Event()
                event.record()
            buffers.append(_DeviceBuffer(placed, host, event))
        return buffers


def _state_tensors(
    p: torch.Tensor, state: dict[str, Any]
) -> tuple[list[tuple[str, torch.Tensor]], int, list[tuple[str, Quantized]]]:
    """The state tensors shaped like `p` (by key), the bytes of all of them, and the quantized
    ones (states.py: their norm is the dequantized tensor's, read apart)."""
    tensors, nbytes, packed = [], 0, []
    for key, value in state.items():
        if not isinstance(value, torch.Tensor):
            continue
        q = quantized(key, value, state, p)
        if q is not None:
            packed.append((key, q))
            nbytes += q.nbytes
            continue
        nbytes += local_nbytes(value)
        if key not in _SCALAR_STATE_KEYS and value.shape == p.shape:
            tensors.append((key, value))
    return tensors, nbytes, packed


def cuda_memory(devices: set[torch.device]) -> dict[str, float]:
    """Allocator counters (host-side, no synchronisation) for the CUDA devices in use: what
    `torch.cuda.memory_allocated`, `memory_reserved` and `max_memory_allocated` return, read from
    one `memory_stats_as_nested_dict` per device (each of those flattens and sorts every counter
    the allocator keeps, and this runs at every step)."""
    out: dict[str, float] = {}
    for device in devices:
        if device.type != "cuda":
            continue
        index = device.index if device.index is not None else torch.cuda.current_device()
        stats = torch.cuda.memory_stats_as_nested_dict(index)
        allocated = stats.get("allocated_bytes", {}).get("all", {})
        out[f"mem/cuda:{index}/allocated"] = float(allocated.get("current", 0))
        out[f"mem/cuda:{index}/reserved"] = float(stats.get("reserved_bytes", {}).get("all", {}).get("current", 0))
        out[f"mem/cuda:{index}/peak"] = float(allocated.get("peak", 0))
    return out

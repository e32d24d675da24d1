"""Each rank's local shard (`LocalShard`) of every reported parameter, and whether it counts.

The optimizer steps tensors that may be only this rank's part of a parameter: a DTensor (FSDP2,
tensor parallelism), an FSDP1 original parameter's 1-D slice (`use_orig_params=True`), or an
FSDP1 FlatParameter holding slices of many original parameters (`use_orig_params=False`). The
hook measures the local piece of each original parameter and says how to combine the ranks'
pieces: the global norm is the square root of the sum of the squared local norms over the
pieces that are `counted` (replicas count once). No collective, no gather: only metadata that
torch keeps on this rank. The rules: docs/design.md, "Exact global norms from local pieces".
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Optional

import torch

from .distributed import job_rank

log = logging.getLogger("gradwatch")

#: The wrappers whose path component reported names leave out: (the module defining the class, the
#: class, the attribute holding the wrapped module). DDP/DataParallel, FSDP1, activation
#: checkpointing, torch.compile, Lightning Fabric, DeepSpeed: reported names are the original module's.
WRAPPERS = (
    ("torch.nn.parallel.distributed", "DistributedDataParallel", "module"),
    ("torch.nn.parallel.data_parallel", "DataParallel", "module"),
    ("torch.distributed.fsdp.fully_sharded_data_parallel", "FullyShardedDataParallel", "_fsdp_wrapped_module"),
    ("torch.distributed.algorithms._checkpoint.checkpoint_wrapper", "ActivationWrapper", "_checkpoint_wrapped_module"),
    ("torch._dynamo.eval_frame", "OptimizedModule", "_orig_mod"),
    # Lightning Fabric's `fabric.setup(model)` (its state_dict() and checkpoints say `decoder.weight`)
    ("lightning.fabric.wrappers", "_FabricModule", "_forward_module"),
    ("lightning_fabric.wrappers", "_FabricModule", "_forward_module"),
    # DeepSpeed's engine (ZeRO stage 0: its optimizers over flat partitions are refused, unwrap.py)
    ("deepspeed.runtime.engine", "DeepSpeedEngine", "module"),
)

#: A function from the tensor the optimizer steps (its param, `.grad`, a state tensor) to this
#: piece's local view of it; None where the tensor is the piece itself.
View = Callable[[torch.Tensor], torch.Tensor]

try:  # torch builds without distributed support have no DTensor
    from torch.distributed.tensor import DTensor, Replicate
except ImportError:  # pragma: no cover
    DTensor = None  # type: ignore[assignment,misc]
    Replicate = None  # type: ignore[assignment,misc]


@dataclass(frozen=True)
class LocalShard:
    """One reported parameter as this rank holds it."""

    raw_name: str  # before wrapper components are stripped
    tensor: torch.Tensor  # what the optimizer steps (shared by the pieces of an FSDP1 FlatParameter)
    shape: tuple[int, ...]  # the full (unsharded) parameter's
    numel: int
    local_numel: int
    counted: bool
    view: Optional[View] = None
    #: the first piece of its tensor: the tensor's bytes (param, grad) are counted with it
    owns_bytes: bool = True
    #: the tensor autograd accumulates into, when not `tensor` (an FSDP1 `use_orig_params=True`
    #: parameter's FlatParameter): backward passes are counted on it
    accumulates: Optional[torch.Tensor] = None

    @property
    def accumulated(self) -> torch.Tensor:
        """The tensor whose backward passes are this piece's."""
        return self.tensor if self.accumulates is None else self.accumulates


def is_dtensor(t: torch.Tensor) -> bool:
    return DTensor is not None and isinstance(t, DTensor)


def to_local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local tensor (a view, no communication), any other tensor itself."""
    if DTensor is not None and isinstance(t, DTensor):
        with torch.no_grad():
            local: torch.Tensor = t.to_local()
        return local
    return t


@dataclass(frozen=True)
class FlatSlice:
    """The slice `[start, stop)` of a flat 1-D tensor (an FSDP1 FlatParameter's local shard, its
    `.grad`, its state): one original parameter's elements on this rank, never padding."""

    start: int
    stop: int

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        return t[self.start : self.stop]


def local_shards(
    params: Sequence[torch.Tensor], names: dict[int, str], model: Any, rank: Optional[int]
) -> list[list[LocalShard]]:
    """The reported pieces of each of `params` (the optimizer's tensors; an FSDP1 FlatParameter
    has one per original parameter), named from `names` (id -> name, wrappers not stripped yet).
    `model` is searched for FSDP1 modules; `rank` is `distributed.job_rank()`."""
    fsdp1 = _fsdp1_handles(model)
    out: list[list[LocalShard]] = []
    unfound = False
    for p in params:
        name = names[id(p)]
        flat = fsdp1.flat.get(id(p))
        if flat is not None or getattr(p, "_is_flat_param", False):
            unfound = unfound or flat is None
            out.append(_flat_pieces(p, name, flat))
        elif id(p) in fsdp1.orig:
            out.append([_orig_piece(p, name, *fsdp1.orig[id(p)])])
        elif is_dtensor(p):
            out.append([_dtensor_piece(p, name)])
        else:  # a replica in a distributed job (DDP, or left out of FSDP): rank 0's counts
            out.append([LocalShard(name, p, tuple(p.shape), p.numel(), p.numel(), rank is None or rank == 0)])
    if unfound:
        log.warning(
            "gradwatch: FSDP1 FlatParameters whose modules are not in model=: their pieces are named "
            "after the optimizer's parameters and counted on every rank (wrong under NO_SHARD or "
            "HYBRID_SHARD); pass the FSDP model to watch(model=...)"
        )
    return out


def wrapper_paths(model: Any) -> frozenset[str]:
    """The paths in `model` (a Module; anything else has none) of the modules that `WRAPPERS`
    wrap, such as `module` of a DDP model or `enc._checkpoint_wrapped_module`: the path components
    that `strip_names` leaves out. A user's own attribute named `module` is no wrapper's."""
    if not isinstance(model, torch.nn.Module):
        return frozenset()
    # a wrapper's class is loaded wherever one exists: no import here (torch._dynamo's is slow)
    classes = [
        (cls, attr)
        for where, name, attr in WRAPPERS
        if isinstance(cls := getattr(sys.modules.get(where), name, None), type)
    ]
    found = set()
    for prefix, module in model.named_modules():
        for cls, attr in classes:
            if isinstance(module, cls):
                found.add(f"{prefix}.{attr}" if prefix else attr)
    return frozenset(found)


def strip_names(names: Sequence[str], wrappers: frozenset[str] = frozenset()) -> list[str]:
    """`names` without the path components that are `wrappers` (see `wrapper_paths`); a name whose
    stripped form two names share keeps its original (names must stay unique, and the originals are)."""
    stripped = [_strip(n, wrappers) for n in names]
    count: dict[str, int] = {}
    for s in stripped:
        count[s] = count.get(s, 0) + 1
    return [s if count[s] == 1 else n for n, s in zip(names, stripped)]


def _strip(name: str, wrappers: frozenset[str]) -> str:
    if not wrappers:
        return name
    parts = name.split(".")
    kept = [c for i, c in enumerate(parts) if ".".join(parts[: i + 1]) not in wrappers]
    return ".".join(kept) or name


# -- DTensor (FSDP2, HSDP, tensor parallelism) -------------------------------------------------
def _dtensor_piece(p: torch.Tensor, name: str) -> LocalShard:
    """Counted iff this rank is at coordinate 0 of every mesh dimension on which the parameter
    is replicated (a replica counts once; shards all count)."""
    assert DTensor is not None and Replicate is not None and isinstance(p, DTensor)
    coordinate = p.device_mesh.get_coordinate()
    counted = coordinate is not None and all(
        c == 0 for c, placement in zip(coordinate, p.placements) if isinstance(placement, Replicate)
    )
    return LocalShard(name, p, tuple(p.shape), p.numel(), to_local(p).numel(), counted, view=to_local)


# -- FSDP1 (FullyShardedDataParallel) ----------------------------------------------------------
@dataclass
class _Fsdp1:
    flat: dict[int, tuple[Any, str, bool]]  # id(FlatParameter) -> (it, its module's prefix, counted)
    orig: dict[int, tuple[Any, int, bool]]  # id(original param) -> (its FlatParameter, index, counted)


def _fsdp1_handles(model: Any) -> _Fsdp1:
    """The FlatParameters of the FSDP1 modules in `model`, with their modules' name prefixes and
    whether this rank's shards count (see `_fsdp1_counted`)."""
    found = _Fsdp1({}, {})
    if not isinstance(model, torch.nn.Module):
        return found
    for prefix, module in model.named_modules():
        handle = getattr(module, "_handle", None)
        flat = getattr(handle, "flat_param", None)
        if flat is None or not getattr(flat, "_is_flat_param", False):
            continue
        counted = _fsdp1_counted(module, handle)
        found.flat[id(flat)] = (flat, f"{prefix}." if prefix else "", counted)
        for k, orig in enumerate(getattr(flat, "_params", None) or ()):
            found.orig[id(orig)] = (flat, k, counted)
    return found


def _fsdp1_counted(module: Any, handle: Any) -> bool:
    """FSDP1 shards count on every rank; a strategy that replicates keeps one copy: NO_SHARD's
    (every rank holds the whole) counts on rank 0; HYBRID_SHARD's on the first rank of each
    replica group (rank 0 of the inter-node group, a local lookup)."""
    strategy = getattr(getattr(handle, "_sharding_strategy", None), "name", "")
    if strategy == "NO_SHARD":
        return job_rank() in (None, 0)
    if strategy in ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2"):
        group = getattr(module, "_inter_node_pg", None)
        if group is not None:
            return int(torch.distributed.get_rank(group)) == 0
    return True


def _flat_pieces(flat: torch.Tensor, name: str, found: Optional[tuple[Any, str, bool]]) -> list[LocalShard]:
    """One piece per original parameter of an FSDP1 FlatParameter: the slice of the local shard
    at `offset_in_shard` of `numel_in_shard` elements (padding belongs to no piece)."""
    counted = True if found is None else found[2]
    prefix = found[1] if found is not None else name.removesuffix("_flat_param").rstrip(".")
    if found is None and prefix:
        prefix += "."
    out = []
    for k, (fqn, shape, info) in enumerate(zip(flat._fqns, flat._shapes, flat._shard_param_infos)):  # type: ignore[attr-defined]
        start = info.offset_in_shard if info.in_shard else 0
        numel = info.numel_in_shard if info.in_shard else 0
        out.append(
            LocalShard(
                f"{prefix}{fqn}",
                flat,
                tuple(shape),
                int(torch.Size(shape).numel()),
                numel,
                counted,
                view=FlatSlice(start, start + numel),
                owns_bytes=k == 0,
            )
        )
    return out


def _orig_piece(p: torch.Tensor, name: str, flat: Any, k: int, counted: bool) -> LocalShard:
    """An FSDP1 `use_orig_params=True` parameter: the tensor is this rank's 1-D slice already;
    its full shape is the FlatParameter's record of it."""
    shape = tuple(flat._shapes[k])
    return LocalShard(name, p, shape, int(torch.Size(shape).numel()), p.numel(), counted, accumulates=flat)

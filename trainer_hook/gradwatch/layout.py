"""Which parameters are watched, in which order, under which names.

The order fixed here is the order of every per-parameter array on the wire and in storage.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from .distributed import job_rank
from .pieces import LocalShard, View, local_shards, strip_names, wrapper_paths

#: Hyperparameters worth showing per param group; others (e.g. `params`, callables) are skipped.
_HPARAM_TYPES = (int, float, bool, str, type(None))


@dataclass(frozen=True)
class WatchedParam:
    name: str
    optimizer: int
    group: int  # index counting across optimizers, as in the `lr/G` scalars
    #: this rank's shard of the parameter: the tensor the optimizer steps, the full shape, the
    #: local view and whether it counts (pieces.py)
    shard: LocalShard

    @property
    def param(self) -> torch.Tensor:
        """What the optimizer steps (several FSDP1 pieces share one FlatParameter)."""
        return self.shard.tensor

    @property
    def view(self) -> Optional[View]:
        return self.shard.view


@dataclass
class Layout:
    optimizers: list[torch.optim.Optimizer]
    params: list[WatchedParam]
    #: (optimizer index, group index within it) of each global group index
    group_keys: list[tuple[int, int]] = field(default_factory=list)
    #: `requires_grad` parameters of the model that no optimizer updates
    unoptimized: list[str] = field(default_factory=list)
    #: optimizer parameters with requires_grad=False: no gradient is expected for them
    frozen: list[str] = field(default_factory=list)
    #: this process's rank in a distributed job (`distributed.job_rank()`), None when it runs alone
    rank: Optional[int] = None

    def hello_params(self) -> list[dict[str, Any]]:
        """The `params` of the hello: `local_numel` and `counted` where they say something (a
        distributed job, or a shard that is not the whole parameter), so a single-process
        hello is what it always was."""
        out = []
        for w in self.params:
            shard = w.shard
            entry: dict[str, Any] = {
                "name": w.name,
                "shape": list(shard.shape),
                "numel": shard.numel,
                "dtype": str(shard.tensor.dtype).removeprefix("torch."),
                "group": w.group,
                "optimizer": w.optimizer,
            }
            if self.rank is not None or shard.local_numel != shard.numel or not shard.counted:
                entry["local_numel"] = shard.local_numel
                entry["counted"] = shard.counted
            out.append(entry)
        return out

    def hello_groups(self) -> list[dict[str, Any]]:
        out = []
        for g, (o, i) in enumerate(self.group_keys):
            group = self.optimizers[o].param_groups[i]
            out.append(
                {
                    "optimizer": o,
                    "index": g,
                    "name": group.get("name") if isinstance(group.get("name"), str) else None,
                    "hparams": hparams(group),
                }
            )
        return out


def hparams(group: dict[str, Any]) -> dict[str, Any]:
    """JSON-safe hyperparameters of a param group (tensors become floats: read once, at watch())."""
    out: dict[str, Any] = {}
    for key, value in group.items():
        if key in ("params", "name"):
            continue
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = float(value)
        if isinstance(value, tuple):
            value = list(value)
        if isinstance(value, _HPARAM_TYPES) or (
            isinstance(value, list) and all(isinstance(v, (int, float)) for v in value)
        ):
            if isinstance(value, float) and value != value:
                continue
            out[key] = value
    return out


def named_parameters(model: Any) -> list[tuple[str, torch.Tensor]]:
    """`model.named_parameters()` of a Module, or the (name, parameter) pairs given instead
    (e.g. `[*gen.named_parameters("gen"), *disc.named_parameters("disc")]`); TypeError otherwise."""
    if model is None:
        return []
    if isinstance(model, torch.nn.Module):
        return list(model.named_parameters())
    if isinstance(model, (str, bytes, torch.Tensor)) or not hasattr(model, "__iter__"):
        raise TypeError(
            "model must be a torch.nn.Module or (name, parameter) pairs such as "
            f"model.named_parameters(), not {type(model).__name__}"
        )
    pairs = list(model)
    for pair in pairs:
        if not (
            isinstance(pair, tuple)
            and len(pair) == 2
            and isinstance(pair[0], str)
            and isinstance(pair[1], torch.Tensor)
        ):
            raise TypeError(
                f"model: expected (name, parameter) pairs such as model.named_parameters(); got {pair!r:.80}"
            )
    return pairs


_UNSET: Any = object()


def build_layout(optimizers: Sequence[torch.optim.Optimizer], model: Any, rank: Optional[int] = _UNSET) -> Layout:
    """The reported parameters of `optimizers` (each FSDP1 FlatParameter expanded into its
    original parameters), named from `model` without the path components of its wrappers. `rank`: this
    process's rank in a distributed job, None alone (default: `distributed.job_rank()`)."""
    if rank is _UNSET:
        rank = job_rank()
    named = named_parameters(model)
    names: dict[int, str] = {}
    for name, p in named:
        names.setdefault(id(p), name)
    layout = Layout(optimizers=list(optimizers), params=[], rank=rank)
    seen: set[int] = set()
    where: list[tuple[torch.Tensor, int, int]] = []
    for o, opt in enumerate(optimizers):
        for i, group in enumerate(opt.param_groups):
            g = len(layout.group_keys)
            layout.group_keys.append((o, i))
            for j, p in enumerate(group["params"]):
                if id(p) in seen:
                    continue  # torch forbids this within one optimizer; across two, watch it once
                seen.add(id(p))
                names.setdefault(id(p), f"opt{o}.group{i}.param{j}" if len(optimizers) > 1 else f"group{i}.param{j}")
                where.append((p, o, g))
    expanded = local_shards([p for p, _, _ in where], names, model, rank)
    found = [(shard, o, g) for (_, o, g), each in zip(where, expanded) for shard in each]
    unoptimized = [n for n, p in named if p.requires_grad and id(p) not in seen]
    shown = strip_names([shard.raw_name for shard, _, _ in found] + unoptimized, wrapper_paths(model))
    layout.params = [WatchedParam(name, o, g, shard) for (shard, o, g), name in zip(found, shown)]
    layout.frozen = [w.name for w in layout.params if not w.param.requires_grad]
    layout.unoptimized = shown[len(found) :]
    return layout

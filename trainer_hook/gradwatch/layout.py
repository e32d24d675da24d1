"""Which parameters are watched, in which order, under which names.

The order fixed here is the order of every per-parameter array on the wire and in storage.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

#: Hyperparameters worth showing per param group; others (e.g. `params`, callables) are skipped.
_HPARAM_TYPES = (int, float, bool, str, type(None))


@dataclass(frozen=True)
class WatchedParam:
    name: str
    param: torch.Tensor
    optimizer: int
    group: int  # index counting across optimizers, as in the `lr/G` scalars


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

    def hello_params(self) -> list[dict[str, Any]]:
        return [
            {
                "name": w.name,
                "shape": list(w.param.shape),
                "numel": w.param.numel(),
                "dtype": str(w.param.dtype).removeprefix("torch."),
                "group": w.group,
                "optimizer": w.optimizer,
            }
            for w in self.params
        ]

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


def build_layout(optimizers: Sequence[torch.optim.Optimizer], model: Any) -> Layout:
    named = named_parameters(model)
    names: dict[int, str] = {}
    for name, p in named:
        names.setdefault(id(p), name)
    layout = Layout(optimizers=list(optimizers), params=[])
    seen: set[int] = set()
    for o, opt in enumerate(optimizers):
        for i, group in enumerate(opt.param_groups):
            g = len(layout.group_keys)
            layout.group_keys.append((o, i))
            for j, p in enumerate(group["params"]):
                if id(p) in seen:
                    continue  # torch forbids this within one optimizer; across two, watch it once
                seen.add(id(p))
                fallback = f"opt{o}.group{i}.param{j}" if len(optimizers) > 1 else f"group{i}.param{j}"
                layout.params.append(WatchedParam(names.get(id(p), fallback), p, o, g))
    layout.frozen = [w.name for w in layout.params if not w.param.requires_grad]
    layout.unoptimized = [n for n, p in named if p.requires_grad and id(p) not in seen]
    return layout

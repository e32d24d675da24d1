"""Where an optimizer keeps its per-parameter state, when not in its own `.state`.

`torch.distributed.optim.ZeroRedundancyOptimizer` steps every parameter (its `param_groups` are
the whole model's), but each rank's state lives in its local optimizer, `.optim`, for the
parameters that rank owns: the others have no state on this rank. The hook reads this rank's state
there; the server counts a state that exists on one rank only once (docs/distributed.md).
"""

from __future__ import annotations

from typing import Any

import torch

#: (module, class, attribute holding the optimizer whose `.state` is this rank's)
SHARDED = (("torch.distributed.optim.zero_redundancy_optimizer", "ZeroRedundancyOptimizer", "optim"),)


def state_of(optimizer: torch.optim.Optimizer) -> Any:
    """The mapping parameter -> state dict that holds `optimizer`'s state on this rank."""
    cls = type(optimizer)
    for module, name, attr in SHARDED:
        if cls.__name__ == name and cls.__module__ == module:
            inner = getattr(optimizer, attr, None)
            if isinstance(inner, torch.optim.Optimizer):
                return inner.state
    return optimizer.state

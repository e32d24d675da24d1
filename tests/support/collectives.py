"""Count the collectives a process makes, and which of them gradwatch's own code made.

`count_collectives()` wraps, in this process, every Python entry into a collective or a
point-to-point operation of `torch.distributed`: the c10d functions (`all_reduce`, `broadcast`,
`barrier`, `send`, ...) under both `torch.distributed` and `torch.distributed.distributed_c10d`,
the functional collectives, `DTensor.full_tensor`/`redistribute`, and the `ProcessGroup` methods
that all of them end in (looked up on the class at each call, so a module that bound
`from torch.distributed import all_reduce` before the wrapping is still seen). Each call is
recorded with whether a frame of the `gradwatch` package is on the calling thread's stack.
Calls that DistributedDataParallel's reducer makes from C++ go through none of these and are
not seen: they are DDP's own, never gradwatch's.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

#: The c10d functions of the issue's list (and their close relatives).
C10D_FUNCTIONS = (
    "all_reduce",
    "all_reduce_coalesced",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_gather_coalesced",
    "broadcast",
    "broadcast_object_list",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "barrier",
    "monitored_barrier",
    "send",
    "recv",
    "isend",
    "irecv",
    "batch_isend_irecv",
    "all_to_all",
    "all_to_all_single",
    "gather",
    "gather_object",
    "scatter",
    "scatter_object_list",
    "reduce",
)
FUNCTIONAL = ("all_reduce", "all_gather_tensor", "reduce_scatter_tensor", "broadcast", "all_to_all_single")
#: ProcessGroup methods that are no communication.
_PG_NOT_COMMUNICATION = frozenset(
    {
        "abort",
        "bound_device_id",
        "boxed",
        "unbox",
        "get_group_store",
        "group_desc",
        "group_name",
        "name",
        "rank",
        "size",
        "set_timeout",
        "shutdown",
        "split_group",
        "merge_remote_group",
        "use_pg_for_symm_mem_rendezvous",
    }
)

_origin = importlib.util.find_spec("gradwatch")
assert _origin is not None and _origin.origin is not None
GRADWATCH_DIR = str(Path(_origin.origin).resolve().parent)


def in_gradwatch(depth: int = 2) -> bool:
    """Whether a frame of the gradwatch package is on the calling thread's stack."""
    frame = sys._getframe(depth)
    while frame is not None:
        if str(Path(frame.f_code.co_filename).resolve()).startswith(GRADWATCH_DIR):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


@dataclass
class Counted:
    #: every call seen: (what was called, whether gradwatch's code made it)
    calls: list[tuple[str, bool]] = field(default_factory=list)

    def by_gradwatch(self) -> list[str]:
        return [name for name, ours in self.calls if ours]


def _wrap(owner: Any, name: str, label: str, counted: Counted) -> None:
    original: Callable[..., Any] = getattr(owner, name)

    def counting(*args: Any, **kwargs: Any) -> Any:
        counted.calls.append((label, in_gradwatch()))
        return original(*args, **kwargs)

    setattr(owner, name, counting)


def count_collectives() -> Counted:
    """Wrap every entry listed in the module docstring, in this process, for good."""
    counted = Counted()
    for module in (dist, dist.distributed_c10d):
        for name in C10D_FUNCTIONS:
            if hasattr(module, name):
                _wrap(module, name, f"{module.__name__}.{name}", counted)
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.tensor import DTensor

    for name in FUNCTIONAL:
        _wrap(funcol, name, f"funcol.{name}", counted)
    for name in ("full_tensor", "redistribute"):
        _wrap(DTensor, name, f"DTensor.{name}", counted)
    pg = torch._C._distributed_c10d.ProcessGroup
    for name in dir(pg):
        public = not name.startswith("_") and name not in _PG_NOT_COMMUNICATION
        if (public or name in ("_allgather_base", "_reduce_scatter_base")) and callable(getattr(pg, name)):
            if not isinstance(getattr(pg, name), type) and not name.isupper():
                _wrap(pg, name, f"ProcessGroup.{name}", counted)
    return counted

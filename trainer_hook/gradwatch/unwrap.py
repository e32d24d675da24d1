"""The torch optimizer inside a framework's wrapper: `watch()` hooks the one that really steps.

accelerate's `AcceleratedOptimizer` keeps it in `.optimizer`, Lightning's `LightningOptimizer` in
`._optimizer`. Such wrappers often pass `isinstance(w, torch.optim.Optimizer)` without running `Optimizer.__init__`, so they have no
step hooks, and their `step()` is not the hooked one: only the inner optimizer's step runs the
hooks, and only when it really steps (accelerate's accumulation, a skipped AMP step).

DeepSpeed's ZeRO optimizers (and its BF16_Optimizer) are refused: the torch optimizer inside them
steps flat fp32 partitions, not the model's parameters, so its norms would be of partitions and
every parameter of the model would read as left out of the optimizer.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from .amp import is_grad_scaler

#: attributes in which known wrappers keep the optimizer they wrap, in the order tried
INNER_ATTRIBUTES = ("optimizer", "_optimizer")
MAX_DEPTH = 8  # wrappers of wrappers; a cycle of references must not loop forever
#: DeepSpeed optimizers over flat partitions, by module prefix and by class name (also seen
#: through a wrapper such as accelerate's DeepSpeedOptimizerWrapper)
PARTITIONED_MODULES = ("deepspeed.runtime.zero", "deepspeed.runtime.bf16_optimizer")
PARTITIONED_CLASSES = ("DeepSpeedZeroOptimizer", "BF16_Optimizer")


def qualified_name(obj: object) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def _inner(obj: object) -> Any:
    """The optimizer `obj` wraps (in one of INNER_ATTRIBUTES), or None."""
    for name in INNER_ATTRIBUTES:
        try:
            inner: object = getattr(obj, name, None)
        except Exception:  # a property of the wrapper that cannot answer now
            inner = None
        if inner is not None and inner is not obj and hasattr(inner, "param_groups"):
            return inner
    return None


def _check_not_partitioned(obj: object) -> None:
    """TypeError for a DeepSpeed optimizer over flat partitions (see the module docstring)."""
    cls = type(obj)
    module, name = getattr(cls, "__module__", "") or "", cls.__name__
    if module.startswith(PARTITIONED_MODULES) or name.startswith(PARTITIONED_CLASSES):
        raise TypeError(
            f"watch() cannot measure {module}.{name}: DeepSpeed's ZeRO optimizers step flat "
            "partitions of the parameters, and ZeRO partitions are not supported yet; watch a run "
            "without ZeRO (zero_optimization stage 0 and no bf16 optimizer), or pass a plain "
            "torch.optim.Optimizer over the model's parameters"
        )


def _hookable(obj: object) -> bool:
    """A torch optimizer whose `Optimizer.__init__` ran: it has step hooks of its own."""
    return isinstance(obj, torch.optim.Optimizer) and "_optimizer_step_pre_hooks" in vars(obj)


def unwrap(optimizer: Any) -> tuple[torch.optim.Optimizer, list[Any]]:
    """The innermost torch optimizer of `optimizer` and the wrappers around it, outermost first.

    TypeError, naming the type and what to pass instead, for anything else.
    """
    wrappers: list[Any] = []
    obj = optimizer
    while True:
        _check_not_partitioned(obj)
        inner = _inner(obj)
        if inner is None or len(wrappers) >= MAX_DEPTH:
            break
        wrappers.append(obj)
        obj = inner
    if _hookable(obj):
        assert isinstance(obj, torch.optim.Optimizer)
        return obj, wrappers
    what = type(optimizer).__name__
    if wrappers:
        raise TypeError(
            f"watch() unwrapped {what} down to {type(obj).__name__}, which is not a torch.optim.Optimizer "
            "it can hook; pass the torch.optim.Optimizer that steps the parameters"
        )
    if isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            f"watch() cannot hook {what}: it is a torch.optim.Optimizer whose Optimizer.__init__ never "
            "ran (a wrapper?) and it keeps no optimizer in .optimizer or ._optimizer; pass the "
            "torch.optim.Optimizer it wraps"
        )
    raise TypeError(
        f"watch() needs a torch.optim.Optimizer (or a list of them) as its first argument, not {what}; "
        "a framework's wrapper works when it keeps the torch optimizer in .optimizer or ._optimizer, "
        "otherwise pass the torch.optim.Optimizer itself"
    )


def find_scaler(wrappers: list[Any]) -> Optional[Any]:
    """The GradScaler a wrapper steps with (accelerate's `AcceleratedOptimizer.scaler`), if any."""
    for wrapper in wrappers:
        scaler = getattr(wrapper, "scaler", None)
        if scaler is not None and is_grad_scaler(scaler):
            return scaler
    return None

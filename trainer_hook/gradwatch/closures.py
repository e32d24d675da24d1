"""Optimizer steps that take a closure: `optimizer.step(closure)`.

LBFGS requires one, and Lightning's automatic optimization runs forward, backward and gradient
clipping inside `optimizer.step(closure=...)`. The step pre-hook then fires before this step's
gradients exist, so gradwatch swaps in a wrapper of the closure (a step pre-hook may replace the
step's arguments) that counts its evaluations and, right after the first one returns, lets the
watcher read the gradients. The closure is never called an extra time.

Which evaluation's gradients a step "uses": the first's. Those are the gradients of the loss at
the parameters the step starts from (after whatever the closure does to them, such as clipping),
the same thing `grad_norm` means for a step without a closure; SGD, Adam and the other
single-evaluation optimizers use exactly these. LBFGS evaluates the closure again at trial points
of its iterations and line search; those evaluations are counted (`closure_calls`) but their
backward passes belong to no step's accumulation.

Lightning's manual optimization steps with a closure that does nothing (`LightningOptimizer.step()`
without one passes its `do_nothing_closure`, which the precision plugin wraps in a
`functools.partial`): the backward passes ran before the step, so such a step is a plain step,
measured in the pre-hook, with no `closure_calls`. It is known by identity when Lightning is
already imported (gradwatch never imports it) and otherwise by its qualified name.
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable, Optional

Closure = Callable[[], Any]

#: modules whose `do_nothing_closure` is the closure of a Lightning manual-optimization step
DO_NOTHING_MODULES = ("lightning.pytorch.core.optimizer", "pytorch_lightning.core.optimizer")
MAX_PARTIALS = 4  # partials of partials, looked through to find the closure they wrap


def _is_do_nothing(obj: object) -> bool:
    for name in DO_NOTHING_MODULES:
        module = sys.modules.get(name)
        if module is not None and obj is getattr(module, "do_nothing_closure", None):
            return True
    return (
        getattr(obj, "__qualname__", None) == "do_nothing_closure"
        and getattr(obj, "__module__", None) in DO_NOTHING_MODULES
    )


def does_nothing(closure: object) -> bool:
    """Whether `closure` is Lightning's `do_nothing_closure`, bare or as an argument of the
    `functools.partial` its precision plugin wraps it in."""
    for _ in range(MAX_PARTIALS):
        if _is_do_nothing(closure):
            return True
        if not isinstance(closure, functools.partial):
            return False
        if any(_is_do_nothing(a) for a in closure.args) or any(_is_do_nothing(v) for v in closure.keywords.values()):
            return True
        closure = closure.func
    return False


def step_closure(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Optional[Closure]:
    """The closure of an `optimizer.step(...)` call as a step pre-hook sees it (`args[0]` is the
    optimizer), or None (also for a closure that `does_nothing`)."""
    closure = kwargs.get("closure") if "closure" in kwargs else (args[1] if len(args) > 1 else None)
    return closure if callable(closure) and not does_nothing(closure) else None


def with_closure(
    args: tuple[Any, ...], kwargs: dict[str, Any], closure: Closure
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The step's arguments with its closure replaced by `closure`."""
    if "closure" in kwargs:
        return args, {**kwargs, "closure": closure}
    return (args[0], closure, *args[2:]), kwargs


class CountedClosure:
    """Counts the evaluations of one step's closure and runs `after_first` once the first returned.

    `wrap` returns a plain function (optimizers decorate the closure, e.g. LBFGS with
    `torch.enable_grad()`). An exception of the user's closure propagates untouched.
    """

    def __init__(self, after_first: Callable[[], None]) -> None:
        self.calls = 0
        self._after_first = after_first

    def wrap(self, closure: Closure) -> Closure:
        def counted() -> Any:
            out = closure()
            self.calls += 1
            if self.calls == 1:
                self._after_first()
            return out

        return counted

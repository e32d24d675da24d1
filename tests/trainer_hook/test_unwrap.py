"""DeepSpeed's ZeRO optimizers are refused by `watch()` with a TypeError that says why and what to do.

DeepSpeed cannot be installed here (it builds CUDA ops at install time and needs a GPU toolchain), so
the test defines classes that carry DeepSpeed's module and class names, shaped as ZeRO's are: a
wrapper that is not a hookable torch optimizer and keeps a real torch optimizer, over a flat
partition, in `.optimizer`. What the refusal reads is the type's module and name, which these carry.
"""

from __future__ import annotations

import pytest
import torch

import gradwatch

pytestmark = pytest.mark.unit

NOWHERE = "http://127.0.0.1:9"


def zero_like(module: str, name: str) -> type:
    """A class named `name` in `module`, holding its inner torch optimizer in `.optimizer` and
    showing its `param_groups`."""

    def __init__(self: object, model: torch.nn.Module) -> None:
        flat = torch.nn.Parameter(torch.cat([p.detach().reshape(-1) for p in model.parameters()]))
        self.optimizer = torch.optim.Adam([flat])  # type: ignore[attr-defined]

    def param_groups(self: object) -> list[dict[str, object]]:  # as ZeRO's: those of the flat partition
        return self.optimizer.param_groups  # type: ignore[attr-defined, no-any-return]

    return type(name, (), {"__module__": module, "__init__": __init__, "param_groups": property(param_groups)})


@pytest.mark.parametrize(
    "module, name",
    [
        ("deepspeed.runtime.zero.stage_1_and_2", "DeepSpeedZeroOptimizer"),
        ("deepspeed.runtime.zero.stage3", "DeepSpeedZeroOptimizer_Stage3"),
        ("deepspeed.runtime.bf16_optimizer", "BF16_Optimizer"),
        ("somewhere.else", "DeepSpeedZeroOptimizer"),  # re-exported or subclassed elsewhere: the name says it
    ],
)
def test_zero_optimizers_are_refused(module: str, name: str) -> None:
    model = torch.nn.Linear(3, 2)
    optimizer = zero_like(module, name)(model)
    with pytest.raises(TypeError, match=r"ZeRO partitions are not supported yet.*stage 0"):
        gradwatch.watch(optimizer, model=model, server=NOWHERE)


def test_zero_is_refused_behind_another_wrapper() -> None:
    """accelerate's DeepSpeedOptimizerWrapper keeps the ZeRO optimizer in `.optimizer`."""
    model = torch.nn.Linear(3, 2)
    zero = zero_like("deepspeed.runtime.zero.stage_1_and_2", "DeepSpeedZeroOptimizer")(model)
    outer = type("DeepSpeedOptimizerWrapper", (), {"__module__": "accelerate.utils.deepspeed"})()
    outer.optimizer = zero
    outer.param_groups = zero.optimizer.param_groups
    with pytest.raises(TypeError, match="DeepSpeedZeroOptimizer"):
        gradwatch.watch(outer, model=model, server=NOWHERE)


def test_other_wrappers_still_unwrap() -> None:
    model = torch.nn.Linear(3, 2)
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    outer = type("Wrapper", (), {"__module__": "deepspeed.runtime.engine"})()
    outer.optimizer = inner
    with gradwatch.watch(outer, model=model, server=NOWHERE) as w:
        assert w.layout.optimizers == [inner]
        w.close(timeout=0.1)

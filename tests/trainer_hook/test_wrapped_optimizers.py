"""Optimizers wrapped by a framework: `watch()` hooks the innermost torch optimizer, says what it
unwrapped in the run's config, finds the wrapper's GradScaler, and refuses what it cannot unwrap.

accelerate is the real package (`Accelerator(cpu=True)`); the oracle is a step pre-hook on the
inner torch optimizer, registered before gradwatch's, taking torch's own `vector_norm` of the
gradients the step uses.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

import gradwatch
from support.sent import measured, sent_steps

accelerate = pytest.importorskip("accelerate", reason="accelerate is installed by requirements-test.txt")
from accelerate import Accelerator  # noqa: E402
from accelerate.optimizer import AcceleratedOptimizer  # noqa: E402
from accelerate.state import AcceleratorState, GradientState  # noqa: E402

pytestmark = pytest.mark.unit

NOWHERE = "http://127.0.0.1:9"


def norm(t: torch.Tensor | None) -> float | None:
    return None if t is None else float(torch.linalg.vector_norm(t.detach().float()))


@pytest.fixture(autouse=True)
def fresh_accelerate_state() -> Iterator[None]:
    """accelerate keeps its state in process-wide singletons; each test gets its own."""
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def grad_oracle(opt: torch.optim.Optimizer, model: torch.nn.Module) -> list[dict[str, float | None]]:
    """Per real step of `opt`, the norm of each parameter's gradient as the step uses it."""
    seen: list[dict[str, float | None]] = []
    opt.register_step_pre_hook(lambda o, a, k: seen.append({n: norm(p.grad) for n, p in model.named_parameters()}))
    return seen


def regression(batches: int, batch_size: int = 8) -> torch.utils.data.DataLoader:
    torch.manual_seed(0)
    x = torch.randn(batches * batch_size, 6)
    y = x[:, :1] - 2 * x[:, 1:2]
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=batch_size)


def test_accelerate_accumulation_is_understood_and_equals_the_oracle() -> None:
    """`accelerator.accumulate()` with 4 micro-batches per step: the inner optimizer steps (and
    zero_grad clears) only when gradients are synchronised, so each stored step is one real
    optimizer step whose `.grad` sums 4 backward passes after a clear: intentional accumulation."""
    accelerator = Accelerator(gradient_accumulation_steps=4, cpu=True)
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    inner = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt, loader = accelerator.prepare(model, inner, regression(batches=24))
    assert isinstance(opt, AcceleratedOptimizer) and opt.optimizer is inner
    oracle = grad_oracle(inner, model)
    w = gradwatch.watch(opt, model=model, server=NOWHERE, warn=False)
    for x, y in loader:
        with accelerator.accumulate(model):
            accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
            opt.step()
            opt.zero_grad()
    msgs = sent_steps(w)
    w.close(timeout=0.1)
    assert w.step == len(oracle) == 24 // 4
    assert [m["step"] for m in measured(msgs)] == list(range(1, 7))
    for m, want in zip(msgs, oracle, strict=True):
        for name, value in want.items():
            assert m["params"]["grad_norm"][name] == pytest.approx(value, rel=1e-5), (m["step"], name)
        assert set(m["params"]["backward_passes"].values()) == {4.0}
    assert [m["params"]["grad_clear"]["0.weight"] for m in msgs] == [None] + [1.0] * 5  # zero_grad() set None
    assert w._sender.hello["run"]["config"]["wrappers"] == [["accelerate.optimizer.AcceleratedOptimizer"]]
    assert w._sender.hello["run"]["optimizer"] == "AdamW"


def test_the_accelerated_optimizers_scaler_is_found_and_its_skips_counted() -> None:
    """An AcceleratedOptimizer with a GradScaler steps through `scaler.step(inner)`; a step it
    skips never reaches the inner optimizer. Without `scaler=`, gradwatch finds the scaler: the
    skip is counted (`amp/skipped_steps`) and its backward pass is not added to the next step."""
    Accelerator(cpu=True)
    torch.manual_seed(2)
    model = torch.nn.Linear(6, 1)
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    opt = AcceleratedOptimizer(inner, scaler=scaler)
    oracle = grad_oracle(inner, model)
    w = gradwatch.watch(opt, model=model, server=NOWHERE, warn=False)
    for i in range(5):
        opt.zero_grad()
        loss = model(torch.randn(4, 6)).pow(2).mean() * (float("inf") if i == 2 else 1.0)
        scaler.scale(loss).backward()
        opt.step()  # scaler.step(inner) and scaler.update()
    msgs = sent_steps(w)
    w.close(timeout=0.1)
    assert len(oracle) == w.step == 4  # the inner optimizer stepped 4 times of 5
    assert w._sender.hello["run"]["config"]["amp"] is True
    assert [m["scalars"]["amp/skipped_steps"] for m in msgs] == [0, 0, 1, 1]
    assert [m["scalars"]["amp/scale"] for m in msgs] == [1024.0, 1024.0, 512.0, 512.0]
    assert all(m["params"]["backward_passes"]["weight"] == 1.0 for m in msgs)
    for m, want in zip(msgs, oracle, strict=True):  # the scaler unscaled them in place before the inner step
        assert m["params"]["grad_norm"]["weight"] == pytest.approx(want["weight"], rel=1e-5)


class Holder:
    """A wrapper of a wrapper, as some trainers build them."""

    def __init__(self, optimizer: Any) -> None:
        self._optimizer = optimizer


def test_nested_wrappers_are_unwrapped_and_recorded_outermost_first() -> None:
    Accelerator(cpu=True)
    model = torch.nn.Linear(2, 1)
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    w = gradwatch.watch(Holder(AcceleratedOptimizer(inner)), model=model, server=NOWHERE, warn=False)
    w.close(timeout=0.1)
    assert w.layout.optimizers == [inner]
    assert w._sender.hello["run"]["config"]["wrappers"] == [
        [f"{__name__}.Holder", "accelerate.optimizer.AcceleratedOptimizer"]
    ]


def test_a_plain_optimizer_records_no_wrappers() -> None:
    model = torch.nn.Linear(2, 1)
    w = gradwatch.watch(torch.optim.SGD(model.parameters(), lr=0.1), model=model, server=NOWHERE, warn=False)
    w.close(timeout=0.1)
    assert "wrappers" not in w._sender.hello["run"]["config"]


class HollowOptimizer(torch.optim.Optimizer):
    """Passes isinstance(…, Optimizer) but never ran Optimizer.__init__ and wraps nothing."""

    def __init__(self, params: Any) -> None:
        self.params = list(params)


class WrapsNothingUseful:
    def __init__(self) -> None:
        self.optimizer = HollowOptimizer([])
        self.optimizer.param_groups = []  # type: ignore[misc]


@pytest.mark.parametrize(
    "thing, says",
    [
        (lambda m: HollowOptimizer(m.parameters()), r"cannot hook HollowOptimizer: .*Optimizer.__init__ never ran"),
        (lambda m: WrapsNothingUseful(), r"unwrapped WrapsNothingUseful down to HollowOptimizer"),
        (lambda m: object(), r"not object; .*pass the torch.optim.Optimizer itself"),
    ],
    ids=["hollow-optimizer", "wrapper-of-hollow", "no-optimizer"],
)
def test_what_cannot_be_unwrapped_is_a_clear_type_error(thing: Any, says: str) -> None:
    model = torch.nn.Linear(2, 1)
    with pytest.raises(TypeError, match=says):
        gradwatch.watch(thing(model), model=model, server=NOWHERE, warn=False)


def test_the_same_optimizer_twice_through_its_wrapper_is_refused() -> None:
    Accelerator(cpu=True)
    model = torch.nn.Linear(2, 1)
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="same optimizer twice"):
        gradwatch.watch([inner, AcceleratedOptimizer(inner)], model=model, server=NOWHERE, warn=False)


def test_lightnings_optimizer_wrapper_is_unwrapped() -> None:
    """LightningOptimizer imitates its optimizer's class (isinstance passes) without its step
    hooks; the optimizer it wraps is in `._optimizer`."""
    core = pytest.importorskip(
        "lightning.pytorch.core.optimizer", reason="lightning is installed by requirements-test.txt"
    )
    model = torch.nn.Linear(2, 1)
    inner = torch.optim.Adam(model.parameters(), lr=0.1)
    wrapped = core.LightningOptimizer(inner)
    assert isinstance(wrapped, torch.optim.Adam)
    w = gradwatch.watch(wrapped, model=model, server=NOWHERE, warn=False)
    model(torch.randn(3, 2)).sum().backward()
    inner.step()
    msgs = sent_steps(w)
    w.close(timeout=0.1)
    assert w.layout.optimizers == [inner]
    # LightningOptimizer makes a class of its own for each optimizer class it wraps
    assert w._sender.hello["run"]["config"]["wrappers"] == [["lightning.pytorch.core.optimizer.LightningAdam"]]
    assert msgs[0]["params"]["grad_norm"]["weight"] == pytest.approx(norm(model.weight.grad), rel=1e-6)

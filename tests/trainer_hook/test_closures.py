"""Steps that take a closure (`optimizer.step(closure)`: LBFGS, Lightning's automatic
optimization): the gradients measured are those the closure's first evaluation produced, after
what it does to them (clipping here), checked against norms the closure itself takes (torch's
own `vector_norm`); closure evaluations are counted and never added to."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import gradwatch
from support.sent import measured, sent_steps

pytestmark = pytest.mark.unit

NOWHERE = "http://127.0.0.1:9"
STEPS = 5


def norm(t: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(t.detach().float()))


def train(
    make_opt: Callable[[Any], torch.optim.Optimizer], as_kwarg: bool = False, watch: bool = True, every: int = 1
) -> tuple[list[dict[str, Any]], list[list[dict[str, float]]], torch.nn.Module]:
    """A small regression stepped with a closure that zeroes, backpropagates and clips. Returns
    the steps sent, and per step the grad norms each closure evaluation left (the oracle)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    data, target = torch.randn(64, 4), torch.randn(64, 1)
    opt = make_opt(model.parameters())
    w = gradwatch.watch(opt, model=model, server=NOWHERE, warn=False, every=every) if watch else None
    evaluations: list[list[dict[str, float]]] = []
    for _ in range(STEPS):
        evaluations.append([])

        def closure() -> torch.Tensor:
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(data), target)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            evaluations[-1].append({n: norm(p.grad) for n, p in model.named_parameters()})
            return loss

        if as_kwarg:
            opt.step(closure=closure)
        else:
            opt.step(closure)
    msgs: list[dict[str, Any]] = []
    if w is not None:
        msgs = sent_steps(w)
        w.close(timeout=0.1)
    return msgs, evaluations, model


OPTIMIZERS = {
    "LBFGS": lambda p: torch.optim.LBFGS(p, lr=0.5, max_iter=4),
    "SGD": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    "Adam": lambda p: torch.optim.Adam(p, lr=1e-2),
}


@pytest.mark.parametrize("as_kwarg", [False, True], ids=["positional", "closure="])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_closure_gradients_equal_the_oracle_at_every_step(name: str, as_kwarg: bool) -> None:
    """The step's gradients are its closure's first evaluation's (the gradient at the parameters
    the step starts from); the step before any closure ran has no `.grad` at all, which today's
    pre-hook would read (None at step 1, the previous step's last evaluation after)."""
    msgs, evaluations, _ = train(OPTIMIZERS[name], as_kwarg=as_kwarg)
    assert [m["step"] for m in measured(msgs)] == list(range(1, STEPS + 1))
    for m, evals in zip(msgs, evaluations, strict=True):
        for param, want in evals[0].items():
            assert m["params"]["grad_norm"][param] == pytest.approx(want, rel=1e-5, abs=1e-7), (m["step"], param)
        assert all(status != 0 for status in m["grad_status"].values())  # every parameter has a .grad
        assert m["scalars"]["closure_calls"] == len(evals)
        assert m["scalars"]["backward_passes"] == 1.0  # LBFGS' later evaluations belong to no step
        assert set(m["params"]["backward_passes"].values()) == {1.0}
    assert [m["params"]["grad_clear"]["0.weight"] for m in msgs] == [None] + [1.0] * (STEPS - 1)
    if name == "LBFGS":
        assert all(len(e) > 1 for e in evaluations)  # several evaluations per step: the case that matters


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_the_closure_is_never_called_an_extra_time(name: str) -> None:
    """Watched or not, the same evaluations, the same trajectory."""
    _, watched, model_w = train(OPTIMIZERS[name])
    _, plain, model_p = train(OPTIMIZERS[name], watch=False)
    assert [len(e) for e in watched] == [len(e) for e in plain]
    for a, b in zip(model_w.parameters(), model_p.parameters(), strict=True):
        assert torch.equal(a, b)


def test_unmeasured_closure_steps_still_count_evaluations() -> None:
    msgs, evaluations, _ = train(OPTIMIZERS["LBFGS"], every=2)
    assert [m["step"] for m in measured(msgs)] == [1, 3, 5]
    assert [m["scalars"]["closure_calls"] for m in msgs] == [len(e) for e in evaluations]
    # the passes up to the first evaluation: per parameter when measured, the sentinel's otherwise
    assert all(m["params"]["backward_passes"]["0.weight"] == 1.0 for m in measured(msgs))
    assert all(m["scalars"]["backward_passes"] == 1.0 for m in msgs)


def test_steps_without_a_closure_send_no_closure_count() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w = gradwatch.watch(opt, model=model, server=NOWHERE, warn=False)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(2, 3)).sum().backward()
        opt.step()
    msgs = sent_steps(w)
    w.close(timeout=0.1)
    assert len(msgs) == 2 and all("closure_calls" not in m["scalars"] for m in msgs)


def test_a_closure_that_raises_reaches_the_user_unchanged() -> None:
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.LBFGS(model.parameters())
    w = gradwatch.watch(opt, model=model, server=NOWHERE, warn=False)

    def closure() -> torch.Tensor:
        raise KeyError("the user's own error")

    with pytest.raises(KeyError, match="the user's own error"):
        opt.step(closure)
    w.close(timeout=0.1)

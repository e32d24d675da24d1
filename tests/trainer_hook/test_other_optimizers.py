"""Optimizers whose state means something else, each exact against an oracle read here:

- torch.optim.Muon: its update is an orthogonalized momentum, not derivable from the state; with
  updates=True `update_norm` is the parameter's change, and `momentum_buffer_norm` the buffer's.
- schedule-free AdamW (the `schedulefree` package): the parameter in train mode is y, the point
  where gradients are taken; `z_norm` is the base sequence z; x (the parameter in eval mode) is not
  measured, as no step runs in eval mode.
- SOAP (`pytorch_optimizer`): `exp_avg`/`exp_avg_sq` live in the preconditioner's eigenbasis; the
  norms are of the state as stored, the gradient's before the step, the update the change."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from gradwatch.layout import build_layout
from gradwatch.measure import Probe
from support.probing import after_step, before_step

pytestmark = pytest.mark.unit


def muon(params: Any) -> torch.optim.Optimizer:
    if not hasattr(torch.optim, "Muon"):
        pytest.skip(f"torch {torch.__version__} has no torch.optim.Muon")
    return torch.optim.Muon(params, lr=2e-2)


def schedule_free(params: Any) -> torch.optim.Optimizer:
    schedulefree = pytest.importorskip("schedulefree", reason="schedulefree is installed by requirements-test.txt")
    opt = schedulefree.AdamWScheduleFree(params, lr=1e-2, warmup_steps=2)
    opt.train()  # y: where the gradients are taken
    return opt  # type: ignore[no-any-return]


def soap(params: Any) -> torch.optim.Optimizer:
    optimizers = pytest.importorskip(
        "pytorch_optimizer", reason="pytorch-optimizer is installed by requirements-test.txt"
    )
    return optimizers.SOAP(params, lr=1e-2, precondition_frequency=1)  # type: ignore[no-any-return]


CASES: dict[str, tuple[Callable[[Any], torch.optim.Optimizer], tuple[str, ...]]] = {
    "muon": (muon, ("momentum_buffer",)),
    "schedule-free-adamw": (schedule_free, ("z", "exp_avg_sq")),
    "soap": (soap, ("exp_avg", "exp_avg_sq")),
}


def norm(t: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(t.detach().float()))


@pytest.mark.parametrize("case", list(CASES))
def test_state_update_and_parameter_equal_the_oracle(case: str) -> None:
    make, keys = CASES[case]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16, bias=False), torch.nn.Tanh(), torch.nn.Linear(16, 4, bias=False))
    opt = make(model.parameters())
    probe = Probe(build_layout([opt], model, rank=None), updates=True)
    params = [w.param for w in probe.layout.params]
    for step in (1, 2, 3):
        opt.zero_grad()
        model(torch.randn(5, 8)).pow(2).mean().backward()
        grads = [norm(p.grad) for p in params]
        before = [p.detach().clone() for p in params]
        before_step(probe, step)
        opt.step()
        metrics, *_ = after_step(probe, {}).resolve()
        for i, p in enumerate(params):
            where = (case, step, i)
            assert float(metrics["grad_norm"][i]) == pytest.approx(grads[i], rel=1e-5), where
            assert float(metrics["param_norm"][i]) == pytest.approx(norm(p), rel=1e-5), where
            assert float(metrics["update_norm"][i]) == pytest.approx(norm(p.detach() - before[i]), rel=1e-4), where
            for key in keys:
                assert float(metrics[f"{key}_norm"][i]) == pytest.approx(norm(opt.state[p][key]), rel=1e-5), where

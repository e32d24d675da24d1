"""Every torch.optim optimizer (for-loop, foreach and fused forms): each state tensor shaped like
its parameter is reported under `<key>_norm` and equals torch.linalg.vector_norm."""

from __future__ import annotations

import math

import pytest
import torch

from gradwatch.layout import build_layout
from gradwatch.measure import Probe, is_absent
from support.probing import after_step, before_step

pytestmark = pytest.mark.unit

optim = torch.optim
OPTIMIZERS = {
    "sgd-nesterov": lambda p: optim.SGD(p, lr=0.01, momentum=0.9, nesterov=True),
    "sgd-fused": lambda p: optim.SGD(p, lr=0.01, momentum=0.9, fused=True),
    "adam-fused": lambda p: optim.Adam(p, lr=0.01, fused=True),
    "adamw-fused-amsgrad": lambda p: optim.AdamW(p, lr=0.01, fused=True, amsgrad=True),
    "adam-forloop": lambda p: optim.Adam(p, lr=0.01, foreach=False),
    "adamax": lambda p: optim.Adamax(p, lr=0.01),
    "nadam": lambda p: optim.NAdam(p, lr=0.01),
    "radam": lambda p: optim.RAdam(p, lr=0.01),
    "adagrad": lambda p: optim.Adagrad(p, lr=0.01),
    "adagrad-fused": lambda p: optim.Adagrad(p, lr=0.01, fused=True),
    "adadelta": lambda p: optim.Adadelta(p),
    "rmsprop-centered": lambda p: optim.RMSprop(p, lr=0.01, momentum=0.9, centered=True),
    "rprop": lambda p: optim.Rprop(p, lr=0.01),
    "asgd": lambda p: optim.ASGD(p, lr=0.01),
}


class Custom(torch.optim.Optimizer):
    """A user-written optimizer: its own state keys are found too."""

    def __init__(self, params, lr: float = 0.01) -> None:
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                st.setdefault("velocity", torch.zeros_like(p)).mul_(0.5).add_(p.grad)
                p.add_(st["velocity"], alpha=-group["lr"])


@pytest.mark.parametrize("make", [*OPTIMIZERS.values(), Custom], ids=[*OPTIMIZERS, "custom-subclass"])
def test_every_state_tensor_is_measured_exactly(make) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    opt = make(model.parameters())
    probe = Probe(build_layout([opt], model))
    params = [w.param for w in probe.layout.params]
    for step in (1, 2):
        opt.zero_grad()
        model(torch.randn(4, 6)).pow(2).sum().backward()
        before_step(probe, step)
        opt.step()
        metrics, *_ = after_step(probe, {}).resolve()
    keys = {
        k
        for p in params
        for k, v in opt.state[p].items()
        if isinstance(v, torch.Tensor) and v.shape == p.shape and k != "step"
    }
    assert keys, "the optimizer keeps per-element state"
    assert {f"{k}_norm" for k in keys} <= set(metrics)
    for key in keys:
        got = metrics[f"{key}_norm"]
        for i, p in enumerate(params):
            want = opt.state[p].get(key)
            if want is None:
                assert is_absent(got[i : i + 1])[0]
                continue
            norm = float(torch.linalg.vector_norm(want.float()))
            assert float(got[i]) == pytest.approx(norm, rel=1e-5, abs=1e-30) or (
                math.isnan(norm) and math.isnan(got[i])
            )


class Counting(Custom):
    """A user-written optimizer with per-element integer and bool state (counts, masks)."""

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                st = self.state[p]
                moved = p.grad.abs() > 0.1
                st["moves"] = st.get("moves", torch.zeros(p.shape, dtype=torch.int64)) + moved
                st["moved"] = moved
                p.sub_(p.grad * moved, alpha=group["lr"])


@pytest.mark.parametrize(
    "dtype, make",
    [
        (torch.float64, lambda p: optim.Adam(p, lr=0.01, foreach=True)),
        (torch.float64, lambda p: optim.AdamW(p, lr=0.01, fused=True)),
        (torch.complex64, lambda p: optim.Adam(p, lr=0.01, foreach=False)),
        (torch.complex128, lambda p: optim.SGD(p, lr=0.01, momentum=0.9)),
        (torch.float32, Counting),
    ],
    ids=[
        "float64-adam-foreach",
        "float64-adamw-fused",
        "complex64-adam-forloop",
        "complex128-sgd",
        "int-and-bool-state",
    ],
)
def test_tensors_of_every_dtype_get_their_norms(dtype, make) -> None:
    """The fused float32 norm refuses float64 and complex tensors (it would narrow them) and
    integer or bool ones: those get their own norm, exact to float32 rounding."""
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(5, 3, dtype=dtype))
    opt = make([p])
    probe = Probe(build_layout([opt], None))
    for step in (1, 2):
        opt.zero_grad()
        (p * torch.randn(5, 3, dtype=dtype)).abs().pow(2).sum().backward()
        grad = p.grad.clone()
        before_step(probe, step)
        opt.step()
        metrics, *_ = after_step(probe, {}).resolve()
    want = {
        "grad_norm": grad,
        "param_norm": p.detach(),
        **{f"{k}_norm": v for k, v in opt.state[p].items() if isinstance(v, torch.Tensor) and v.shape == p.shape},
    }
    assert len(want) > 2
    for key, tensor in want.items():
        exact = torch.linalg.vector_norm(tensor.to(torch.complex128 if tensor.is_complex() else torch.float64))
        assert float(metrics[key][0]) == pytest.approx(float(exact), rel=1e-6), key

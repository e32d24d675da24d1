"""Every torch.optim optimizer (for-loop, foreach and fused forms): each state tensor shaped like
its parameter is reported under `<key>_norm` and equals torch.linalg.vector_norm."""
from __future__ import annotations

import math

import pytest
import torch

from gradwatch.layout import build_layout
from gradwatch.measure import Probe, is_absent

O = torch.optim
OPTIMIZERS = {
    "sgd-nesterov": lambda p: O.SGD(p, lr=0.01, momentum=0.9, nesterov=True),
    "sgd-fused": lambda p: O.SGD(p, lr=0.01, momentum=0.9, fused=True),
    "adam-fused": lambda p: O.Adam(p, lr=0.01, fused=True),
    "adamw-fused-amsgrad": lambda p: O.AdamW(p, lr=0.01, fused=True, amsgrad=True),
    "adam-forloop": lambda p: O.Adam(p, lr=0.01, foreach=False),
    "adamax": lambda p: O.Adamax(p, lr=0.01),
    "nadam": lambda p: O.NAdam(p, lr=0.01),
    "radam": lambda p: O.RAdam(p, lr=0.01),
    "adagrad": lambda p: O.Adagrad(p, lr=0.01),
    "adagrad-fused": lambda p: O.Adagrad(p, lr=0.01, fused=True),
    "adadelta": lambda p: O.Adadelta(p),
    "rmsprop-centered": lambda p: O.RMSprop(p, lr=0.01, momentum=0.9, centered=True),
    "rprop": lambda p: O.Rprop(p, lr=0.01),
    "asgd": lambda p: O.ASGD(p, lr=0.01),
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
        probe.before_step(step)
        opt.step()
        metrics, *_ = probe.after_step({}).resolve()
    keys = {k for p in params for k, v in opt.state[p].items()
            if isinstance(v, torch.Tensor) and v.shape == p.shape and k != "step"}
    assert keys, "the optimizer keeps per-element state"
    assert {f"{k}_norm" for k in keys} <= set(metrics)
    for key in keys:
        got = metrics[f"{key}_norm"]
        for i, p in enumerate(params):
            want = opt.state[p].get(key)
            if want is None:
                assert is_absent(got[i:i + 1])[0]
                continue
            norm = float(torch.linalg.vector_norm(want.float()))
            assert float(got[i]) == pytest.approx(norm, rel=1e-5, abs=1e-30) or (math.isnan(norm) and math.isnan(got[i]))

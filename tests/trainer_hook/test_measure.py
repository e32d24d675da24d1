"""The hook's measurements against a naive oracle: torch.linalg.vector_norm per tensor."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from gradwatch import measure
from gradwatch.layout import build_layout
from gradwatch.measure import Probe, is_absent
from gradwatch.wire import GRAD_STATUS_NONE, GRAD_STATUS_NONFINITE, GRAD_STATUS_NONZERO, GRAD_STATUS_ZERO
from support.probing import after_step, before_step

pytestmark = pytest.mark.unit


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(6, 16)
        self.fc2 = torch.nn.Linear(16, 3)
        self.unused = torch.nn.Linear(3, 3)  # never in the graph: its grad stays None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def oracle(tensors: list[torch.Tensor | None]) -> list[float]:
    return [math.nan if t is None else float(torch.linalg.vector_norm(t.detach().float())) for t in tensors]


def assert_close(got: np.ndarray, want: list[float], absent: list[bool]) -> None:
    assert list(is_absent(got)) == absent
    for g, w, a in zip(got.tolist(), want, absent):
        if a:
            continue
        if math.isnan(w):
            assert math.isnan(g)
        else:
            assert g == pytest.approx(w, rel=1e-5, abs=1e-30)


def measured_step(model: torch.nn.Module, opt: torch.optim.Optimizer, probe: Probe, step: int):
    """One real step with the probe around it; returns what it measured and the oracle inputs."""
    params = [w.param for w in probe.layout.params]
    grads = [None if p.grad is None else p.grad.clone() for p in params]
    before_step(probe, step)
    opt.step()
    snapshot = after_step(probe, {})
    assert snapshot is not None
    metrics, status, scalars = snapshot.resolve()
    return metrics, status, scalars, grads, params


@pytest.mark.parametrize(
    "make_opt",
    [
        lambda p: torch.optim.AdamW(p, lr=1e-2),
        lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=False),
        lambda p: torch.optim.Adam(p, lr=1e-2, amsgrad=True),
        lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9),
    ],
    ids=["adamw-foreach", "adamw-forloop", "adam-amsgrad", "sgd-momentum"],
)
def test_norms_match_oracle_with_none_zero_and_nan_grads(make_opt) -> None:
    torch.manual_seed(0)
    model = Net()
    opt = make_opt(model.parameters())
    probe = Probe(build_layout([opt], model))
    names = [w.name for w in probe.layout.params]
    assert names == [n for n, _ in model.named_parameters()]
    for step in range(1, 4):
        opt.zero_grad(set_to_none=True)
        model(torch.randn(8, 6)).pow(2).mean().backward()
        model.fc1.bias.grad.zero_()  # zero-filled buffer
        if step == 3:
            model.fc2.weight.grad[0, 0] = float("nan")
        metrics, status, scalars, grads, params = measured_step(model, opt, probe, step)

        absent = [g is None for g in grads]
        assert_close(metrics["grad_norm"], oracle(grads), absent)
        assert_close(metrics["param_norm"], oracle(params), [False] * len(params))
        for key in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer"):
            states = [opt.state.get(p, {}).get(key) for p in params]
            if all(s is None for s in states):
                assert f"{key}_norm" not in metrics
                continue
            assert_close(metrics[f"{key}_norm"], oracle(states), [s is None for s in states])

        expected = {
            "fc1.weight": GRAD_STATUS_NONZERO,
            "fc1.bias": GRAD_STATUS_ZERO,
            "fc2.weight": GRAD_STATUS_NONFINITE if step == 3 else GRAD_STATUS_NONZERO,
            "fc2.bias": GRAD_STATUS_NONZERO,
            "unused.weight": GRAD_STATUS_NONE,
            "unused.bias": GRAD_STATUS_NONE,
        }
        assert dict(zip(names, status.tolist())) == expected

        present = [g for g in grads if g is not None]
        total = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in present]).double()))
        if step == 3:
            assert math.isnan(scalars["grad_norm_total"])
        else:
            assert scalars["grad_norm_total"] == pytest.approx(total, rel=1e-5)
        assert scalars["lr/0"] == pytest.approx(1e-2)
        assert scalars["mem/params_bytes"] == sum(p.numel() * 4 for p in params)
        assert scalars["mem/grads_bytes"] == sum(g.numel() * 4 for g in present)
        assert scalars["mem/zero_grad_bytes"] == model.fc1.bias.numel() * 4
        state_bytes = sum(
            v.numel() * v.element_size() for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)
        )
        assert scalars["mem/optimizer_bytes"] == state_bytes


def test_bf16_params_are_measured_in_float32() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64).to(torch.bfloat16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = Probe(build_layout([opt], model))
    model(torch.randn(4, 64, dtype=torch.bfloat16)).float().sum().backward()
    metrics, *_, grads, params = measured_step(model, opt, probe, 1)
    want = [float(torch.linalg.vector_norm(g.float())) for g in grads]
    assert metrics["grad_norm"].tolist() == pytest.approx(want, rel=1e-5)


def test_several_param_groups_report_each_learning_rate() -> None:
    model = Net()
    opt = torch.optim.SGD(
        [{"params": model.fc1.parameters(), "lr": 0.1}, {"params": model.fc2.parameters(), "lr": 0.01, "name": "head"}]
    )
    probe = Probe(build_layout([opt], model))
    model(torch.randn(2, 6)).sum().backward()
    _, _, scalars, *_ = measured_step(model, opt, probe, 1)
    assert scalars["lr/0"] == pytest.approx(0.1) and scalars["lr/1"] == pytest.approx(0.01)
    assert probe.layout.hello_groups()[1]["name"] == "head"
    assert probe.layout.unoptimized == ["unused.weight", "unused.bias"]


def test_unnamed_parameters_get_stable_names() -> None:
    a, b = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([{"params": [a]}, {"params": [b]}], lr=0.1)
    layout = build_layout([opt], None)
    assert [w.name for w in layout.params] == ["group0.param0", "group1.param0"]


def test_state_read_again_when_an_optimizer_replaces_or_adds_state_tensors() -> None:
    """The per-parameter state lists are kept between steps; replacing a state tensor, adding a
    key or loading a state dict must be seen at the next step."""
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    probe = Probe(build_layout([opt], model))
    params = [w.param for w in probe.layout.params]

    def step(n: int):
        opt.zero_grad()
        model(torch.randn(5, 6)).sum().backward()
        return measured_step(model, opt, probe, n)

    step(1)
    fc1 = model.fc1.weight
    opt.state[fc1]["momentum_buffer"] = torch.full_like(fc1, 3.0)  # replaced, not updated in place
    opt.state[fc1]["extra"] = torch.ones_like(fc1)  # a new key
    metrics, *_ = step(2)
    i = params.index(fc1)
    assert metrics["extra_norm"][i] == pytest.approx(float(torch.linalg.vector_norm(opt.state[fc1]["extra"])))
    assert metrics["momentum_buffer_norm"][i] == pytest.approx(
        float(torch.linalg.vector_norm(opt.state[fc1]["momentum_buffer"])), rel=1e-5
    )
    opt.load_state_dict(opt.state_dict())  # new state dicts, new tensors
    for p in params:
        if "momentum_buffer" in opt.state.get(p, {}):
            opt.state[p]["momentum_buffer"].mul_(2)
    metrics, *_ = step(3)
    for j, p in enumerate(params):
        buf = opt.state.get(p, {}).get("momentum_buffer")
        if buf is not None:
            assert metrics["momentum_buffer_norm"][j] == pytest.approx(float(torch.linalg.vector_norm(buf)), rel=1e-5)
    # a checkpoint loaded: a new state mapping whose tensors are copies; the old mapping still
    # holds the old dicts and tensors, which nothing updates any more
    checkpoint = copy.deepcopy(opt.state_dict())
    for buf in checkpoint["state"].values():
        buf["momentum_buffer"].mul_(3)
    opt.load_state_dict(checkpoint)
    metrics, *_ = step(4)
    for j, p in enumerate(params):
        buf = opt.state.get(p, {}).get("momentum_buffer")
        if buf is not None:
            assert metrics["momentum_buffer_norm"][j] == pytest.approx(float(torch.linalg.vector_norm(buf)), rel=1e-5)


def test_state_read_once_a_parameter_without_state_gets_some() -> None:
    """A parameter that has no optimizer state yet (no gradient reached it, so Adam skipped it)
    is read as soon as it has: the kept plan notices the new state dict."""
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    probe = Probe(build_layout([opt], model))
    params = [w.param for w in probe.layout.params]
    fc2 = model.fc2.weight
    i = next(j for j, p in enumerate(params) if p is fc2)

    def step(n: int, reach_fc2: bool):
        opt.zero_grad(set_to_none=True)
        model(torch.randn(5, 6)).sum().backward()
        if not reach_fc2:
            fc2.grad = None
        return measured_step(model, opt, probe, n)

    metrics, *_ = step(1, reach_fc2=False)
    assert not opt.state.get(fc2) and is_absent(metrics["exp_avg_norm"][i : i + 1]).all()
    metrics, *_ = step(2, reach_fc2=True)
    assert metrics["exp_avg_norm"][i] == pytest.approx(
        float(torch.linalg.vector_norm(opt.state[fc2]["exp_avg"])), rel=1e-5
    )


def test_fused_norms_read_every_kind_of_tensor_as_its_own_norm() -> None:
    """`fused_norms` in input order, whichever way its plan reads each tensor: small ones of one
    shape stacked into matrices (in several chunks), large ones by rows, float64 apart, the rest
    fused; with non-contiguous, 0-d, empty, bf16 and non-finite tensors among them."""
    torch.manual_seed(0)
    small = [torch.randn(16, 16) for _ in range(5)]
    small[2][3, 4] = float("inf")
    small[4][0, 0] = float("nan")
    many = [torch.randn(4096) for _ in range(70)]  # 70 x 4096 elements: more than one chunk
    tensors = [
        small[0],
        torch.randn(1 << 17),  # by rows
        small[1],
        torch.randn(16, 16).t(),  # non-contiguous, same shape as `small`
        torch.randn(3, dtype=torch.float64),  # apart
        torch.randn(16, 16, dtype=torch.bfloat16),
        torch.randn(16, 16, dtype=torch.bfloat16),
        torch.tensor(2.5),
        torch.tensor(-1.5),
        torch.zeros(0),
        torch.randn(5000),  # too large to stack, alone in the fused call
        *many,
        small[2],
        small[3],
        small[4],
        torch.zeros(16, 16),
    ]
    norms = measure.fused_norms(tensors)
    assert norms.dtype == torch.float32 and norms.shape == (len(tensors),)
    plan = measure.norm_plan(tensors)
    assert plan.fused and len([run for run in plan.stacked if tensors[run[0]].numel() == 4096]) > 1
    want = oracle(list(tensors))
    for got, w in zip(norms.tolist(), want):
        if math.isnan(w):
            assert math.isnan(got)
        else:
            assert got == pytest.approx(w, rel=1e-5, abs=1e-30)
    torch.testing.assert_close(measure.fused_norms(tensors, plan), norms, rtol=0, atol=0, equal_nan=True)
    # in the order they are computed (the hook's measured step places each by its index): the
    # same norms, tensor `plan.slots[k]`'s at k
    unordered = measure.planned_norms(plan, *plan.gather(tensors), ordered=False)
    assert sorted(plan.slots.tolist()) == list(range(len(tensors)))
    torch.testing.assert_close(unordered, norms[torch.from_numpy(plan.slots)], rtol=0, atol=0, equal_nan=True)


def test_a_plan_made_from_parameters_reads_their_non_contiguous_grads() -> None:
    params = [torch.randn(8, 8) for _ in range(4)]
    plan = measure.norm_plan(params)
    assert plan.stacked
    grads = [torch.randn(8, 8).t() for _ in params]
    assert measure.fused_norms(grads, plan).tolist() == pytest.approx(oracle(list(grads)), rel=1e-5)

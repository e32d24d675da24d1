"""The optimizer signals (gradwatch/signals.py, `watch(optimizer_signals=True)`) and the clipped
total norm (gradwatch/clipping.py), against oracles computed from the optimizer's own state with
plain torch after each real step (tests/support/signals.py)."""

from __future__ import annotations

import math

import pytest
import torch

import gradwatch
from support.sent import sent_steps
from support.signals import signals_oracle

pytestmark = pytest.mark.unit

NOWHERE = "http://127.0.0.1:9"  # nothing listens: the steps stay queued, readable by sent_steps


def model_and_batches(seed: int = 0) -> tuple[torch.nn.Module, list[torch.Tensor]]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    return model, [torch.randn(4, 6) for _ in range(4)]


@pytest.mark.parametrize(
    "make_opt",
    [
        lambda p: torch.optim.AdamW(p, lr=1e-2, eps=1e-3),  # a large eps: some entries in its regime
        lambda p: torch.optim.Adam(p, lr=1e-2, foreach=False),
        lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9),
    ],
)
def test_signals_equal_the_oracle_at_every_step(make_opt) -> None:
    model, batches = model_and_batches()
    opt = make_opt(model.parameters())
    names = {p: n for n, p in model.named_parameters()}
    w = gradwatch.watch(opt, model=model, server=NOWHERE, optimizer_signals=True)
    wanted = []
    for x in batches:
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        wanted.append(signals_oracle(opt, names))
    msgs = sent_steps(w)
    w.close(timeout=0.1)
    assert len(msgs) == len(batches)
    adam = not isinstance(opt, torch.optim.SGD)
    for m, want in zip(msgs, wanted):
        for metric, per_param in want.items():
            if not per_param:
                assert metric not in m["params"]
                continue
            for name, value in per_param.items():
                assert m["params"][metric][name] == pytest.approx(value, rel=1e-4, abs=1e-6), (metric, name)
    if adam:  # the large eps put part of the layer in its regime at some step: the test sees both
        shares = [v for m in msgs for v in m["params"]["eps_share"].values()]
        assert any(0 < s < 1 for s in shares) or any(s == 0 for s in shares)


def test_eps_share_counts_a_layer_whose_second_moment_never_built_up() -> None:
    torch.manual_seed(1)
    main, side = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4, bias=False)
    opt = torch.optim.Adam([*main.parameters(), *side.parameters()], lr=1e-2)
    w = gradwatch.watch(
        opt,
        model=[("main.weight", main.weight), ("main.bias", main.bias), ("side.weight", side.weight)],
        server=NOWHERE,
        optimizer_signals=True,
    )
    for _ in range(3):
        opt.zero_grad()
        x = torch.randn(8, 4)
        (main(x) + side(torch.zeros_like(x))).pow(2).mean().backward()  # side's gradient is exactly 0
        opt.step()
    msgs = sent_steps(w)
    w.close(timeout=0.1)
    assert [m["params"]["eps_share"]["side.weight"] for m in msgs] == [1.0, 1.0, 1.0]
    assert all(m["params"]["eps_share"]["main.weight"] == 0.0 for m in msgs)
    assert all(math.isnan(m["params"]["v_decoupling"]["side.weight"]) for m in msgs)  # 0 / 0


def test_signals_are_off_by_default_and_the_argument_is_checked() -> None:
    model, batches = model_and_batches()
    opt = torch.optim.Adam(model.parameters())
    w = gradwatch.watch(opt, model=model, server=NOWHERE)
    model(batches[0]).sum().backward()
    opt.step()
    msgs = sent_steps(w)
    w.close(timeout=0.1)
    assert not {"eps_share", "v_decoupling", "momentum_cosine"} & set(msgs[0]["params"])
    with pytest.raises(TypeError, match="optimizer_signals"):
        gradwatch.watch(opt, model=model, server=NOWHERE, optimizer_signals="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize("every", [1, 2])
def test_the_clipped_total_norm_is_the_value_clip_grad_norm_returned(every: int) -> None:
    model, batches = model_and_batches()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    original = torch.nn.utils.clip_grad_norm_
    w = gradwatch.watch(opt, model=model, server=NOWHERE, every=every)
    returned = []
    for i, x in enumerate(batches):
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        if i != 2:  # a step that does not clip carries no clip norm
            returned.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)))
        else:
            returned.append(None)
        opt.step()
    msgs = sent_steps(w)
    w.close(timeout=0.1)
    assert [m["scalars"].get("clip/total_norm") for m in msgs] == returned
    assert torch.nn.utils.clip_grad_norm_ is original  # put back at close
    assert torch.nn.utils.clip_grad.clip_grad_norm_ is original

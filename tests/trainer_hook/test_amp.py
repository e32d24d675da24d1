"""GradScaler: the norms sent are unscaled, and skipped steps are counted."""

from __future__ import annotations

import pytest
import torch

import gradwatch
from support.sent import sent_steps

pytestmark = pytest.mark.unit

NOWHERE = "http://127.0.0.1:9"


@pytest.mark.parametrize("user_unscales", [False, True])
def test_amp_norms_are_unscaled_and_skipped_steps_are_counted(user_unscales: bool) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    w = gradwatch.watch(opt, model=model, server=NOWHERE, scaler=scaler)
    expected = []
    for i in range(5):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(torch.randn(4, 8)).float().pow(2).mean()
        scaler.scale(loss).backward()
        if i == 2:
            model.weight.grad[0, 0] = float("inf")  # the scaler skips this step
        scale = scaler.get_scale()
        if user_unscales:
            scaler.unscale_(opt)
        true_norm = float(torch.linalg.vector_norm(model.bias.grad)) / (1.0 if user_unscales else scale)
        scaler.step(opt)
        scaler.update()
        if i != 2:
            expected.append((true_norm, scale))
    msgs = sent_steps(w)
    w.close(timeout=0.1)
    assert w.step == 4  # optimizer.step() ran 4 times: one was skipped
    assert [m["step"] for m in msgs] == [1, 2, 3, 4]
    for m, (norm, scale) in zip(msgs, expected):
        assert m["params"]["grad_norm"]["bias"] == pytest.approx(norm, rel=1e-5)
        assert m["scalars"]["amp/scale"] == scale
    assert [m["scalars"]["amp/skipped_steps"] for m in msgs] == [0, 0, 1, 1]
    assert msgs[2]["params"]["backward_passes"]["bias"] == 1.0  # the skipped step's pass is not counted twice
    assert "step" not in scaler.__dict__  # close() gave the scaler its own step() back


def test_a_fused_optimizers_skipped_steps_are_counted_without_reading_found_inf_on_the_step() -> None:
    # GradScaler steps a fused optimizer all the same and the kernel skips on `found_inf`: the
    # step hooks fire, so only the scaler's found_inf tells the skip (summed where it lies).
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, fused=True)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    w = gradwatch.watch(opt, model=model, server=NOWHERE, scaler=scaler)
    unchanged = []
    for i in range(5):
        opt.zero_grad()
        scaler.scale(model(torch.randn(4, 8)).pow(2).mean()).backward()
        if i in (1, 3):
            model.weight.grad[0, 0] = float("nan")
        before = model.weight.detach().clone()
        scaler.step(opt)
        scaler.update()
        unchanged.append(torch.equal(before, model.weight))
    msgs = sent_steps(w)
    w.close(timeout=0.1)
    assert unchanged == [False, True, False, True, False]  # the oracle: the kernel skipped steps 2 and 4
    assert w.step == 5  # optimizer.step() was called every time
    assert [m["scalars"]["amp/skipped_steps"] for m in msgs] == [0, 1, 1, 2, 2]

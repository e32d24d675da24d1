"""Accumulation under DistributedDataParallel: after every backward pass DDP's reducer writes the
all-reduced gradient into `.grad` in place (its version moves), which is no clear. A real DDP on
CPU (gloo, world size 1, in this process) with 4 backward passes per step reads as 4 passes, and a
zero-fill between passes is still seen as one."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import gradwatch
from support.sent import sent_steps

pytestmark = pytest.mark.unit

NOWHERE = "http://127.0.0.1:9"
STEPS, MICRO = 3, 4


@pytest.fixture
def ddp_group(tmp_path: Path) -> Iterator[None]:
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def ddp_run(zero_between: bool) -> list[dict]:
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    w = gradwatch.watch(opt, model=model.module, server=NOWHERE, warn=False)
    versions = []
    for _ in range(STEPS):
        opt.zero_grad()
        for micro in range(MICRO):
            if zero_between and micro == MICRO - 1:
                opt.zero_grad(set_to_none=False)
            before = None if model.module.weight.grad is None else model.module.weight.grad._version
            (model(torch.randn(2, 4)).sum() / MICRO).backward()
            versions.append((before, model.module.weight.grad._version))
        opt.step()
    msgs = sent_steps(w)
    w.close(timeout=0.1)
    # the premise: DDP writes into .grad in place, more than the one accumulation per pass
    assert any(b is not None and after - b > 1 for b, after in versions), versions
    assert [m["step"] for m in msgs] == list(range(1, STEPS + 1))
    return msgs


def test_ddp_accumulation_counts_every_pass(ddp_group: None) -> None:
    msgs = ddp_run(zero_between=False)
    for m in msgs:
        for name in ("weight", "bias"):
            assert m["params"]["backward_passes"][name] == MICRO, (m["step"], name)
            assert m["params"]["grad_clear"][name] == (None if m["step"] == 1 else 1.0), (m["step"], name)
        assert m["scalars"]["backward_passes"] == MICRO


def test_ddp_zero_fill_between_passes_restarts_the_count(ddp_group: None) -> None:
    msgs = ddp_run(zero_between=True)
    for m in msgs:
        assert m["params"]["backward_passes"]["weight"] == 1.0, m["step"]
        assert m["params"]["grad_clear"]["weight"] == 2.0, m["step"]


def test_ddp_holds_the_accumulator_nodes_and_only_the_sentinels_hook_runs_between_measured_steps(
    ddp_group: None,
) -> None:
    """DDP's reducer holds every parameter's gradient accumulator node for the model's life: the
    hooks a measured round puts on its parameters must go with the round, or every later
    backward calls them all (docs/benchmarks.md). Counted with `sys.setprofile`."""
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(5)]))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    w = gradwatch.watch(opt, model=model.module, server=NOWHERE, warn=False, every=3)
    calls: list[int] = []

    def profile(frame, event, arg) -> None:
        if event == "call" and frame.f_code.co_name in ("on_accumulate", "on_pass"):  # gradwatch's hooks
            calls[-1] += 1

    for _ in range(7):
        calls.append(0)
        sys.setprofile(profile)
        try:
            opt.zero_grad()
            for _ in range(2):
                model(torch.randn(2, 4)).sum().backward()
            opt.step()
        finally:
            sys.setprofile(None)
    msgs = sent_steps(w)
    w.close(timeout=0.1)
    measured = {m["step"] for m in msgs if m["params"]}
    assert measured and len(measured) < 7, measured
    assert calls == [10 * 2 if k + 1 in measured else 2 for k in range(7)]
    assert all(set(m["params"]["backward_passes"].values()) == {2.0} for m in msgs if m["params"])

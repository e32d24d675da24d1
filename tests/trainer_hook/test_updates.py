"""updates=True: the exact size of each parameter's update and its ratio to the parameter; off by default."""

from __future__ import annotations

import pytest
import torch

import gradwatch
from support.sent import sent_steps

pytestmark = pytest.mark.unit

NOWHERE = "http://127.0.0.1:9"


def test_update_norm_and_ratio_are_exact() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 5), torch.nn.Linear(5, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.1)
    w = gradwatch.watch(opt, model=model, server=NOWHERE, updates=True)
    oracle = []
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(3, 5)).sum().backward()
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        opt.step()
        oracle.append(
            {
                n: (float(torch.linalg.vector_norm(p.detach() - before[n])), float(torch.linalg.vector_norm(before[n])))
                for n, p in model.named_parameters()
            }
        )
    msgs = sent_steps(w)
    w.close(timeout=0.1)
    for m, want in zip(msgs, oracle):
        for name, (update, before_norm) in want.items():
            assert m["params"]["update_norm"][name] == pytest.approx(update, rel=1e-5)
            assert m["params"]["update_ratio"][name] == pytest.approx(update / before_norm, rel=1e-5)


def test_updates_are_off_by_default() -> None:
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w = gradwatch.watch(opt, model=model, server=NOWHERE)
    model(torch.randn(1, 2)).sum().backward()
    opt.step()
    msgs = sent_steps(w)
    w.close(timeout=0.1)
    assert "update_norm" not in msgs[0]["params"]

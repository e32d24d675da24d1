"""The CUDA path: pinned non-blocking copies, no synchronisation on the training thread, memory
counters. Runs wherever a CUDA device is present; skipped with the reason elsewhere."""

from __future__ import annotations

import pytest
import torch

import gradwatch
from support.sent import sent_steps

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none on this machine)"),
]


def test_steps_never_synchronise_and_match_the_oracle() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    w = gradwatch.watch(opt, model=model, server="http://127.0.0.1:9")
    oracle = []
    x = torch.randn(32, 64, device="cuda")
    for _ in range(2):  # warm up Adam state, allocator, pinned buffers
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
    for _ in range(3):
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        grads = {n: float(torch.linalg.vector_norm(p.grad)) for n, p in model.named_parameters()}
        oracle.append(grads)
        torch.cuda.set_sync_debug_mode("error")
        try:
            w.log(loss=loss)  # a CUDA tensor: copied with the step, not read now
            opt.step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    msgs = sent_steps(w, timeout=30)
    w.close(timeout=0.1)
    for m, want in zip(msgs[2:], oracle):
        for name, norm in want.items():
            assert m["params"]["grad_norm"][name] == pytest.approx(norm, rel=1e-5)
        assert m["scalars"]["mem/cuda:0/allocated"] > 0
        assert m["scalars"]["mem/cuda:0/peak"] >= m["scalars"]["mem/cuda:0/allocated"]
        assert "loss" in m["scalars"]

"""`gradwatch.render.StepRenderer`: a measured step made ready to send from its snapshot alone
(what the sender thread calls; nothing of the watcher)."""

from __future__ import annotations

import os
import threading

import pytest
import torch

from gradwatch.layout import build_layout
from gradwatch.measure import Probe
from gradwatch.render import StepRenderer
from gradwatch.sampling import CostMeter, make_sampler
from support.probing import after_step, before_step

pytestmark = pytest.mark.unit


def test_a_rendered_step_carries_its_norms_and_what_the_hook_cost() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(4, 6)).pow(2).mean().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    probe = Probe(build_layout([opt], model))
    before_step(probe, 7)
    opt.step()
    snapshot = after_step(probe, {"loss": 1.5})
    assert snapshot is not None
    renderer = StepRenderer(probe, CostMeter(make_sampler(1), False, lambda: 0.0))
    made = []
    sender = threading.Thread(target=lambda: made.append(renderer.render(snapshot, 1)))  # as the sender does
    sender.start()
    sender.join(10)
    (step,) = made
    assert step.step == 7 and step.scalars["loss"] == 1.5
    names = [w.name for w in probe.layout.params]
    for i, name in enumerate(names):
        assert step.metrics["grad_norm"][i] == pytest.approx(float(torch.linalg.vector_norm(grads[name])), rel=1e-5)
    assert step.scalars["hook/train_s"] == snapshot.cost_s > 0
    assert step.scalars["hook/sender_cpu_s"] >= 0 and step.scalars["mem/rss_bytes"] > 0


def test_the_resident_memory_is_read_afresh_each_time() -> None:
    """`mem/rss_bytes` (read from a descriptor kept open) follows the process's resident memory:
    64 MiB touched between two reads show, as /proc/self/statm opened anew says."""
    from gradwatch.render import _rss_bytes

    def statm() -> float:
        with open("/proc/self/statm", "rb") as f:
            return float(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"))

    before = _rss_bytes()
    assert before is not None and abs(before - statm()) < 8 << 20
    block = torch.ones(16 << 20)  # 64 MiB, written: resident
    after = _rss_bytes()
    assert after is not None and after - before > 48 << 20 and abs(after - statm()) < 8 << 20
    del block

"""`gradwatch.render.StepRenderer`: a measured step made ready to send from its snapshot alone
(what the sender thread calls; nothing of the watcher)."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
import torch

from gradwatch import wire
from gradwatch.layout import build_layout
from gradwatch.measure import Probe
from gradwatch.render import StepRenderer
from gradwatch.sampling import CostMeter, make_sampler
from gradwatch.wire import UnsentStep
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


def test_steps_rendered_together_are_what_each_renders_alone() -> None:
    """`render_many` (the sender renders what it drains in one pass) against `Snapshot.resolve`,
    the rendering of one step alone, as oracle: every array bit for bit, every scalar, and the
    binary frame the sender makes of them byte for byte (the hook's own timings, measured anew
    each time, set alike). The steps change layout midway (a parameter frozen: its gradient
    absent, its state plan rebuilt), have per-parameter host metrics with NaN, and a loss that
    is not finite."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(24, 24) for _ in range(70)])  # 140 tensors: pairwise sums in blocks
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    probe = Probe(build_layout([opt], model))
    renderer = StepRenderer(probe, CostMeter(make_sampler(1), False, lambda: 0.0))
    jobs, alone = [], []
    for step in range(1, 8):
        model[3].weight.requires_grad_(step < 4)  # from step 4 on: one gradient absent
        opt.zero_grad(set_to_none=True)
        model(torch.randn(8, 24)).pow(2).mean().backward()
        before_step(probe, step)
        opt.step()
        passes = np.where(np.arange(140) % 3 == 0, np.nan, step).astype(np.float32)
        loss = float("inf") if step == 5 else 0.5 / step
        snapshot = after_step(probe, {"loss": loss}, {"backward_passes": passes})
        assert snapshot is not None
        jobs.append((snapshot, 1))
        alone.append(snapshot.resolve())
    made = renderer.render_many(jobs)
    assert [r.step for r in made] == list(range(1, 8))
    oracle = []
    for record, (snapshot, _), (metrics, status, scalars) in zip(made, jobs, alone):
        assert list(record.metrics) == list(metrics)
        for name, values in metrics.items():
            assert record.metrics[name].dtype == values.dtype and record.metrics[name].tobytes() == values.tobytes()
        assert record.grad_status is not None and record.grad_status.tobytes() == status.tobytes()
        timings = {k: record.scalars[k] for k in ("mem/rss_bytes", "hook/train_s", "hook/sender_cpu_s")}
        assert timings["hook/train_s"] == snapshot.cost_s
        assert dict(record.scalars) == {**scalars, **timings}
        assert list(record.scalars) == list({**scalars, **timings})
        oracle.append(UnsentStep(snapshot.step, snapshot.time, {**scalars, **timings}, metrics, status))
    assert made[4].scalars["loss"] == float("inf") and made[3].grad_status[6] == wire.GRAD_STATUS_NONE
    for a, b in ((0, 2), (3, 6)):  # rendered together: rows of one array per metric
        assert made[a].metrics["param_norm"].base is made[b].metrics["param_norm"].base is not None
    assert made[2].metrics["param_norm"].base is not made[3].metrics["param_norm"].base
    for seq, (a, b) in enumerate([(made[:3], oracle[:3]), (made[3:], oracle[3:])], 1):  # one frame per layout
        assert wire.binary_steps(seq, a) == wire.binary_steps(seq, b)
        assert wire.dumps(wire.steps(seq, a)) == wire.dumps(wire.steps(seq, b))

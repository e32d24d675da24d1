"""The flight recorder (gradwatch/recorder.py): with every=N or "auto", the steps around an
incident between two measured steps are sent with their gradient norms, exact against
torch.linalg.vector_norm; the other unmeasured steps keep their cheap facts only."""

from __future__ import annotations

import pytest
import torch

import gradwatch
from gradwatch.recorder import AFTER, BEFORE
from support.sent import sent_steps

pytestmark = pytest.mark.unit

NOWHERE = "http://127.0.0.1:9"  # nothing listens: the steps stay queued, readable by sent_steps


def train(every: object, spike_at: int | None, steps: int = 80, **watch_args: object):
    """A small regression; at `spike_at` one batch 50x larger. Returns the messages and, per
    step, the oracle norms of the gradients as the step used them."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    watch_args.setdefault("flight_recorder", True)  # on CPU it is asked for; on by default on a GPU only
    w = gradwatch.watch(opt, model=model, server=NOWHERE, every=every, **watch_args)  # type: ignore[arg-type]
    oracle = {}
    for step in range(1, steps + 1):
        opt.zero_grad()
        x = torch.randn(16, 4) * (50.0 if step == spike_at else 1.0)
        model(x).pow(2).mean().backward()
        oracle[step] = {n: float(torch.linalg.vector_norm(p.grad)) for n, p in model.named_parameters()}
        opt.step()
    w._rounds._flush_recorder()
    msgs = sent_steps(w)
    w.close(timeout=0.1)
    return msgs, oracle


def test_the_window_around_a_spike_is_sent_at_full_resolution_and_exact() -> None:
    msgs, oracle = train(every=50, spike_at=40)  # measured: 1 and 51 only
    full = {m["step"]: m for m in msgs if "grad_norm" in m["params"]}
    assert sorted(full) == [1, *range(40 - BEFORE, 40 + AFTER + 1), 51]
    for step in range(40 - BEFORE, 40 + AFTER + 1):
        for name, value in oracle[step].items():
            assert full[step]["params"]["grad_norm"][name] == pytest.approx(value, rel=1e-5)
    spike = full[40]
    assert spike["params"]["spike_ratio"]["0.weight"] > 3 and spike["scalars"]["flight/total_ratio"] > 1
    assert "spike_z" not in full[39]["params"]
    assert [m["step"] for m in msgs] == list(range(1, 81))  # every step once, in order


def test_a_quiet_run_sends_no_recorded_steps() -> None:
    msgs, _ = train(every=50, spike_at=None)
    assert [m["step"] for m in msgs if "grad_norm" in m["params"]] == [1, 51]


def test_the_recorder_is_off_at_every_step_when_asked_and_by_default_on_cpu() -> None:
    msgs, _ = train(every=50, spike_at=40, flight_recorder=False)
    assert [m["step"] for m in msgs if "grad_norm" in m["params"]] == [1, 51]
    w = gradwatch.watch(torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1), server=NOWHERE)
    assert w._recorder is None
    w.close(timeout=0.1)
    w = gradwatch.watch(torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1), server=NOWHERE, every=10)
    assert w._recorder is None  # the parameters are on the CPU: a pass over every gradient per step
    w.close(timeout=0.1)
    with pytest.raises(TypeError, match="flight_recorder"):
        gradwatch.watch(torch.optim.SGD(torch.nn.Linear(2, 2).parameters()), server=NOWHERE, flight_recorder=1)  # type: ignore[arg-type]

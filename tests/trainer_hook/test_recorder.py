"""The flight recorder (gradwatch/recorder.py): with every=N or "auto", the steps around an
incident between two measured steps are sent with their gradient norms, exact against
torch.linalg.vector_norm; the other unmeasured steps keep their cheap facts only."""

from __future__ import annotations

import warnings

import httpx
import numpy as np
import pytest
import torch

import gradwatch
from gradwatch.recorder import AFTER, BEFORE, MAD_SIGMA, RATIO, RESENT, WARMUP, WINDOW, Z, _History
from support.sent import sent_steps
from support.server import start_server

pytestmark = pytest.mark.unit

NOWHERE = "http://127.0.0.1:9"  # nothing listens: the steps stay queued, readable by sent_steps


def train(every: object, spike_at: int | None, steps: int = 80, server: str = NOWHERE, **watch_args: object):
    """A small regression; at `spike_at` one loss 50x larger (every gradient 50x). Returns the messages and, per
    step, the oracle norms of the gradients as the step used them."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    watch_args.setdefault("flight_recorder", True)  # on CPU it is asked for; on by default on a GPU only
    w = gradwatch.watch(opt, model=model, server=server, every=every, **watch_args)  # type: ignore[arg-type]
    oracle = {}
    for step in range(1, steps + 1):
        opt.zero_grad()
        x = torch.randn(16, 4)
        (model(x).pow(2).mean() * (50.0 if step == spike_at else 1.0)).backward()
        oracle[step] = {n: float(torch.linalg.vector_norm(p.grad)) for n, p in model.named_parameters()}
        opt.step()
    if server != NOWHERE:
        w.close(timeout=30)
        assert w.pending == 0, "every message must be acknowledged after close()"
        return w.run_id, oracle
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
    assert [m["step"] for m in msgs if RESENT not in m["scalars"]] == list(range(1, 81))  # every step once, in order


#: every=20 measures steps 1, 21, 41, ...: steps 22-40 are held, then flushed when step 41 is
#: measured; a spike at 43 reaches back over that flush to steps 35-40.
EVERY, SPIKE = 20, 43


def test_the_window_reaches_back_over_a_flush() -> None:
    msgs, oracle = train(every=EVERY, spike_at=SPIKE, steps=60)
    resent = [m for m in msgs if RESENT in m["scalars"]]
    assert [m["step"] for m in resent] == list(range(SPIKE - BEFORE, 41))
    for m in resent:
        for name, value in oracle[m["step"]].items():
            assert m["params"]["grad_norm"][name] == pytest.approx(value, rel=1e-5)
    full = sorted(m["step"] for m in msgs if "grad_norm" in m["params"] and RESENT not in m["scalars"])
    assert full == [1, 21, 41, 42, *range(SPIKE, SPIKE + AFTER + 1)]
    first = [m["step"] for m in msgs if RESENT not in m["scalars"]]
    assert first == list(range(1, 61))  # and every step once, in order, with its cheap facts


@pytest.mark.server
def test_the_server_stores_the_window_before_the_flush_into_its_steps(server) -> None:
    """A real server stores the norms the recorder sent again into the steps it stored without
    them: the run's grad_norm series holds the whole window, equal to the oracle."""
    run_id, oracle = train(every=EVERY, spike_at=SPIKE, steps=60, server=server.url, warn=False)
    with httpx.Client(base_url=server.url, timeout=30) as http:
        assert http.get(f"/api/runs/{run_id}").json()["steps"] == 60
        for name in ("0.weight", "2.bias"):
            got = http.get(f"/api/runs/{run_id}/params/series", params={"metric": "grad_norm", "param": name}).json()
            window = range(SPIKE - BEFORE, SPIKE + AFTER + 1)
            assert got["step"] == [1, 21, *window]  # 41 measured, the rest the recorder's
            values = dict(zip(got["step"], got["series"][0]["value"]))
            assert [values[s] for s in window] == pytest.approx([oracle[s][name] for s in window], rel=1e-5)
        assert RESENT not in http.get(f"/api/runs/{run_id}/metrics").json()["scalars"]  # nor stored as a scalar


@pytest.mark.server
def test_a_spike_after_a_flush_is_told_to_on_finding_once_and_a_quiet_run_gets_none(tmp_path) -> None:
    """A real loop and server (SQLite): the window the recorder sends again over a flush is judged
    live, and the spike reaches on_finding once, at its step, while the run is open."""
    srv = start_server(tmp_path)
    try:
        for spike_at in (SPIKE, None):
            got: list[dict[str, object]] = []
            train(every=EVERY, spike_at=spike_at, steps=50, server=srv.url, warn=False, on_finding=got.append)
            if spike_at is None:
                assert got == []
            else:
                assert [(f["code"], f["first_step"]) for f in got] == [("grad_norm_spike", SPIKE)]
    finally:
        srv.stop()


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


def test_the_incident_test_finds_what_every_median_finds_with_the_same_scores() -> None:
    """`_History.spike` makes medians only for the series that may spike; oracle: the score
    against every series' median and spread, made afresh at every row, on noisy rows with spikes,
    a slow rise, a column without values for a while, zeros and an infinite value."""
    rng = np.random.default_rng(1)
    history, kept = _History(4), []
    found_any = 0
    for k in range(400):
        row = np.exp(rng.normal(0.0, 0.05, 4) + np.array([0.0, 0.0, 0.003 * k, 0.0]))  # series 2 rises
        if k < 150:
            row[1] = np.nan  # no .grad yet
        if k % 19 == 18:
            row[rng.integers(4)] *= rng.choice([2.5, 2.9, 3.2, 3.5, 8.0])  # spikes near and above RATIO
        if k == 300:
            row[3] = 0.0
        if k == 350:
            row[0] = np.inf
        want = _oracle(kept, row, RATIO)
        got = history.spike(row.copy(), RATIO)
        assert (got is None) == (want is None), k
        if want is not None:
            found_any += 1
            np.testing.assert_array_equal(got[0], want[0])
            np.testing.assert_array_equal(got[1], want[1])
        with np.errstate(divide="ignore", invalid="ignore"):
            logs = np.log(row)
        kept = (kept + [np.where(np.isfinite(logs), logs, np.nan)])[-WINDOW:]
    assert found_any >= 4, found_any  # the spikes were found, and then scored the same


def _oracle(kept: list[np.ndarray], row: np.ndarray, ratio_min: float) -> tuple[np.ndarray, np.ndarray] | None:
    if len(kept) < WARMUP:
        return None
    window = np.array(kept)
    with np.errstate(divide="ignore", invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        logs = np.log(row)
        median = np.nanmedian(window, axis=0)
        spread = np.nanmedian(np.abs(window - median), axis=0) * MAD_SIGMA
        z = np.where(spread > 0, (logs - median) / spread, np.where(logs > median, np.inf, 0.0))
        ratio = np.exp(logs - median)
        return (z, ratio) if np.any((z >= Z) & (ratio >= ratio_min)) else None

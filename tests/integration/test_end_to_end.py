"""A real training loop with the hook, a real `gradwatch serve` on SQLite, then what the server
stores and exports compared, step by step, with a naive torch oracle."""

from __future__ import annotations

import csv
import io
import math

import httpx
import pytest
import torch

import gradwatch

STEPS = 50
INF_STEP = 46  # the step whose gradient holds an Inf


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(10, 32)
        self.head = torch.nn.Linear(32, 4)
        self.unused = torch.nn.Linear(4, 4)  # grad stays None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.embed(x)))


def norm(t: torch.Tensor | None) -> float | None:
    return None if t is None else float(torch.linalg.vector_norm(t.detach().float()))


def train_with_oracle(server_url: str) -> tuple[str, list[str], dict[tuple[int, str], dict[str, object]]]:
    """Trains STEPS steps; returns run id, parameter names and the oracle per (step, param)."""
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    names = [n for n, _ in model.named_parameters()]
    params = dict(model.named_parameters())
    oracle: dict[tuple[int, str], dict[str, object]] = {}
    step = 0

    def before(opt, args, kwargs):  # registered before watch(): sees the same grads
        for n, p in params.items():
            oracle[(step, n)] = {"grad_norm": norm(p.grad)}

    def after(opt, args, kwargs):
        for n, p in params.items():
            st = opt.state.get(p, {})
            oracle[(step, n)].update(
                param_norm=norm(p), exp_avg_norm=norm(st.get("exp_avg")), exp_avg_sq_norm=norm(st.get("exp_avg_sq"))
            )

    opt.register_step_pre_hook(before)
    opt.register_step_post_hook(after)
    w = gradwatch.watch(opt, model=model, run="e2e", project="tests", server=server_url, warn=False)
    for i in range(STEPS):
        opt.zero_grad(set_to_none=True)
        loss = model(torch.randn(16, 10)).pow(2).mean()
        loss.backward()
        model.embed.bias.grad.zero_()  # a zero-filled buffer
        if i == INF_STEP - 1:
            model.head.weight.grad[0, 0] = float("inf")  # poisons Adam's state from here on
        w.log(loss=loss)
        step = i + 1
        opt.step()
    w.close(timeout=30)
    assert w.pending == 0, "every message must be acknowledged after close()"
    return w.run_id, names, oracle


def parse(cell: str) -> float | None:
    return None if cell == "" else float(cell)


def test_stored_and_exported_values_match_the_oracle(server) -> None:
    run_id, names, oracle = train_with_oracle(server.url)
    with httpx.Client(base_url=server.url, timeout=30) as http:
        run = http.get(f"/api/runs/{run_id}").json()
        assert (run["name"], run["project"], run["status"], run["steps"]) == ("e2e", "tests", "finished", STEPS)
        assert run["param_count"] == len(names)
        assert run_id in [r["id"] for r in http.get("/api/runs").json()["data"]]

        resp = http.get(f"/api/runs/{run_id}/export", params={"format": "csv"})
        assert resp.status_code == 200
        assert "attachment" in resp.headers["content-disposition"]
        rows = list(csv.DictReader(io.StringIO(resp.text)))
    assert len(rows) == STEPS * len(names)
    seen = set()
    for row in rows:
        key = (int(row["step"]), row["param"])
        seen.add(key)
        want = oracle[key]
        status, grad = row["grad_status"], want["grad_norm"]
        if grad is None:
            assert status == "none" and row["grad_norm"] == ""
        elif key[1] == "embed.bias":
            assert status == "zero" and parse(row["grad_norm"]) == 0.0
        elif key[0] < INF_STEP:
            assert status == "nonzero"
        else:
            assert status == ("nonzero" if math.isfinite(grad) else "nonfinite"), key
        if key == (INF_STEP, "head.weight"):
            assert status == "nonfinite" and parse(row["grad_norm"]) == math.inf
        for metric in ("grad_norm", "param_norm", "exp_avg_norm", "exp_avg_sq_norm"):
            expected, got = want[metric], parse(row[metric])
            if expected is None:
                assert got is None, (key, metric)
            elif math.isfinite(expected):
                assert got == pytest.approx(expected, rel=1e-5, abs=1e-30), (key, metric)
            else:
                assert got is not None and (math.isnan(expected) == math.isnan(got)), (key, metric)
    assert seen == set(oracle)


def test_series_endpoint_serves_the_logged_loss_and_total_norm(server) -> None:
    run_id, names, _ = train_with_oracle(server.url)
    with httpx.Client(base_url=server.url, timeout=30) as http:
        metrics = http.get(f"/api/runs/{run_id}/metrics").json()
        assert {"loss", "grad_norm_total", "lr/0", "mem/params_bytes"} <= set(metrics["scalars"])
        assert {"grad_norm", "param_norm", "exp_avg_norm", "exp_avg_sq_norm"} <= set(metrics["params"])
        loss = http.get(f"/api/runs/{run_id}/series", params={"key": "loss"}).json()
        assert loss["step"] == list(range(1, STEPS + 1))
        total = http.get(f"/api/runs/{run_id}/series", params={"key": "grad_norm_total"}).json()
        assert total["value"][INF_STEP - 1] == "Infinity"  # non-finite values are data, never dropped
        small = http.get(f"/api/runs/{run_id}/series", params={"key": "loss", "max_points": 10}).json()
        assert small["downsampled"] and len(small["step"]) <= 10


def test_unsampled_steps_store_their_cheap_facts_and_raise_no_findings(server) -> None:
    """every=5: all 20 steps are stored with learning rate and backward passes, four are measured
    (with per-parameter counts), and the unmeasured ones are not mistaken for steps without
    gradients."""
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    with gradwatch.watch(opt, model=model, run="sampled", project="tests", server=server.url, every=5, warn=False) as w:
        for _ in range(20):
            opt.zero_grad()
            model(torch.randn(8, 10)).pow(2).mean().backward()
            opt.step()
            sched.step()
    with httpx.Client(base_url=server.url, timeout=30) as http:
        run = http.get(f"/api/runs/{w.run_id}").json()
        assert run["steps"] == 20
        lr = http.get(f"/api/runs/{w.run_id}/series", params={"key": "lr/0"}).json()
        assert lr["step"] == list(range(1, 21))
        assert lr["value"] == pytest.approx([0.05 * 0.5**i for i in range(20)])
        # per parameter on measured steps; the sentinel's count (a scalar) on every step
        passes = http.get(
            f"/api/runs/{w.run_id}/params/series", params={"metric": "backward_passes", "param": "head.weight"}
        ).json()
        assert passes["step"] == [1, 6, 11, 16] and passes["series"][0]["value"] == [1.0] * 4
        total = http.get(f"/api/runs/{w.run_id}/series", params={"key": "backward_passes"}).json()
        assert total["step"] == list(range(1, 21)) and total["value"] == [1.0] * 20
        norms = http.get(
            f"/api/runs/{w.run_id}/params/series", params={"metric": "grad_norm", "param": "head.weight"}
        ).json()
        assert norms["step"] == [1, 6, 11, 16]
        cost = http.get(f"/api/runs/{w.run_id}/series", params={"key": "hook/sender_cpu_s"}).json()
        assert cost["step"] == [1, 6, 11, 16] and all(v > 0 for v in cost["value"])
        codes = {f["code"] for f in http.get(f"/api/runs/{w.run_id}/diagnostics").json()}
        assert "step_without_grad" not in codes, codes  # unmeasured steps are not "no gradient at all"

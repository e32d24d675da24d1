"""A real training run with `config=` against a real `gradwatch serve`: the run's context stored,
served and exported (JSON, Parquet metadata); the per-step table of scalars (CSV, JSON lines,
Parquet, the CLI) against values taken in the training loop; the smoothed series endpoint against a
reference EMA computed here."""

from __future__ import annotations

import csv
import io
import json
import math
import subprocess
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

import gradwatch
from support.ema import reference_ema
from support.server import ServerProcess, server_command, start_server

STEPS = 40
NAN_STEP = 17  # the logged loss is NaN here
NO_ACC = {5, 6, 30}  # steps that log no accuracy
CONFIG = {"lr": 0.05, "batch_size": 8, "dataset": {"name": "noise", "seed": 0}, "tags": ["a", "b"]}


@pytest.fixture(scope="module")
def trained(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[ServerProcess, str, dict[str, Any], dict[int, dict[str, float]]]]:
    """One run: the server, its id, the hello's config, and per step the scalars seen in the loop."""
    server = start_server(tmp_path_factory.mktemp("steps"))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.5)
    oracle: dict[int, dict[str, float]] = {}

    def before(o: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:  # registered first: sees the same grads
        norms = [float(torch.linalg.vector_norm(p.grad)) for p in model.parameters()]
        oracle[len(oracle) + 1] = {
            "grad_norm_total": math.sqrt(sum(n * n for n in norms)),
            "lr/0": o.param_groups[0]["lr"],
            "norms": norms,
        }  # type: ignore[dict-item]

    opt.register_step_pre_hook(before)
    w = gradwatch.watch(opt, model=model, run="ctx", project="tests", server=server.url, warn=False, config=CONFIG)
    for i in range(1, STEPS + 1):
        opt.zero_grad()
        loss = model(torch.randn(8, 6)).pow(2).mean()
        loss.backward()
        logged = {"loss": math.nan if i == NAN_STEP else float(loss.detach())}
        if i not in NO_ACC:
            logged["acc"] = i / 100
        w.log(**logged)
        opt.step()
        sched.step()
        oracle[i].update(logged)
    w.close(timeout=30)
    assert w.pending == 0
    yield server, w.run_id, w._sender.hello["run"]["config"], oracle
    server.stop()


def test_the_context_is_stored_served_and_exported(trained: Any) -> None:
    server, run_id, sent, _ = trained
    with httpx.Client(base_url=server.url, timeout=30) as http:
        run = http.get(f"/api/runs/{run_id}").json()
        first = json.loads(http.get(f"/api/runs/{run_id}/export", params={"format": "json"}).text.splitlines()[0])
        parquet = http.get(f"/api/runs/{run_id}/export", params={"format": "parquet"}).content
        steps_parquet = http.get(f"/api/runs/{run_id}/export", params={"format": "parquet", "table": "steps"}).content
    assert run["config"]["user"] == CONFIG
    assert run["config"]["context"] == sent["context"]  # as the hook sent it, every field
    assert run["config"]["context"]["optimizers"][0]["class"] == "torch.optim.sgd.SGD"
    assert run["config"]["context"]["optimizers"][0]["groups"][0]["hparams"]["momentum"] == 0.9
    assert first["run"]["config"] == run["config"]
    for blob in (parquet, steps_parquet):
        meta = pq.read_schema(io.BytesIO(blob)).metadata
        described = json.loads(meta[b"gradwatch.run"])
        assert described["run"]["id"] == run_id and described["run"]["config"] == run["config"]
        assert described["groups"][0]["hparams"]["lr"] == 0.05


def scalar_keys(http: httpx.Client, run_id: str) -> list[str]:
    keys: list[str] = http.get(f"/api/runs/{run_id}/metrics").json()["scalars"]
    return keys


def check_row(step: int, row: dict[str, float | None], oracle: dict[int, dict[str, float]]) -> None:
    want = oracle[step]
    loss = row["loss"]
    assert loss is not None
    assert math.isnan(loss) if step == NAN_STEP else loss == pytest.approx(want["loss"], rel=1e-12)
    assert row["acc"] is None if step in NO_ACC else row["acc"] == want["acc"]
    assert row["lr/0"] == pytest.approx(want["lr/0"], rel=1e-12)
    assert row["grad_norm_total"] == pytest.approx(want["grad_norm_total"], rel=1e-5)


def test_the_steps_table_holds_every_scalar_of_every_step(trained: Any) -> None:
    server, run_id, _, oracle = trained
    with httpx.Client(base_url=server.url, timeout=30) as http:
        keys = scalar_keys(http, run_id)
        response = http.get(f"/api/runs/{run_id}/export", params={"format": "csv", "table": "steps"})
        lines = http.get(f"/api/runs/{run_id}/export", params={"format": "json", "table": "steps"}).text.splitlines()
        parquet = http.get(f"/api/runs/{run_id}/export", params={"format": "parquet", "table": "steps"}).content
    assert {"loss", "acc", "lr/0", "grad_norm_total", "mem/params_bytes", "backward_passes"} <= set(keys)
    assert response.headers["content-disposition"] == 'attachment; filename="ctx.steps.csv"'
    rows = list(csv.reader(io.StringIO(response.text)))
    assert rows[0] == ["step", "time", *sorted(keys)]
    assert [int(r[0]) for r in rows[1:]] == list(range(1, STEPS + 1))
    for r in rows[1:]:
        check_row(int(r[0]), {k: None if v == "" else float(v) for k, v in zip(rows[0], r)}, oracle)

    assert len(lines) == STEPS
    for line in lines:
        obj = json.loads(line)
        check_row(obj["step"], {k: obj.get(k) if obj.get(k) != "NaN" else math.nan for k in keys}, oracle)

    table = pq.read_table(io.BytesIO(parquet))
    assert table.column_names == ["step", "time", *sorted(keys)]
    for record in table.to_pylist():
        check_row(record["step"], record, oracle)


def test_the_cli_exports_the_same_steps_table(trained: Any) -> None:
    server, run_id, _, _ = trained
    done = subprocess.run(
        [*server_command(), "export", run_id, "--table", "steps", "--db", server.db_url],
        capture_output=True,
        text=True,
        timeout=120,
        env=server.env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    online = httpx.get(f"{server.url}/api/runs/{run_id}/export", params={"table": "steps"}, timeout=30).text
    assert done.stdout == online


def test_the_per_parameter_csv_keeps_its_contract_columns(trained: Any) -> None:
    server, run_id, _, _ = trained
    text = httpx.get(
        f"{server.url}/api/runs/{run_id}/export", params={"format": "csv", "table": "params"}, timeout=30
    ).text
    header = text.splitlines()[0].split(",")
    assert header[:7] == ["step", "param", "grad_norm", "grad_status", "param_norm", "exp_avg_norm", "exp_avg_sq_norm"]
    assert "loss" not in header


@pytest.mark.parametrize(
    "params, status, detail",
    [
        ({"table": "scalars"}, 422, "table: Input should be 'params' or 'steps'"),
        ({"table": "steps", "format": "xlsx"}, 400, "format must be one of csv, json, parquet"),
    ],
)
def test_bad_export_requests_say_what_is_allowed(
    trained: Any, params: dict[str, str], status: int, detail: str
) -> None:
    server, run_id, _, _ = trained
    response = httpx.get(f"{server.url}/api/runs/{run_id}/export", params=params, timeout=30)
    assert response.status_code == status
    assert response.json()["detail"] == detail


def values_of(series: dict[str, Any]) -> list[float]:
    return [math.nan if v == "NaN" else float(v) for v in series["value"]]


def test_the_series_endpoint_smooths_the_raw_series_then_downsamples(trained: Any) -> None:
    server, run_id, _, oracle = trained
    raw = [oracle[s]["loss"] for s in range(1, STEPS + 1)]
    want = reference_ema(raw, 0.8)
    with httpx.Client(base_url=server.url, timeout=30) as http:

        def get(**params: Any) -> dict[str, Any]:
            response = http.get(f"/api/runs/{run_id}/series", params={"key": "loss", **params})
            assert response.status_code == 200, response.text
            body: dict[str, Any] = response.json()
            return body

        full = get(smooth=0.8)
        window = get(smooth=0.8, start=21, end=30)
        small = get(smooth=0.8, max_points=8)
        plain = get(max_points=8)
        for bad in (-0.1, 1, 1.5):
            response = http.get(f"/api/runs/{run_id}/series", params={"key": "loss", "smooth": bad})
            assert response.status_code == 422 and "smooth" in response.json()["detail"]
    got = values_of(full)
    assert math.isnan(got[NAN_STEP - 1])  # a NaN stays visible and stays out of the average
    np.testing.assert_allclose(
        [g for i, g in enumerate(got) if i != NAN_STEP - 1],
        [w for i, w in enumerate(want) if i != NAN_STEP - 1],
        rtol=1e-9,
    )
    # a window is smoothed with the steps before it, not restarted at its first step
    assert window["step"] == list(range(21, 31))
    np.testing.assert_allclose(values_of(window), want[20:30], rtol=1e-9)
    # downsampled: each bucket holds the mean, min and max of the smoothed steps it covers
    assert small["downsampled"] and len(small["step"]) == 8
    bounds = small["step"] + [STEPS + 1]
    for j in range(8):
        bucket = [w for w in want[bounds[j] - 1 : bounds[j + 1] - 1] if math.isfinite(w)]
        assert small["value"][j] == pytest.approx(float(np.mean(bucket)), rel=1e-9)
        assert small["min"][j] == pytest.approx(min(bucket), rel=1e-9)
    assert values_of(small) != pytest.approx(reference_ema(values_of(plain), 0.8), rel=1e-3)  # not smoothed after


def test_parameter_series_are_smoothed_per_parameter(trained: Any) -> None:
    server, run_id, _, _ = trained
    with httpx.Client(base_url=server.url, timeout=30) as http:
        params = {"metric": "grad_norm", "param": ["0.weight", "2.bias"]}
        raw = http.get(f"/api/runs/{run_id}/params/series", params=params).json()
        smooth = http.get(f"/api/runs/{run_id}/params/series", params={**params, "smooth": 0.6, "start": 11}).json()
    assert smooth["step"] == list(range(11, STEPS + 1))
    for r, s in zip(raw["series"], smooth["series"]):
        assert r["param"] == s["param"]
        np.testing.assert_allclose(values_of(s), reference_ema(values_of(r), 0.6)[10:], rtol=1e-6)


def test_the_spread_across_parameters_matches_numpy_on_the_oracle_norms(trained: Any) -> None:
    server, run_id, _, oracle = trained
    norms = np.array([oracle[s]["norms"] for s in range(1, STEPS + 1)])  # steps x parameters
    with httpx.Client(base_url=server.url, timeout=30) as http:
        full = http.get(f"/api/runs/{run_id}/params/spread", params={"metric": "grad_norm"}).json()
        small = http.get(f"/api/runs/{run_id}/params/spread", params={"max_points": 6, "start": 5}).json()
        missing = http.get(f"/api/runs/{run_id}/params/spread", params={"metric": "nope"})
        status = http.get(f"/api/runs/{run_id}/params/spread", params={"metric": "grad_status"})
    assert full["step"] == list(range(1, STEPS + 1)) and not full["downsampled"]
    assert full["params"] == [4] * STEPS and full["nonfinite"] == [0] * STEPS
    for key, q in (("min", 0), ("q25", 0.25), ("median", 0.5), ("q75", 0.75), ("max", 1)):
        np.testing.assert_allclose(full[key], np.quantile(norms, q, axis=1), rtol=1e-6)
    # downsampled: each parameter counts with its mean over the bucket's steps
    assert small["downsampled"] and len(small["step"]) == 6 and small["step"][0] == 5
    bounds = small["step"] + [STEPS + 1]
    for j in range(6):
        means = norms[bounds[j] - 1 : bounds[j + 1] - 1].mean(axis=0)
        assert small["median"][j] == pytest.approx(float(np.median(means)), rel=1e-6)
        assert small["max"][j] == pytest.approx(float(means.max()), rel=1e-6)
    assert missing.status_code == status.status_code == 404
    assert "has no float parameter metric 'nope'" in missing.json()["detail"]

"""The REST API: reads match what was ingested, exactly; bad input is a 4xx.

The module's app runs in this process (support/asgi.py: REST through httpx.ASGITransport, the
hook's messages through the ASGI websocket), once on SQLite and once on PostgreSQL
(`module_db_url`, tests/conftest.py). The tests of the pages and of the token run a real
`gradwatch serve`, over real HTTP and a real websocket.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pyarrow.parquet as pq
import pytest

from gradwatch_server import charts
from support.asgi import InProcessServer, in_process_server
from support.heatcells import EMPTY_BITS, NAN_BITS, assert_same_cells, f32_bits
from support.server import start_server
from support.wiremsg import Hook, close, f32, hello, step, with_absent

pytestmark = pytest.mark.unit  # a test that starts a server says so (@pytest.mark.server)

PARAMS = ("enc.weight", "=cmd|' /C calc'!A0", "dec.bias")
N = 40


def loss_at(i: int) -> float:
    return {5: math.nan, 17: 1000.0, 23: -math.inf}.get(i, 1.0 / i)


def grad_at(i: int) -> np.ndarray:
    values = f32(0.01 * i, 10.0 + i, np.nan if i == 30 else 1.0 / i)
    return with_absent(values, 1) if i <= 3 else values  # no grad yet for the second parameter


def status_at(i: int) -> list[int]:
    return [2, 0 if i <= 3 else 2, 3 if i == 30 else 2]


@pytest.fixture(scope="module")
def srv(module_db_url: str) -> Iterator[InProcessServer]:
    with in_process_server(module_db_url) as server:
        seed(server)
        yield server


def seed(server: InProcessServer) -> None:
    with server.hook() as hook:
        hook.call(hello("api-run", params=PARAMS, name="My run: v1/β", project="proj-a"))
        for i in range(1, N + 1):
            hook.call(
                step(
                    i,
                    i,
                    scalars={
                        "loss": loss_at(i)
                        if math.isfinite(loss_at(i))
                        else ("NaN" if math.isnan(loss_at(i)) else "-Infinity"),
                        "lr/0": 0.001,
                    },
                    arrays={
                        "grad_norm": grad_at(i),
                        "param_norm": f32(1.0, 2.0, 3.0),
                        "momentum_buffer_norm": f32(0.5, -0.0, 1e-45),
                    },
                    grad_status=status_at(i),
                )
            )
        hook.call(close(N + 1))
    for run_id, project, name in (
        ("other-1", "proj-b", "o1"),
        ("other-2", "proj-b", "o2"),
        ("real", "proj-a", "100%_real"),
    ):
        with server.hook() as hook:
            hook.call(hello(run_id, project=project, name=name))


@pytest.fixture(scope="module")
def http(srv: InProcessServer) -> Iterator[httpx.Client]:
    with srv.client(timeout=30) as client:
        yield client


def naive_buckets(n: int, buckets: int) -> list[range]:
    edges = [j * n // buckets for j in range(buckets)] + [n]
    return [range(edges[j], edges[j + 1]) for j in range(buckets)]


def json_float(x: float) -> float | str:
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    return x


# -- runs ------------------------------------------------------------------------------------


def test_health(http: httpx.Client) -> None:
    # `worker`: the process that answered (one process without --workers: the server's own, here this one)
    assert http.get("/api/health").json() == {"status": "ok", "version": "0.1.0", "worker": os.getpid()}


def test_run_list_filters_and_pages(http: httpx.Client) -> None:
    body = http.get("/api/runs").json()
    assert body["count"] == 4 and {r["id"] for r in body["data"]} == {"api-run", "other-1", "other-2", "real"}
    in_b = http.get("/api/runs", params={"project": "proj-b"}).json()["data"]
    assert [r["id"] for r in in_b] == ["other-1", "other-2"]
    assert [r["id"] for r in http.get("/api/runs", params={"q": "MY RUN"}).json()["data"]] == ["api-run"]
    assert [r["id"] for r in http.get("/api/runs", params={"q": "100%"}).json()["data"]] == ["real"]
    assert http.get("/api/runs", params={"q": "%"}).json()["count"] == 1  # % is a character, not a wildcard
    assert [r["id"] for r in http.get("/api/runs", params={"status": "finished"}).json()["data"]] == ["api-run"]
    page = http.get("/api/runs", params={"limit": 1, "offset": 1}).json()
    assert page["count"] == 4 and len(page["data"]) == 1


def test_run_detail(http: httpx.Client) -> None:
    run = http.get("/api/runs/api-run").json()
    assert run["name"] == "My run: v1/β" and run["project"] == "proj-a" and run["status"] == "finished"
    assert run["steps"] == N and run["last_step"] == N and run["param_count"] == 3
    assert run["optimizer"] == "AdamW" and run["config"] == {"every": 1}
    assert run["created_at"] == 1_700_000_000.0 and run["finished_at"] >= run["created_at"]


def test_params_and_metrics(http: httpx.Client) -> None:
    params = http.get("/api/runs/api-run/params").json()
    assert params["count"] == 3
    assert params["data"][0] == {
        "index": 0,
        "name": "enc.weight",
        "shape": [2, 3],
        "numel": 6,
        "dtype": "float32",
        "group": 0,
        "optimizer": 0,
    }
    assert [p["name"] for p in params["data"]] == list(PARAMS)
    assert http.get("/api/runs/api-run/metrics").json() == {
        "scalars": ["loss", "lr/0"],
        "params": ["grad_norm", "grad_status", "momentum_buffer_norm", "param_norm"],
    }


def test_groups(http: httpx.Client) -> None:
    assert http.get("/api/runs/api-run/groups").json() == {
        "data": [{"optimizer": 0, "index": 0, "name": None, "hparams": {"lr": 0.001, "betas": [0.9, 0.999]}}],
        "count": 1,
    }
    assert http.get("/api/runs/nope/groups").status_code == 404


def test_run_list_counts_findings_by_severity(http: httpx.Client) -> None:
    """Each run of the list carries its stored findings' counts, the same as /diagnostics lists."""
    listed = {r["id"]: r for r in http.get("/api/runs").json()["data"]}
    for run_id, run in listed.items():
        found = http.get(f"/api/runs/{run_id}/diagnostics").json()
        expected = {sev: sum(f["severity"] == sev for f in found) for sev in ("error", "warning", "info")}
        assert run["findings"] == expected, run_id
        assert http.get(f"/api/runs/{run_id}").json()["findings"] == expected
    assert listed["api-run"]["findings"] == {"error": 1, "warning": 0, "info": 0}  # the NaN at step 30
    assert listed["other-1"]["findings"] == {"error": 0, "warning": 0, "info": 0}


def test_tags_set_filter_and_keep_the_name(http: httpx.Client) -> None:
    try:
        response = http.patch("/api/runs/other-1", json={"tags": ["sweep", "  lr 3e-4 ", "sweep", "<b>β</b>"]})
        assert response.status_code == 200
        assert response.json()["tags"] == ["sweep", "lr 3e-4", "<b>β</b>"]  # trimmed, repeats dropped, order kept
        assert response.json()["name"] == "o1"
        assert http.patch("/api/runs/other-2", json={"name": "o2-renamed", "tags": ["sweep"]}).json()["tags"] == [
            "sweep"
        ]
        assert http.get("/api/runs/other-1").json()["tags"] == ["sweep", "lr 3e-4", "<b>β</b>"]
        assert [r["id"] for r in http.get("/api/runs", params={"tag": "sweep"}).json()["data"]] == [
            "other-1",
            "other-2",
        ]
        assert [r["id"] for r in http.get("/api/runs", params={"tag": "<b>β</b>"}).json()["data"]] == ["other-1"]
        assert http.get("/api/runs", params={"tag": "swe"}).json()["count"] == 0  # exact, not a substring
        assert http.get("/api/runs", params={"tag": "sweep", "project": "proj-a"}).json()["count"] == 0
        assert http.get("/api/runs", params={"tag": "sweep\x00"}).json() == {"data": [], "count": 0}
        assert http.get("/api/runs", params={"tag": "x" * 65}).status_code == 422
        # A rename leaves the tags; tags: [] clears them.
        assert http.patch("/api/runs/other-1", json={"name": "o1-renamed"}).json()["tags"] == [
            "sweep",
            "lr 3e-4",
            "<b>β</b>",
        ]
        assert http.patch("/api/runs/other-1", json={"tags": []}).json()["tags"] == []
        assert [r["id"] for r in http.get("/api/runs", params={"tag": "sweep"}).json()["data"]] == ["other-2"]
    finally:
        http.patch("/api/runs/other-1", json={"name": "o1", "tags": []})
        http.patch("/api/runs/other-2", json={"name": "o2", "tags": []})


@pytest.mark.parametrize(
    ("body", "text"),
    [
        ({}, 'give "name", "tags" or both'),
        ({"tags": ["a,b"]}, "comma"),
        ({"tags": ["   "]}, "tags.0"),
        ({"tags": ["x" * 65]}, "at most 64 characters"),
        ({"tags": ["a\x00b"]}, "control characters"),
        ({"tags": ["a\nb"]}, "control characters"),
        ({"tags": [f"t{i}" for i in range(33)]}, "at most 32 items"),
        ({"tags": "sweep"}, "valid list"),
        ({"tags": [3]}, "valid string"),
        ({"name": ""}, "name"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_bad_updates_are_422_with_a_message(http: httpx.Client, body: dict[str, object], text: str) -> None:
    before = http.get("/api/runs/other-1").json()
    response = http.patch("/api/runs/other-1", json=body)
    assert response.status_code == 422
    detail = response.json()["detail"]
    assert isinstance(detail, str) and text in detail, detail
    after = http.get("/api/runs/other-1").json()
    assert (after["name"], after["tags"]) == (before["name"], before["tags"])


# -- series ----------------------------------------------------------------------------------


def test_scalar_series_is_exact_without_downsampling(http: httpx.Client) -> None:
    body = http.get("/api/runs/api-run/series", params={"key": "loss"}).json()
    assert body == {
        "key": "loss",
        "downsampled": False,
        "step": list(range(1, N + 1)),
        "value": [json_float(loss_at(i)) for i in range(1, N + 1)],
        "min": None,
        "max": None,
    }
    window = http.get("/api/runs/api-run/series", params={"key": "loss", "start": 10, "end": 12}).json()
    assert window["step"] == [10, 11, 12]


@pytest.mark.parametrize(
    "path, params",
    [("/api/runs/api-run/series", {"key": "loss"}), ("/api/runs/api-run/params/series", {"metric": "param_norm"})],
)
def test_a_smoothed_series_past_the_raw_row_limit_is_a_422_that_says_what_to_ask(
    http: httpx.Client, monkeypatch: pytest.MonkeyPatch, path: str, params: dict[str, object]
) -> None:
    monkeypatch.setattr(charts, "SMOOTH_ROWS", N - 1)  # the run has N steps: one more than the limit
    refused = http.get(path, params={**params, "smooth": 0.5})
    assert refused.status_code == 422
    assert refused.json()["detail"].startswith(f"smooth: {next(iter(params.values()))!r} has {N} stored steps")
    assert "without smooth" in refused.json()["detail"] and "earlier end" in refused.json()["detail"]
    served = http.get(path, params={**params, "smooth": 0.5, "end": N - 1})  # N - 1 steps up to end
    assert served.status_code == 200 and served.json()["step"] == list(range(1, N))
    assert http.get(path, params=params).status_code == 200  # unsmoothed: no limit


def test_series_wall_time_on_request(http: httpx.Client) -> None:
    """?time=true adds each point's wall time (the step's `time`) and the run's first step's."""
    body = http.get("/api/runs/api-run/series", params={"key": "loss", "time": "true"}).json()
    assert body["time"] == [1_700_000_000.0 + i for i in range(1, N + 1)] and body["time0"] == 1_700_000_001.0
    window = http.get("/api/runs/api-run/series", params={"key": "loss", "start": 10, "end": 12, "time": True}).json()
    assert window["time"] == [1_700_000_010.0, 1_700_000_011.0, 1_700_000_012.0]
    assert window["time0"] == 1_700_000_001.0  # the run's first step, not the window's
    binned = http.get("/api/runs/api-run/series", params={"key": "loss", "max_points": 6, "time": True}).json()
    assert binned["time"] == [1_700_000_000.0 + s for s in binned["step"]]  # each bucket's first step
    params = http.get(
        "/api/runs/api-run/params/series", params={"metric": "grad_norm", "param": "enc.weight", "end": 3, "time": True}
    ).json()
    assert params["time"] == [1_700_000_001.0, 1_700_000_002.0, 1_700_000_003.0] and params["time0"] == 1_700_000_001.0
    plain = http.get("/api/runs/api-run/params/series", params={"metric": "grad_norm", "param": "enc.weight"}).json()
    assert "time" not in plain and "time0" not in plain


def test_scalar_series_downsampled_keeps_spikes_and_non_finite(http: httpx.Client) -> None:
    body = http.get("/api/runs/api-run/series", params={"key": "loss", "max_points": 6}).json()
    assert body["downsampled"] is True and len(body["step"]) == 6
    values = [loss_at(i) for i in range(1, N + 1)]
    for j, bucket in enumerate(naive_buckets(N, 6)):
        chunk = [values[k] for k in bucket]
        finite = [v for v in chunk if math.isfinite(v)]
        assert body["step"][j] == bucket[0] + 1
        assert body["value"][j] == pytest.approx(sum(finite) / len(finite))
        ordered = [v for v in chunk if not math.isnan(v)]
        assert body["max"][j] == ("NaN" if any(math.isnan(v) for v in chunk) else json_float(max(ordered)))
        assert body["min"][j] == json_float(min(ordered))
    assert 1000.0 in body["max"] and "NaN" in body["max"] and "-Infinity" in body["min"]


def test_param_series_by_name_and_top(http: httpx.Client) -> None:
    named = http.get(
        "/api/runs/api-run/params/series", params={"metric": "grad_norm", "param": [PARAMS[1], "enc.weight"]}
    ).json()
    assert [s["param"] for s in named["series"]] == [PARAMS[1], "enc.weight"]
    assert [s["index"] for s in named["series"]] == [1, 0]
    assert named["series"][0]["value"][:4] == [None, None, None, float(np.float32(14.0))]
    assert named["series"][1]["value"] == [float(np.float32(0.01 * i)) for i in range(1, N + 1)]

    # At the last step (40): 0.4, 50.0, 0.025 -> descending 1, 0, 2; ascending 2, 0, 1.
    top = http.get("/api/runs/api-run/params/series", params={"metric": "grad_norm", "top": 2}).json()
    assert [s["index"] for s in top["series"]] == [1, 0]
    low = http.get("/api/runs/api-run/params/series", params={"metric": "grad_norm", "top": 2, "order": "asc"}).json()
    assert [s["index"] for s in low["series"]] == [2, 0]
    # At step 30 the third parameter is NaN: it ranks first, a blow-up is what one looks for.
    nan_top = http.get("/api/runs/api-run/params/series", params={"metric": "grad_norm", "top": 1, "end": 30}).json()
    assert [s["index"] for s in nan_top["series"]] == [2] and nan_top["series"][0]["value"][-1] == "NaN"


def test_param_series_top_ranked_by_another_metric(http: httpx.Client) -> None:
    """rank_by: the param_norm series (1, 2, 3 at every step) of the top by grad_norm."""
    get = lambda **p: http.get("/api/runs/api-run/params/series", params={"metric": "param_norm", **p})  # noqa: E731
    by_grad = get(top=2, rank_by="grad_norm").json()
    assert [s["index"] for s in by_grad["series"]] == [1, 0]  # grad_norm at step 40: 0.4, 50.0, 0.025
    assert [s["value"][-1] for s in by_grad["series"]] == [2.0, 1.0]
    assert [s["index"] for s in get(top=2).json()["series"]] == [2, 1]  # by param_norm itself
    assert [s["index"] for s in get(top=2, order="asc", rank_by="grad_norm").json()["series"]] == [2, 0]
    assert [s["index"] for s in get(top=1, end=30, rank_by="grad_norm").json()["series"]] == [2]  # NaN first
    # The same choice as asking grad_norm for its top: what the run page relies on.
    grad_top = http.get("/api/runs/api-run/params/series", params={"metric": "grad_norm", "top": 3}).json()
    assert [s["param"] for s in get(top=3, rank_by="grad_norm").json()["series"]] == [
        s["param"] for s in grad_top["series"]
    ]
    empty = get(top=2, end=0, rank_by="grad_norm")
    assert empty.status_code == 200 and empty.json()["series"] == [] and empty.json()["step"] == []
    missing = get(top=2, rank_by="nope")
    assert missing.status_code == 404 and "no parameter metric 'nope'" in missing.json()["detail"]
    unknown_metric = http.get(
        "/api/runs/api-run/params/series", params={"metric": "nope", "rank_by": "grad_norm", "end": 0}
    )
    assert unknown_metric.status_code == 404


def test_param_series_downsampled_ignores_absent(http: httpx.Client) -> None:
    body = http.get(
        "/api/runs/api-run/params/series", params={"metric": "grad_norm", "param": PARAMS[1], "max_points": 20}
    ).json()
    series = body["series"][0]
    assert body["downsampled"] is True and body["step"][:2] == [1, 3]
    assert series["value"][0] is None and series["min"][0] is None  # steps 1-2: ABSENT only
    assert series["value"][1] == pytest.approx(14.0)  # steps 3-4: ABSENT and 14
    assert series["max"][-1] == 50.0


def test_momentum_keeps_negative_zero_and_subnormals(http: httpx.Client) -> None:
    body = http.get(
        "/api/runs/api-run/params/series",
        params={"metric": "momentum_buffer_norm", "param": [PARAMS[1], "dec.bias"], "end": 1},
    ).json()
    neg_zero, tiny = body["series"][0]["value"][0], body["series"][1]["value"][0]
    assert neg_zero == 0.0 and math.copysign(1.0, neg_zero) == -1.0
    assert tiny == float(np.float32(1e-45)) and tiny > 0


def test_heatmap(http: httpx.Client) -> None:
    full = http.get("/api/runs/api-run/heatmap", params={"metric": "grad_norm"}).json()
    assert full["downsampled"] is False and full["params"] == list(PARAMS) and full["step"] == list(range(1, N + 1))
    assert full["z"][1][:4] == [None, None, None, float(np.float32(14.0))]
    binned = http.get("/api/runs/api-run/heatmap", params={"metric": "grad_norm", "max_steps": 4}).json()
    assert binned["downsampled"] is True and binned["step"] == [1, 11, 21, 31]
    assert binned["z"][0] == [float(np.float32(0.01 * i)) for i in (10, 20, 30, 40)]
    assert binned["z"][2][2] == "NaN"  # step 30's NaN wins its bucket
    status = http.get("/api/runs/api-run/heatmap", params={"metric": "grad_status", "max_steps": 4}).json()
    assert status["z"] == [[2, 2, 2, 2], [2, 2, 2, 2], [2, 2, 3, 2]]


@pytest.mark.parametrize(
    "params",
    [
        {"metric": "grad_norm"},  # raw: ABSENT cells (steps 1-3 of the second parameter), a NaN
        {"metric": "grad_norm", "max_steps": 4},  # downsampled
        {"metric": "grad_norm", "start": 2, "end": 31, "max_steps": 7},  # a window in uneven buckets
        {"metric": "momentum_buffer_norm", "max_steps": 3},  # -0.0 and the smallest subnormal
        {"metric": "grad_status"},
        {"metric": "grad_status", "max_steps": 4},
        {"metric": "grad_norm", "start": 1000},  # no step in the window: no cells
    ],
)
def test_heatmap_f32_holds_the_json_cells(http: httpx.Client, params: dict[str, object]) -> None:
    as_json = http.get("/api/runs/api-run/heatmap", params=params).json()
    as_f32 = http.get("/api/runs/api-run/heatmap", params={**params, "encoding": "f32"}).json()
    assert_same_cells(as_json, as_f32)
    assert http.get("/api/runs/api-run/heatmap", params={**params, "encoding": "json"}).json() == as_json


def test_heatmap_f32_cells(http: httpx.Client) -> None:
    def cells(**params: object) -> np.ndarray:
        return f32_bits(http.get("/api/runs/api-run/heatmap", params={**params, "encoding": "f32"}).json())

    grad = cells(metric="grad_norm")
    assert grad.shape == (3, N) and (grad[1, :3] == EMPTY_BITS).all()  # no grad yet: EMPTY
    assert grad[1, 3] == np.float32(14.0).view("<u4") and grad[2, 29] == NAN_BITS  # step 30's NaN
    assert grad.view("<f4")[0].tolist() == [float(np.float32(0.01 * i)) for i in range(1, N + 1)]
    momentum = cells(metric="momentum_buffer_norm", max_steps=3)
    assert (momentum[1] == 0x80000000).all() and (momentum[2] == 1).all()  # -0.0; 1e-45 as float32
    status = cells(metric="grad_status", max_steps=4)
    assert status.view("<f4").tolist() == [[2, 2, 2, 2], [2, 2, 2, 2], [2, 2, 3, 2]]


# -- export ----------------------------------------------------------------------------------


def test_export_csv(http: httpx.Client) -> None:
    response = http.get("/api/runs/api-run/export", params={"format": "csv"})
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/csv")
    assert response.headers["content-disposition"] == 'attachment; filename="My_run_v1.csv"'
    rows = list(csv.DictReader(io.StringIO(response.text)))
    assert list(rows[0]) == [
        "step",
        "param",
        "grad_norm",
        "grad_status",
        "param_norm",
        "exp_avg_norm",
        "exp_avg_sq_norm",
        "momentum_buffer_norm",
    ]
    assert len(rows) == N * 3
    by_key = {(int(r["step"]), r["param"]): r for r in rows}
    assert by_key[(1, "'" + PARAMS[1])]["grad_norm"] == ""  # ABSENT; the name is defused
    assert by_key[(1, "'" + PARAMS[1])]["grad_status"] == "none"
    assert by_key[(1, "'" + PARAMS[1])]["momentum_buffer_norm"] == "-0.0"
    assert by_key[(30, "dec.bias")]["grad_norm"] == "nan" and by_key[(30, "dec.bias")]["grad_status"] == "nonfinite"
    assert by_key[(1, "enc.weight")]["exp_avg_norm"] == ""
    for i in range(1, N + 1):
        for j, name in enumerate(PARAMS):
            cell = by_key[(i, "'" + name if j == 1 else name)]["grad_norm"]
            expected = grad_at(i)[j]
            if cell:
                assert np.float32(float(cell)).tobytes() == expected.tobytes() or (np.isnan(expected) and cell == "nan")


def test_export_json_lines(http: httpx.Client) -> None:
    response = http.get("/api/runs/api-run/export", params={"format": "json"})
    assert response.headers["content-disposition"].endswith('.jsonl"')
    lines = [json.loads(line) for line in response.text.splitlines()]
    assert lines[0]["type"] == "run" and lines[0]["run"]["id"] == "api-run"
    assert [p["name"] for p in lines[0]["params"]] == list(PARAMS)
    assert lines[0]["groups"] == [
        {"optimizer": 0, "index": 0, "name": None, "hparams": {"lr": 0.001, "betas": [0.9, 0.999]}}
    ]
    steps = lines[1:]
    assert [s["step"] for s in steps] == list(range(1, N + 1))
    assert steps[4]["scalars"] == {"loss": "NaN", "lr/0": 0.001}
    assert steps[0]["params"]["grad_norm"][1] is None and steps[29]["params"]["grad_norm"][2] == "NaN"
    assert steps[29]["grad_status"] == [2, 2, 3]


def test_export_parquet(http: httpx.Client) -> None:
    response = http.get("/api/runs/api-run/export", params={"format": "parquet"})
    assert response.headers["content-disposition"] == 'attachment; filename="My_run_v1.parquet"'
    table = pq.read_table(io.BytesIO(response.content))
    assert table.column_names[:7] == [
        "step",
        "param",
        "grad_norm",
        "grad_status",
        "param_norm",
        "exp_avg_norm",
        "exp_avg_sq_norm",
    ]
    assert table.num_rows == N * 3
    data = table.to_pydict()
    assert data["grad_norm"][1] is None  # ABSENT is null
    nan_row = 29 * 3 + 2
    assert data["param"][nan_row] == "dec.bias" and math.isnan(data["grad_norm"][nan_row])
    assert data["grad_status"][nan_row] == "nonfinite"
    assert table.schema.field("grad_norm").type == "float"


# -- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "",
        "/params",
        "/metrics",
        "/series?key=loss",
        "/params/series?metric=grad_norm",
        "/heatmap?metric=grad_norm",
        "/export",
        "/diagnostics",
    ],
)
def test_unknown_run_is_404(http: httpx.Client, path: str) -> None:
    response = http.get(f"/api/runs/nope{path}")
    assert response.status_code == 404 and "no run with id 'nope'" in response.json()["detail"]
    assert response.json()["run"] == "unknown" and "deleted_at" not in response.json()


@pytest.mark.parametrize(
    ("path", "params", "code", "text"),
    [
        ("/export", {"format": "xml"}, 400, "format must be one of csv, json, parquet"),
        ("/series", {"key": "loss", "max_points": 1}, 422, "max_points"),
        ("/series", {}, 422, "key"),
        ("/series", {"key": "nope"}, 404, "no scalar 'nope'"),
        ("/series", {"key": "loss", "start": "abc"}, 422, "start"),
        ("/series", {"key": "loss", "end": 2**63}, 422, "end"),  # steps are 64-bit in both databases
        ("/series", {"key": "lo\x00ss"}, 404, "no scalar"),
        ("/params/series", {"metric": "nope"}, 404, "no parameter metric 'nope'"),
        ("/params/series", {"metric": "grad_norm", "param": "nope"}, 404, "no parameter 'nope'"),
        ("/params/series", {"metric": "grad_norm", "param": "no\x00pe"}, 404, "no parameter"),
        ("/params/series", {"metric": "grad_norm", "top": 0}, 422, "top"),
        ("/params/series", {"metric": "grad_norm", "order": "up"}, 422, "order"),
        ("/heatmap", {"metric": "grad_norm", "max_steps": 0}, 422, "max_steps"),
        ("/heatmap", {"metric": "grad_norm", "encoding": "f16"}, 422, "encoding: Input should be 'json' or 'f32'"),
        ("/heatmap", {"metric": "grad_norm", "encoding": ""}, 422, "encoding"),
        ("/heatmap", {"metric": "nope", "encoding": "f32"}, 404, "no parameter metric 'nope'"),
    ],
)
def test_bad_parameters_are_4xx_with_a_message(
    http: httpx.Client, path: str, params: dict[str, object], code: int, text: str
) -> None:
    response = http.get(f"/api/runs/api-run{path}", params=params)
    assert response.status_code == code
    detail = response.json()["detail"]
    assert isinstance(detail, str) and text in detail


def test_bad_run_list_parameters(http: httpx.Client) -> None:
    for params in ({"status": "bogus"}, {"limit": 0}, {"offset": -1}):
        response = http.get("/api/runs", params=params)
        assert response.status_code == 422 and isinstance(response.json()["detail"], str)


def test_text_with_a_nul_matches_nothing_and_is_never_stored(http: httpx.Client) -> None:
    """PostgreSQL cannot hold or compare U+0000 in text: lookups find nothing, writes are refused."""
    assert http.get("/api/runs/api%00run").status_code == 404
    for params in ({"q": "api\x00"}, {"project": "proj-a\x00"}):
        assert http.get("/api/runs", params=params).json() == {"data": [], "count": 0}
    response = http.patch("/api/runs/api-run", json={"name": "a\x00b"})
    assert response.status_code == 422 and "NUL" in json.dumps(response.json())
    assert http.get("/api/runs/api-run").json()["name"] == "My run: v1/β"


def test_diagnostics_lists_findings(http: httpx.Client) -> None:
    """The NaN gradient of dec.bias at step 30 (status_at) is the run's one finding."""
    found = http.get("/api/runs/api-run/diagnostics").json()
    assert [(f["code"], f["severity"], f["params"], f["first_step"]) for f in found] == [
        ("nonfinite_grad", "error", ["dec.bias"], 30)
    ]
    assert "step 30" in found[0]["message"] and found[0]["figure"] is None
    assert http.get("/api/runs/other-1/diagnostics").json() == []
    assert http.get("/api/runs/nope/diagnostics").status_code == 404


def test_openapi_documents_the_routes(http: httpx.Client) -> None:
    paths = http.get("/openapi.json").json()["paths"]
    for path in (
        "/api/health",
        "/api/runs",
        "/api/runs/{run_id}",
        "/api/runs/{run_id}/series",
        "/api/runs/{run_id}/params/series",
        "/api/runs/{run_id}/heatmap",
        "/api/runs/{run_id}/export",
    ):
        assert path in paths
    assert http.get("/docs").status_code == 200


def test_openapi_documents_the_heatmap_encodings(http: httpx.Client) -> None:
    schema = http.get("/openapi.json").json()
    query = {p["name"]: p for p in schema["paths"]["/api/runs/{run_id}/heatmap"]["get"]["parameters"]}
    assert query["encoding"]["schema"]["enum"] == ["json", "f32"] and query["encoding"]["schema"]["default"] == "json"
    heatmap = schema["components"]["schemas"]["Heatmap"]
    assert "z" in heatmap["required"] and "z_f32" not in heatmap["required"]
    assert {"type": "null"} in heatmap["properties"]["z"]["anyOf"]  # null with encoding=f32
    assert "0x7FC00001" in heatmap["properties"]["z_f32"]["description"]


# -- pages -----------------------------------------------------------------------------------


@pytest.mark.server
def test_pages_and_static_files(tmp_path: Path) -> None:
    frontend = tmp_path / "frontend"
    (frontend / "js").mkdir(parents=True)
    for page in ("index.html", "run.html"):
        (frontend / page).write_text(f"<title>{page}</title>")
    (frontend / "js" / "app.js").write_text("export {};")
    server = start_server(tmp_path, env={"GRADWATCH_FRONTEND_DIR": str(frontend)})
    try:
        with httpx.Client(base_url=server.url) as http:
            assert http.get("/").text == "<title>index.html</title>"
            assert http.get("/runs/abc").text == "<title>run.html</title>"
            missing = http.get("/compare")
            assert missing.status_code == 404 and "compare.html" in missing.text
            assert http.get("/static/js/app.js").text == "export {};"
            # No vendor/plotly.min.js in this frontend (npm never ran): the plotly package's full bundle.
            plotly = http.get("/static/vendor/plotly.min.js")
            assert plotly.status_code == 200 and "plotly" in plotly.text[:200].lower()
            assert "javascript" in plotly.headers["content-type"]
            assert len(plotly.content) > 3_000_000
            # With the dashboard's own bundle (make setup puts it there), that one.
            (frontend / "vendor").mkdir()
            (frontend / "vendor" / "plotly.min.js").write_text("/* plotly.js basic */")
            own = http.get("/static/vendor/plotly.min.js")
            assert own.text == "/* plotly.js basic */" and "javascript" in own.headers["content-type"]
            assert http.get("/static/nope.js").status_code == 404
    finally:
        server.stop()


@pytest.mark.server
def test_writes_need_the_token(tmp_path: Path) -> None:
    server = start_server(tmp_path, token="tok")
    try:
        with Hook(server.ws_url, token="tok") as hook:
            hook.call(hello("victim"))
        with httpx.Client(base_url=server.url) as http:
            assert http.patch("/api/runs/victim", json={"name": "x"}).status_code == 401
            assert http.delete("/api/runs/victim", headers={"Authorization": "Bearer bad"}).status_code == 401
            auth = {"Authorization": "Bearer tok"}
            renamed = http.patch("/api/runs/victim", json={"name": "renamed"}, headers=auth)
            assert renamed.status_code == 200 and renamed.json()["name"] == "renamed"
            assert http.patch("/api/runs/victim", json={"name": ""}, headers=auth).status_code == 422
            # Tags are a write like any other; without the token even a bad body is a 401.
            assert http.patch("/api/runs/victim", json={"tags": ["x"]}).status_code == 401
            assert http.patch("/api/runs/victim", json={"tags": ["a,b"]}).status_code == 401
            assert http.get("/api/runs/victim").json()["tags"] == []
            tagged = http.patch("/api/runs/victim", json={"tags": ["kept"]}, headers=auth)
            assert tagged.status_code == 200 and tagged.json()["tags"] == ["kept"]
            assert http.get("/api/runs", params={"tag": "kept"}).json()["count"] == 1  # reads stay open
            assert http.delete("/api/runs/victim", headers=auth).status_code == 204
            gone = http.get("/api/runs/victim")
            assert gone.status_code == 404 and gone.json()["run"] == "deleted"
            assert "was deleted" in gone.json()["detail"] and gone.json()["deleted_at"] > 0
            assert http.get("/api/runs/victim/series", params={"key": "loss"}).json()["run"] == "deleted"
            assert http.delete("/api/runs/victim", headers=auth).status_code == 404
    finally:
        server.stop()


def test_bad_new_query_parameters_get_clear_4xx(http: httpx.Client) -> None:
    """rank_by (unknown or empty metric), time (not a boolean), tag (too long): a 4xx that says what."""
    unknown = http.get("/api/runs/api-run/params/series", params={"metric": "grad_norm", "rank_by": "no_such_metric"})
    assert unknown.status_code == 404 and "no_such_metric" in unknown.text
    empty = http.get("/api/runs/api-run/params/series", params={"metric": "grad_norm", "rank_by": ""})
    assert empty.status_code == 422 and "rank_by" in empty.text
    maybe = http.get("/api/runs/api-run/series", params={"key": "loss", "time": "maybe"})
    assert maybe.status_code == 422 and "time" in maybe.text
    long_tag = http.get("/api/runs", params={"tag": "x" * 1000})
    assert 400 <= long_tag.status_code < 500, long_tag.text

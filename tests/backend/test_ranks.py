"""A distributed job as a user reads it back: GET /api/runs/{id}/ranks and the exports' `rank` column.

A real `gradwatch serve` (on SQLite and on PostgreSQL) gets a job of two ranks over two real
websockets (support/synthetic_dist.py): both send steps 1..37, then rank 1's connection drops and
rank 0 goes on to step 60 and finishes. What the endpoints answer is checked against what was
sent, and each export's per-rank rows against the rank's own run read back through REST.
"""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pyarrow.parquet as pq
import pytest

from support.server import ServerProcess, server_command, start_server
from support.synthetic import Ingest, SyntheticRun
from support.synthetic_dist import RankRun, rank_runs, send_job

pytestmark = pytest.mark.server

JOB = "job2ranks"
STEPS, LOST_AFTER = 60, 37
#: A job of three ranks that loses rank 2 after step 10, then rank 1 after step 20, of 30.
JOB3 = "job3ranks"
RANK_TIMEOUT_S = 1.0
#: A job of 12 ranks over 20 steps whose rank 5 is a straggler: the spread across ranks.
JOB12, STEPS12, STRAGGLER12 = "job12ranks", 20, 5
JOB12_RANKS = rank_runs(JOB12, "twelve", 12, straggler=STRAGGLER12)  # what each sent, once sent


@pytest.fixture(scope="module")
def job(module_db_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, list[RankRun]]]:
    server = start_server(
        tmp_path_factory.mktemp("ranks"), db_url=module_db_url, args=("--rank-timeout", str(RANK_TIMEOUT_S))
    )
    try:
        ranks = rank_runs(JOB, "ddp-two", 2, straggler=1)
        send_job(server.ws_url, ranks, STEPS, lost={1: LOST_AFTER})
        send_job(server.ws_url, rank_runs(JOB3, "three", 3), 30, lost={2: 10, 1: 20})
        send_job(server.ws_url, JOB12_RANKS, STEPS12)
        with Ingest(server.ws_url, SyntheticRun("single", "one-process", params=ranks[0].params)) as hook:
            hook.steps(5)
            hook.close()
        wait_assembled(server.url, JOB, STEPS)
        wait_assembled(server.url, JOB3, 30)
        wait_assembled(server.url, JOB12, STEPS12)
        yield server, ranks
    finally:
        server.stop()


@pytest.fixture
def http(job: tuple[ServerProcess, list[RankRun]]) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=job[0].url, timeout=30) as client:
        yield client


def wait_assembled(url: str, job_id: str, steps: int, timeout_s: float = 30.0) -> None:
    """Until the job's run has every step and is no longer running (the lost rank timed out)."""
    deadline = time.monotonic() + timeout_s
    run: dict[str, object] = {}
    while time.monotonic() < deadline:
        answer = httpx.get(f"{url}/api/runs/{job_id}", timeout=10)
        if answer.status_code == 200:
            run = answer.json()
            if run["steps"] == steps and run["status"] != "running":
                return
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} not assembled in {timeout_s} s: {run}")


def test_ranks_lists_each_rank_the_lost_one_and_the_partial_steps(http: httpx.Client) -> None:
    answer = http.get(f"/api/runs/{JOB}/ranks")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["world_size"] == 2
    assert body["partial"] == {"steps": STEPS - LOST_AFTER, "ranges": [{"first": 38, "last": 60, "missing": [1]}]}
    r0, r1 = body["ranks"]
    assert (r0["rank"], r0["run_id"], r0["status"], r0["last_step"], r0["steps"], r0["lost"]) == (
        0,
        f"{JOB}.r0",
        "finished",
        STEPS,
        STEPS,
        False,
    )
    assert (r1["rank"], r1["run_id"], r1["status"], r1["last_step"], r1["steps"], r1["lost"]) == (
        1,
        f"{JOB}.r1",
        "crashed",
        LOST_AFTER,
        LOST_AFTER,
        True,
    )
    # updated_at is the rank's run's own, as GET /api/runs/{child} says.
    for rank in (r0, r1):
        assert rank["updated_at"] == http.get(f"/api/runs/{rank['run_id']}").json()["updated_at"]


def test_partial_ranges_follow_each_rank_lost(http: httpx.Client) -> None:
    body = http.get(f"/api/runs/{JOB3}/ranks").json()
    assert body["partial"] == {
        "steps": 20,
        "ranges": [{"first": 11, "last": 20, "missing": [2]}, {"first": 21, "last": 30, "missing": [1, 2]}],
    }
    assert [(r["rank"], r["last_step"], r["lost"]) for r in body["ranks"]] == [
        (0, 30, False),
        (1, 20, True),
        (2, 10, True),
    ]


def test_a_running_rank_silent_past_the_timeout_is_lost(job: tuple[ServerProcess, list[RankRun]]) -> None:
    server = job[0]
    hooks = [Ingest(server.ws_url, r) for r in rank_runs("silentjob", "silent", 2)]
    try:
        for hook in hooks:
            hook.steps(3)
        hooks[0].steps(3)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            body = httpx.get(f"{server.url}/api/runs/silentjob/ranks", timeout=10).json()
            if body["ranks"][1]["lost"]:
                break
            time.sleep(0.1)
        assert [(r["rank"], r["status"], r["lost"]) for r in body["ranks"]] == [
            (0, "running", False),
            (1, "running", True),
        ]
        # Not before the timeout: the rank is lost only once silent for --rank-timeout.
        heard = body["ranks"][1]["updated_at"]
        assert time.time() - heard >= RANK_TIMEOUT_S
    finally:
        for hook in hooks:
            hook.close("finished")
            hook.__exit__(None, None, None)


def test_ranks_of_a_single_process_run_and_bad_ids(http: httpx.Client) -> None:
    assert http.get("/api/runs/single/ranks").json() == {
        "world_size": 1,
        "ranks": [],
        "partial": {"steps": 0, "ranges": []},
    }
    unknown = http.get("/api/runs/nosuchrun/ranks")
    assert unknown.status_code == 404
    assert unknown.json()["run"] == "unknown"
    child = http.get(f"/api/runs/{JOB}.r1/ranks")
    assert child.status_code == 400
    assert child.json()["detail"] == (
        f"run '{JOB}.r1' is rank 1 of job '{JOB}': GET /api/runs/{JOB}/ranks lists the job's ranks"
    )


@pytest.mark.parametrize(
    "metric, key",
    [("time/before_backward_s", "time/before_backward_s"), ("time/step_s", "time/step_s"), ("memory", None)],
)
def test_spread_gives_each_steps_quantiles_across_ranks_and_the_outlier_ranks(
    http: httpx.Client, metric: str, key: str | None
) -> None:
    """Per step, min/p5/p50/p95/max of what the 12 ranks sent (oracle: statistics.quantiles,
    inclusive: linear interpolation between the sorted values), and the straggler as the one
    outlier of its times; memory (each rank's CUDA allocated bytes, 1e8 x (1 + rank)) grows
    evenly with the rank: no rank stands apart."""
    spread = http.get(f"/api/runs/{JOB12}/ranks/spread", params={"metric": metric}).json()
    assert spread["metric"] == metric and spread["ranks"] == 12
    assert spread["steps"] == list(range(1, STEPS12 + 1))
    for i, step in enumerate(spread["steps"]):
        sent = sorted(r.sent[step][key or f"mem/cuda:{r.rank}/allocated"] for r in JOB12_RANKS)
        cuts = statistics.quantiles(sent, n=20, method="inclusive")
        got = [spread[q][i] for q in ("min", "p5", "p50", "p95", "max")]
        assert got == pytest.approx([sent[0], cuts[0], cuts[9], cuts[18], sent[-1]], rel=1e-12)
    if key is None:
        assert spread["outliers"] == []
    else:
        (outlier,) = spread["outliers"]
        assert outlier["rank"] == STRAGGLER12 and outlier["high"]
        mine = statistics.median(r.sent[s][key] for r in JOB12_RANKS if r.rank == STRAGGLER12 for s in r.sent)
        assert outlier["median"] == pytest.approx(mine, rel=1e-12)


def test_spread_of_a_window_a_single_process_run_a_rank_and_bad_metrics(http: httpx.Client) -> None:
    last = http.get(f"/api/runs/{JOB12}/ranks/spread", params={"metric": "time/step_s", "steps": 5}).json()
    assert last["steps"] == list(range(STEPS12 - 4, STEPS12 + 1))
    single = http.get("/api/runs/single/ranks/spread", params={"metric": "time/step_s"}).json()
    assert (single["ranks"], single["steps"], single["p50"], single["outliers"]) == (0, [], [], [])
    child = http.get(f"/api/runs/{JOB12}.r1/ranks/spread", params={"metric": "time/step_s"})
    assert child.status_code == 400 and JOB12 in child.json()["detail"]
    for params in ({"metric": "loss"}, {}, {"metric": "memory", "steps": 0}, {"metric": "memory", "steps": 10**6}):
        assert http.get(f"/api/runs/{JOB12}/ranks/spread", params=params).status_code == 422, params
    assert http.get("/api/runs/nosuchrun/ranks/spread", params={"metric": "memory"}).status_code == 404


def test_run_list_shows_the_job_with_its_world_size_and_never_its_ranks(http: httpx.Client) -> None:
    runs = {r["id"]: r for r in http.get("/api/runs").json()["data"]}
    assert {JOB, JOB3, "single"} <= set(runs)
    assert not any(".r" in run_id for run_id in runs)
    assert runs[JOB]["world_size"] == 2
    assert runs["single"]["world_size"] is None


def _csv(http: httpx.Client, run_id: str, table: str) -> list[dict[str, str]]:
    answer = http.get(f"/api/runs/{run_id}/export", params={"format": "csv", "table": table})
    assert answer.status_code == 200, answer.text
    return list(csv.DictReader(io.StringIO(answer.text)))


def _rest_scalar(http: httpx.Client, run_id: str, key: str) -> dict[int, float]:
    answer = http.get(f"/api/runs/{run_id}/series", params={"key": key, "max_points": 100_000}).json()
    assert not answer["downsampled"]
    return dict(zip(answer["step"], answer["value"], strict=True))


def test_steps_table_has_the_global_rows_then_each_ranks_with_their_rank(
    http: httpx.Client, job: tuple[ServerProcess, list[RankRun]]
) -> None:
    ranks = job[1]
    rows = _csv(http, JOB, "steps")
    assert list(rows[0])[-1] == "rank"
    assert [r["rank"] for r in rows] == [""] * STEPS + ["0"] * STEPS + ["1"] * LOST_AFTER
    assert [int(r["step"]) for r in rows] == [*range(1, STEPS + 1), *range(1, STEPS + 1), *range(1, LOST_AFTER + 1)]
    # The global rows are the job's run's own: its max over ranks, as its /series serves it.
    global_time = _rest_scalar(http, JOB, "time/before_backward_s")
    assert {int(r["step"]): float(r["time/before_backward_s"]) for r in rows[:STEPS]} == global_time
    for rank in ranks:
        mine = [r for r in rows if r["rank"] == str(rank.rank)]
        for key in ("time/step_s", "time/before_backward_s", f"mem/cuda:{rank.rank}/allocated", "loss"):
            stored = _rest_scalar(http, f"{JOB}.r{rank.rank}", key)
            assert {int(r["step"]): float(r[key]) for r in mine} == stored, key
            # ...which is what the rank sent.
            assert all(float(r[key]) == float(rank.sent[int(r["step"])][key]) for r in mine), key
        other = f"mem/cuda:{1 - rank.rank}/allocated"
        assert all(r[other] == "" for r in mine)  # each rank reports its own device only


def test_params_table_has_each_ranks_local_norms_with_their_rank(http: httpx.Client) -> None:
    rows = _csv(http, JOB, "params")
    assert list(rows[0])[:3] == ["step", "param", "grad_norm"]
    assert list(rows[0])[-1] == "rank"
    params = [p["name"] for p in http.get(f"/api/runs/{JOB}/params").json()["data"]]
    assert len(rows) == len(params) * (STEPS + STEPS + LOST_AFTER)
    assert {r["rank"] for r in rows[: len(params) * STEPS]} == {""}
    for rank, steps in ((0, STEPS), (1, LOST_AFTER)):
        mine = [r for r in rows if r["rank"] == str(rank)]
        assert len(mine) == len(params) * steps
        for name in params:
            stored = http.get(
                f"/api/runs/{JOB}.r{rank}/params/series",
                params={"metric": "grad_norm", "param": name, "max_points": 100_000},
            ).json()
            values = dict(zip(stored["step"], stored["series"][0]["value"], strict=True))
            exported = {int(r["step"]): r["grad_norm"] for r in mine if r["param"] == name}
            assert exported.keys() == values.keys()
            for step, cell in exported.items():
                want = values[step]
                if want is None:
                    assert cell == ""
                elif isinstance(want, str):
                    assert math.isnan(float(cell)) if want == "NaN" else float(cell) == float(want)
                else:
                    assert np.float32(cell) == np.float32(want), (rank, name, step)
    # The global rows are the job's own assembled values, not one rank's.
    glob = {(int(r["step"]), r["param"]): r["grad_norm"] for r in rows if r["rank"] == ""}
    rank0 = {(int(r["step"]), r["param"]): r["grad_norm"] for r in rows if r["rank"] == "0"}
    assert any(glob[k] != rank0[k] for k in glob if int(k[0]) <= LOST_AFTER)


def test_json_and_parquet_carry_the_rank_too(http: httpx.Client) -> None:
    lines = [json.loads(x) for x in http.get(f"/api/runs/{JOB}/export", params={"format": "json"}).text.splitlines()]
    assert lines[0]["type"] == "run" and lines[0]["run"]["world_size"] == 2
    assert [x["rank"] for x in lines[1:]] == [None] * STEPS + [0] * STEPS + [1] * LOST_AFTER
    steps_lines = [
        json.loads(x)
        for x in http.get(f"/api/runs/{JOB}/export", params={"format": "json", "table": "steps"}).text.splitlines()
    ]
    assert [x["rank"] for x in steps_lines] == [None] * STEPS + [0] * STEPS + [1] * LOST_AFTER
    csv_rows = _csv(http, JOB, "steps")
    for name, table in (("params", _csv(http, JOB, "params")), ("steps", csv_rows)):
        data = http.get(f"/api/runs/{JOB}/export", params={"format": "parquet", "table": name}).content
        frame = pq.read_table(io.BytesIO(data))
        assert str(frame.schema.field("rank").type) == "int32"
        assert frame.column("rank").to_pylist() == [None if r["rank"] == "" else int(r["rank"]) for r in table], name


@pytest.mark.parametrize("table", ["params", "steps"])
def test_ranks_false_exports_the_jobs_global_rows_alone(http: httpx.Client, table: str) -> None:
    def get(run_id: str, fmt: str, **extra: str) -> httpx.Response:
        answer = http.get(f"/api/runs/{run_id}/export", params={"format": fmt, "table": table, **extra})
        assert answer.status_code == 200, answer.text
        return answer

    whole = list(csv.reader(io.StringIO(get(JOB, "csv").text)))
    alone = list(csv.reader(io.StringIO(get(JOB, "csv", ranks="false").text)))
    assert alone == [whole[0][:-1], *(row[:-1] for row in whole[1:] if row[-1] == "")]
    assert len(alone) - 1 == STEPS * (
        len(http.get(f"/api/runs/{JOB}/params").json()["data"]) if table == "params" else 1
    )
    lines = [json.loads(x) for x in get(JOB, "json").text.splitlines()]
    kept = [json.loads(x) for x in get(JOB, "json", ranks="false").text.splitlines()]
    start = 1 if table == "params" else 0  # the params table's JSON opens with the run line
    assert kept[:start] == lines[:start]
    assert kept[start:] == [{k: v for k, v in x.items() if k != "rank"} for x in lines[start:] if x["rank"] is None]
    full = pq.read_table(io.BytesIO(get(JOB, "parquet").content))
    glob = pq.read_table(io.BytesIO(get(JOB, "parquet", ranks="false").content))
    assert glob.schema.names == full.schema.names[:-1] and glob.schema.metadata == full.schema.metadata
    assert glob.to_pylist() == [
        {k: v for k, v in row.items() if k != "rank"} for row in full.to_pylist() if row["rank"] is None
    ]
    # a single-process run has no ranks to leave out
    assert get("single", "csv", ranks="false").content == get("single", "csv").content


def test_ranks_must_be_a_boolean(http: httpx.Client) -> None:
    answer = http.get(f"/api/runs/{JOB}/export", params={"format": "csv", "ranks": "some"})
    assert answer.status_code == 422 and "ranks" in answer.text


def test_single_process_exports_have_no_rank_column(http: httpx.Client) -> None:
    for table in ("params", "steps"):
        assert "rank" not in _csv(http, "single", table)[0]
        data = http.get("/api/runs/single/export", params={"format": "parquet", "table": table}).content
        assert "rank" not in pq.read_table(io.BytesIO(data)).schema.names
    line = http.get("/api/runs/single/export", params={"format": "json"}).text.splitlines()[1]
    assert "rank" not in json.loads(line)


def test_cli_export_writes_what_the_server_serves(
    http: httpx.Client, job: tuple[ServerProcess, list[RankRun]], tmp_path: Path
) -> None:
    server = job[0]
    for table in ("steps", "params"):
        out = tmp_path / f"{table}.csv"
        subprocess.run(
            [*server_command(), "export", JOB, "--db", server.db_url, "--table", table, "-o", str(out)],
            check=True,
            capture_output=True,
            env=server.env,
            timeout=120,
        )
        served = http.get(f"/api/runs/{JOB}/export", params={"format": "csv", "table": table}).content
        assert out.read_bytes() == served, table
    alone = tmp_path / "global.csv"
    subprocess.run(
        [*server_command(), "export", JOB, "--db", server.db_url, "--no-ranks", "-o", str(alone)],
        check=True,
        capture_output=True,
        env=server.env,
        timeout=120,
    )
    served = http.get(f"/api/runs/{JOB}/export", params={"format": "csv", "ranks": "false"}).content
    assert alone.read_bytes() == served and b"rank" not in served.splitlines()[0]


def test_import_of_a_jobs_export_restores_its_global_steps_and_leaves_the_ranks_out(
    http: httpx.Client, job: tuple[ServerProcess, list[RankRun]], tmp_path: Path
) -> None:
    exported = tmp_path / "job.jsonl"
    exported.write_bytes(http.get(f"/api/runs/{JOB}/export", params={"format": "json"}).content)
    # Read now, not after the subprocesses: their seconds idle the client's pooled connection
    # about as long as the server's keep-alive (uvicorn's 5 s), and a request sent as the server
    # closes it fails with "Server disconnected" (seen once on PostgreSQL under load).
    served = [r for r in _csv(http, JOB, "steps") if r["rank"] == ""]
    db = f"sqlite:///{tmp_path / 'imported.db'}"
    done = subprocess.run(
        [*server_command(), "import", str(exported), "--db", db],
        check=True,
        capture_output=True,
        text=True,
        env=job[0].env,
        timeout=120,
    )
    assert done.stdout.strip() == (
        f"imported run {JOB}: {STEPS} steps stored, 0 already there; "
        f"{STEPS + LOST_AFTER} steps of its ranks left out (the job's global steps are imported)"
    )
    again = subprocess.run(
        [*server_command(), "export", JOB, "--db", db, "--table", "steps"],
        check=True,
        capture_output=True,
        text=True,
        env=job[0].env,
        timeout=120,
    )
    rows = list(csv.DictReader(io.StringIO(again.stdout)))
    assert [r["grad_norm_total"] for r in rows] == [r["grad_norm_total"] for r in served]
    assert [int(r["step"]) for r in rows] == list(range(1, STEPS + 1))

"""`gradwatch.load()` and `gradwatch.runs()` against a real server: the DataFrame equals the CSV
export (read here with the csv module: columns, and every value, ABSENT, NaN and inf included),
the runs list equals `GET /api/runs`; clear errors for an unknown run, a server that is away,
missing pandas, bad arguments."""

from __future__ import annotations

import csv
import http.server
import io
import math
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pandas as pd
import pytest
import torch

import gradwatch
from support.server import ServerProcess, start_server
from support.synthetic_dist import rank_runs, send_job

pytestmark = pytest.mark.unit  # a test that starts a server says so (@pytest.mark.server)

NOWHERE = "http://127.0.0.1:9"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, list[gradwatch.Watcher]]]:
    """One server with three finished runs: two in project "frames", one elsewhere."""
    folder = tmp_path_factory.mktemp("frames")
    server = start_server(folder)
    watchers = []
    spool = pytest.MonkeyPatch()
    spool.setenv("GRADWATCH_SPOOL", str(folder / "spool"))  # replays nothing of other tests into this server
    try:
        for name, project, every in (("plain", "frames", 1), ("sampled", "frames", 2), ("other", "elsewhere", 1)):
            torch.manual_seed(0)
            model = torch.nn.ModuleDict({"fc": torch.nn.Linear(4, 3), "unused": torch.nn.Linear(3, 3)})
            opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            w = gradwatch.watch(opt, model=model, server=server.url, run=name, project=project, every=every, warn=False)
            for step in range(6):
                opt.zero_grad()
                model["fc"](torch.randn(2, 4)).pow(2).sum().backward()
                bias = model["fc"].bias
                if step in (2, 4):  # measured non-finite norms (steps 3 and 5), which must not read as ABSENT
                    bias.grad[0] = float("nan") if step == 2 else float("inf")
                opt.step()
                if step in (2, 4):  # and the training goes on finite
                    bias.data.zero_()
                    opt.state[bias]["momentum_buffer"].zero_()
                w.log(loss=float(step))
            w.close(timeout=30)
            assert w.pending == 0
            watchers.append(w)
        yield server, watchers
    finally:
        spool.undo()
        server.stop()


def csv_export(server: ServerProcess, run_id: str, **params: str) -> tuple[list[str], list[list[str]]]:
    response = httpx.get(f"{server.url}/api/runs/{run_id}/export", params={"format": "csv", **params}, timeout=30)
    assert response.status_code == 200, response.text
    header, *rows = list(csv.reader(io.StringIO(response.text)))
    return header, rows


def same(cell: str, value: Any) -> bool:
    """A CSV cell (ABSENT is empty; nan/inf as words) against a DataFrame value."""
    if cell == "":
        return value is pd.NA or value is None
    if value is pd.NA or value is None:
        return False
    want = np.float32(float(cell))
    got = np.float32(value)
    return bool(np.isnan(got)) if np.isnan(want) else bool(got == want)


@pytest.mark.server
@pytest.mark.parametrize("which", [0, 1], ids=["every-step", "every-2"])
def test_load_equals_the_csv_export(served: tuple[ServerProcess, list[gradwatch.Watcher]], which: int) -> None:
    server, watchers = served
    w = watchers[which]
    df = gradwatch.load(w.run_id, server=server.url)
    header, rows = csv_export(server, w.run_id)
    assert list(df.columns) == header
    assert len(df) == len(rows) == 6 * 4  # steps x parameters
    assert df["step"].tolist() == [int(r[0]) for r in rows]
    assert df["param"].tolist() == [r[1] for r in rows]
    assert df["grad_status"].fillna("").tolist() == [r[header.index("grad_status")] for r in rows]
    for c, column in enumerate(header):
        if column in ("step", "param", "grad_status"):
            continue
        values = df[column].tolist()
        mismatched = [
            (rows[i][0], rows[i][1], rows[i][c], values[i]) for i in range(len(rows)) if not same(rows[i][c], values[i])
        ]
        assert not mismatched, (column, mismatched[:5])
    grad = df.set_index(["step", "param"])["grad_norm"]
    assert math.isnan(grad[(3, "fc.bias")]) and grad[(5, "fc.bias")] == math.inf  # measured, not ABSENT
    if which == 0:
        assert grad[(1, "unused.weight")] is pd.NA  # no gradient: ABSENT, which is not NaN
    assert df.attrs["run"]["id"] == w.run_id and df.attrs["run"]["name"] == w.name


JOB, JOB_STEPS = "framesjob", 7


@pytest.fixture(scope="module")
def job_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server holding one finished 2-rank job (synthetic ranks over real websockets)."""
    server = start_server(tmp_path_factory.mktemp("framesjob"))
    try:
        send_job(server.ws_url, rank_runs(JOB, "two-ranks", 2), JOB_STEPS)
        deadline = time.monotonic() + 30
        while httpx.get(f"{server.url}/api/runs/{JOB}", timeout=10).json().get("status") != "finished":
            assert time.monotonic() < deadline, "the job was not assembled"
            time.sleep(0.1)
        yield server
    finally:
        server.stop()


def assert_frame_is(df: pd.DataFrame, header: list[str], rows: list[list[str]]) -> None:
    """The DataFrame holds the CSV's rows, cell for cell (the `rank` column as integers or <NA>)."""
    assert list(df.columns) == header and len(df) == len(rows)
    for c, column in enumerate(header):
        values = df[column].tolist()
        if column in ("param", "grad_status"):
            assert [str(v) for v in values] == [r[c] for r in rows], column
        elif column in ("step", "rank"):
            assert [None if v is pd.NA else int(v) for v in values] == [int(r[c]) if r[c] else None for r in rows]
        else:
            assert all(same(r[c], v) for r, v in zip(rows, values)), column


@pytest.mark.server
def test_load_of_a_job_gives_its_global_rows_and_ranks_true_adds_each_ranks(job_server: ServerProcess) -> None:
    header, rows = csv_export(job_server, JOB, ranks="false")
    params = len(httpx.get(f"{job_server.url}/api/runs/{JOB}/params", timeout=10).json()["data"])
    assert len(rows) == JOB_STEPS * params and "rank" not in header
    df = gradwatch.load(JOB, server=job_server.url)
    assert_frame_is(df, header, rows)
    assert df.attrs["run"]["world_size"] == 2
    header, rows = csv_export(job_server, JOB)
    assert header[-1] == "rank" and len(rows) == 3 * JOB_STEPS * params
    every = gradwatch.load(JOB, server=job_server.url, ranks=True)
    assert_frame_is(every, header, rows)
    assert every["rank"].isna().sum() == len(df)  # the global rows, then rank 0's and rank 1's
    with pytest.raises(TypeError, match="ranks must be True or False"):
        gradwatch.load(JOB, server=job_server.url, ranks="yes")


@pytest.mark.server
def test_load_leaves_the_ranks_out_of_a_server_that_predates_the_ranks_query(job_server: ServerProcess) -> None:
    """A server older than `export?ranks=` sends every rank's rows whatever load() asks: load()
    keeps the global ones. The older server is played by a real http.server answering with what
    the real server sends for `ranks=true`."""
    answers = {
        f"/api/runs/{JOB}": httpx.get(f"{job_server.url}/api/runs/{JOB}", timeout=10).content,
        f"/api/runs/{JOB}/export": httpx.get(
            f"{job_server.url}/api/runs/{JOB}/export", params={"format": "parquet"}, timeout=30
        ).content,
    }

    class Older(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            body = answers[self.path.split("?")[0]]
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    older = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Older)
    threading.Thread(target=older.serve_forever, daemon=True).start()
    try:
        df = gradwatch.load(JOB, server=f"http://127.0.0.1:{older.server_address[1]}")
    finally:
        older.shutdown()
        older.server_close()
    assert_frame_is(df, *csv_export(job_server, JOB, ranks="false"))


@pytest.mark.server
def test_load_takes_a_watcher_and_its_server(served: tuple[ServerProcess, list[gradwatch.Watcher]]) -> None:
    _, watchers = served
    df = gradwatch.load(watchers[0])
    assert df.attrs["run"]["id"] == watchers[0].run_id and len(df) == 24


@pytest.mark.server
def test_runs_lists_what_the_api_lists(served: tuple[ServerProcess, list[gradwatch.Watcher]]) -> None:
    server, watchers = served
    api = httpx.get(f"{server.url}/api/runs", params={"project": "frames"}, timeout=30).json()
    df = gradwatch.runs(server=server.url, project="frames")
    assert df["id"].tolist() == [r["id"] for r in api["data"]] and len(df) == 2
    assert set(df["id"]) == {watchers[0].run_id, watchers[1].run_id}
    assert df["steps"].tolist() == [6, 6] and set(df["status"]) == {"finished"}
    assert df["created_at"].tolist() == [pd.Timestamp(r["created_at"], unit="s", tz="UTC") for r in api["data"]]
    everything = gradwatch.runs(server=server.url)
    assert set(everything["id"]) == {w.run_id for w in watchers}
    empty = gradwatch.runs(server=server.url, project="no-such-project")
    assert len(empty) == 0 and {"id", "name", "project", "status", "steps"} <= set(empty.columns)


@pytest.mark.server
def test_an_unknown_run_is_a_lookup_error_naming_it(served: tuple[ServerProcess, list[gradwatch.Watcher]]) -> None:
    server, _ = served
    with pytest.raises(LookupError, match=r"has no run 'feedc0ffee00'.*gradwatch.runs\(\)"):
        gradwatch.load("feedc0ffee00", server=server.url)


def test_a_server_that_is_away_is_a_connection_error_naming_it() -> None:
    with pytest.raises(ConnectionError, match=r"cannot reach the gradwatch server at http://127.0.0.1:9 "):
        gradwatch.load("abc", server=NOWHERE)
    with pytest.raises(ConnectionError, match=r"http://127.0.0.1:9"):
        gradwatch.runs(server=NOWHERE)


@pytest.mark.parametrize(
    "call, error, says",
    [
        (lambda: gradwatch.load(42, server=NOWHERE), TypeError, "run id \\(str\\) or a gradwatch Watcher, not int"),
        (lambda: gradwatch.load("", server=NOWHERE), ValueError, "empty string"),
        (lambda: gradwatch.load("abc", server="ftp://x"), ValueError, "http\\(s\\):// URL"),
        (lambda: gradwatch.runs(server=NOWHERE, project=3), TypeError, "project must be a string"),
    ],
    ids=["run-int", "run-empty", "server-scheme", "project-int"],
)
def test_bad_arguments_are_clear_errors(call: Any, error: type, says: str) -> None:
    with pytest.raises(error, match=says):
        call()


def test_without_pandas_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pandas", None)  # what `import pandas` meets where it is not installed
    with pytest.raises(ImportError, match=r"pip install gradwatch\[pandas\]"):
        gradwatch.load("abc", server=NOWHERE)


def test_import_gradwatch_stays_light(tmp_path: Path) -> None:
    """Neither pandas nor a training framework is imported by `import gradwatch`, nor by watch()."""
    code = (
        "import sys, gradwatch, torch\n"
        "w = gradwatch.watch(torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1), "
        "server='http://127.0.0.1:9', warn=False)\n"
        "w.close(timeout=0.1)\n"
        "heavy = [m for m in ('pandas', 'pyarrow', 'transformers', 'lightning', 'pytorch_lightning', "
        "'accelerate', 'IPython') if m in sys.modules]\n"
        "print(heavy)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**__import__("os").environ, "GRADWATCH_SPOOL": str(tmp_path / "spool")},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"

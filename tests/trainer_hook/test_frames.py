"""`gradwatch.load()` and `gradwatch.runs()` against a real server: the DataFrame equals the CSV
export (read here with the csv module: columns, and every value, ABSENT, NaN and inf included),
the runs list equals `GET /api/runs`; clear errors for an unknown run, a server that is away,
missing pandas, bad arguments."""

from __future__ import annotations

import csv
import io
import math
import subprocess
import sys
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


def csv_export(server: ServerProcess, run_id: str) -> tuple[list[str], list[list[str]]]:
    response = httpx.get(f"{server.url}/api/runs/{run_id}/export", params={"format": "csv"}, timeout=30)
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


def test_load_takes_a_watcher_and_its_server(served: tuple[ServerProcess, list[gradwatch.Watcher]]) -> None:
    _, watchers = served
    df = gradwatch.load(watchers[0])
    assert df.attrs["run"]["id"] == watchers[0].run_id and len(df) == 24


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

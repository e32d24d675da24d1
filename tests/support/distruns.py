"""Read a distributed job's runs back from a real server: the parent's assembled steps, a rank's
child run, the ranks and partial steps, and the comparisons the tests make against oracles."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from support.dist import run_ranks
from support.server import ServerProcess, start_server

#: Relative tolerance of a stored float32 norm against an oracle computed in float32 by torch.
REL = 1e-5
#: Parameter metrics every Adam run carries.
ADAM_METRICS = ("grad_norm", "param_norm", "exp_avg_norm", "exp_avg_sq_norm")

Steps = dict[int, dict[str, Any]]


@contextlib.contextmanager
def job_on_server(
    folder: Path, fn: Callable[..., Any], args: Sequence[Any] = ()
) -> Iterator[tuple[ServerProcess, list[Any]]]:
    """A `gradwatch serve` in `folder`, and what every rank of a 2-rank job returned from
    `fn(rank, world_size, server_url, *args)`; the ranks spool into `folder`/spool."""
    server = start_server(folder)
    spool, before = folder / "spool", os.environ.get("GRADWATCH_SPOOL")
    try:
        os.environ["GRADWATCH_SPOOL"] = str(spool)  # the spawned ranks inherit it
        try:
            ranks = run_ranks(fn, 2, args=(server.url, *args))
        finally:
            os.environ.pop("GRADWATCH_SPOOL") if before is None else os.environ.update(GRADWATCH_SPOOL=before)
        yield server, ranks
    finally:
        server.stop()


def job_of(run_id: str) -> str:
    """The job's (parent run's) id, whether `run_id` is it or one of its rank streams (`JOB.rR`)."""
    return re.sub(r"\.r\d+$", "", run_id)


def get(url: str, path: str, **params: Any) -> Any:
    with httpx.Client(base_url=url, timeout=30) as http:
        response = http.get(path, params=params)
    assert response.status_code == 200, f"GET {path}: {response.status_code} {response.text[:500]}"
    return response.json()


def wait_for(what: str, check: Callable[[], Any], timeout: float = 60.0) -> Any:
    """Poll `check()` until it returns something truthy; fail naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.2)


def settled(url: str, run_id: str, statuses: Iterable[str] = ("finished",), timeout: float = 60.0) -> dict[str, Any]:
    """The run once its status is one of `statuses` (a parent settles when every rank has)."""
    wanted = set(statuses)

    def check() -> dict[str, Any] | None:
        run: dict[str, Any] = get(url, f"/api/runs/{run_id}")
        return run if run["status"] in wanted else None

    return wait_for(f"run {run_id} to be {'/'.join(sorted(wanted))}", check, timeout)  # type: ignore[no-any-return]


def exported(url: str, run_id: str) -> Steps:
    """The run's steps from its JSON export: `{step: {"scalars": {...}, "grad_status": {param: word},
    metric: {param: value}}}`. A parent's export also carries its ranks' rows (a `rank` field):
    only the run's own rows (no rank) are kept."""
    with httpx.Client(base_url=url, timeout=60) as http:
        response = http.get(f"/api/runs/{run_id}/export", params={"format": "json"})
    assert response.status_code == 200, response.text[:500]
    lines = [json.loads(line) for line in response.text.splitlines() if line.strip()]
    names = [p["name"] for p in lines[0]["params"]]
    steps: Steps = {}
    for line in lines[1:]:
        if line.get("type") != "step" or line.get("rank") is not None:
            continue
        row: dict[str, Any] = {"scalars": line["scalars"]}
        row["grad_status"] = dict(zip(names, line.get("grad_status") or []))
        for metric, values in line["params"].items():
            row[metric] = {n: _number(v) for n, v in zip(names, values)}
        steps[line["step"]] = row
    return steps


def _number(value: Any) -> float | None:
    return None if value is None else float(value)


def assert_close(stored: float | None, oracle: float, where: str, rel: float = REL) -> None:
    assert stored is not None, f"{where}: nothing stored, the oracle says {oracle!r}"
    assert math.isclose(stored, oracle, rel_tol=rel, abs_tol=1e-30), f"{where}: stored {stored!r}, oracle {oracle!r}"


def assert_norms(steps: Steps, oracle: Mapping[int, Mapping[str, Mapping[str, float]]], label: str) -> int:
    """Every oracle value (step -> metric -> param -> norm) equals the stored one; returns how many."""
    checked = 0
    assert sorted(steps) == sorted(oracle), f"{label}: stored steps {sorted(steps)}, oracle {sorted(oracle)}"
    for step, metrics in oracle.items():
        for metric, values in metrics.items():
            stored = steps[step].get(metric)
            assert stored is not None, f"{label} step {step}: no {metric} stored (has {sorted(steps[step])})"
            assert set(stored) == set(values), (
                f"{label} step {step} {metric}: params {sorted(stored)} vs {sorted(values)}"
            )
            for param, value in values.items():
                assert_close(stored[param], value, f"{label} step {step} {metric}[{param}]")
                checked += 1
    return checked

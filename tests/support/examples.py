"""Run an example script as a user would (its own process) against a real `gradwatch serve`."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from support.server import REPO, ServerProcess, server_env


def run_example(name: str, server: ServerProcess, folder: Path, *args: str) -> tuple[str, dict[str, Any]]:
    """Run examples/`name` with $GRADWATCH_SERVER pointing at `server` (no --server: the default
    path a user takes); return its run id and the run as the server stored it."""
    env = server_env({"GRADWATCH_SERVER": server.url, "GRADWATCH_SPOOL": str(folder / "spool")})
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / name), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=folder,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    run_id = re.search(r"^gradwatch run id: (\w+)$", done.stdout, re.M)
    assert run_id, done.stdout
    with httpx.Client(base_url=server.url, timeout=30) as http:
        run = http.get(f"/api/runs/{run_id[1]}").json()
    assert run["status"] == "finished", run
    return run_id[1], run


def findings(server: ServerProcess, run_id: str) -> list[dict[str, Any]]:
    with httpx.Client(base_url=server.url, timeout=30) as http:
        response = http.get(f"/api/runs/{run_id}/diagnostics")
    assert response.status_code == 200, response.text
    found: list[dict[str, Any]] = response.json()
    return found


def series(server: ServerProcess, run_id: str, key: str) -> list[Any]:
    with httpx.Client(base_url=server.url, timeout=30) as http:
        response = http.get(f"/api/runs/{run_id}/series", params={"key": key, "max_points": 100000})
    assert response.status_code == 200, response.text
    values: list[Any] = response.json()["value"]
    return values

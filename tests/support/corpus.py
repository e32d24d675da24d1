"""Running the diagnostics corpus (tests/diagnostics/corpus/): each script as its own process
with the hook against a real `gradwatch serve`, then its runs' findings and logged loss over REST.

A script states what it should get as module-level constants, read here without running it
(`declared`): `EXPECTED_CODES`, `CAUSE_STEP`, `WITHIN`, `EXPECTED_SEVERITY`, `UNSTABLE`,
`STABLE_CONTROL`. Files named `_*.py` are the scripts' shared code, not scripts.
"""

from __future__ import annotations

import ast
import concurrent.futures
import re
import statistics
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from support.server import ServerProcess, server_env

CORPUS = Path(__file__).resolve().parents[1] / "diagnostics" / "corpus"
SCRIPTS = sorted(p for p in CORPUS.glob("*.py") if not p.name.startswith("_"))
ONSET_RATIO, ONSET_WINDOW = 3.0, 50  # a loss spike: above 3x the median of the previous 50 losses


def declared(path: Path, name: str) -> Any:
    """A module-level constant of a script (`EXPECTED_CODES`, `CAUSE_STEP`), read without running it."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets) and node.value is not None:
                if isinstance(node.value, ast.Call) and ast.unparse(node.value) == "set()":
                    return set()
                return ast.literal_eval(node.value)
    raise LookupError(name)


def declares(path: Path, name: str) -> bool:
    """Whether the script sets `name` to a true value."""
    try:
        return bool(declared(path, name))
    except LookupError:
        return False


def is_instability_case(path: Path) -> bool:
    """An unstable script or a stable control (tests/diagnostics/test_instabilities.py)."""
    return declares(path, "UNSTABLE") or declares(path, "STABLE_CONTROL")


@dataclass
class Outcome:
    """One corpus script, run: its exit status, output, and the findings of each of its runs."""

    script: Path
    returncode: int
    stdout: str
    stderr: str
    every: str = "1"
    findings: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # run id -> findings
    loss: dict[str, list[float]] = field(default_factory=dict)  # run id -> logged loss, if any
    loss_steps: dict[str, list[int]] = field(default_factory=dict)  # run id -> the steps of `loss`

    @property
    def expected(self) -> set[str]:
        codes: set[str] = declared(self.script, "EXPECTED_CODES")
        return codes

    def codes(self, run_id: str) -> set[str]:
        return {f["code"] for f in self.findings[run_id]}


def run_script(script: Path, server: ServerProcess, folder: Path, every: str = "1") -> Outcome:
    """Run one script against `server`; `every` reaches it as CORPUS_EVERY (corpus/_tiny.py)."""
    env = server_env(
        {
            "GRADWATCH_SERVER": server.url,
            "GRADWATCH_SPOOL": str(folder / "spool"),
            "PYTHONWARNINGS": "default",
            "CORPUS_EVERY": every,
        }
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=240, env=env, cwd=folder
    )
    return Outcome(script, done.returncode, done.stdout, done.stderr, every=every)


def run_all(runs: Sequence[tuple[Path, str]], server: ServerProcess, folder: Path, parallel: int) -> list[Outcome]:
    """Run (script, every) pairs a few at a time, then read their runs' findings and loss."""
    with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
        outcomes = list(pool.map(lambda r: run_script(r[0], server, folder, r[1]), runs))
    with httpx.Client(base_url=server.url, timeout=30) as http:
        for outcome in outcomes:
            for run_id in re.findall(r"^gradwatch run: (\S+)$", outcome.stdout, re.M):
                response = http.get(f"/api/runs/{run_id}/diagnostics")
                assert response.status_code == 200, response.text
                outcome.findings[run_id] = response.json()
                loss = http.get(f"/api/runs/{run_id}/series", params={"key": "loss"})
                if loss.status_code == 200:
                    outcome.loss[run_id] = loss.json()["value"]
                    outcome.loss_steps[run_id] = loss.json()["step"]
    return outcomes


def loss_onset(loss: Sequence[float]) -> int | None:
    """The index of the first loss above ONSET_RATIO x the median of the ONSET_WINDOW before it."""
    for i in range(ONSET_WINDOW, len(loss)):
        if loss[i] > ONSET_RATIO * statistics.median(loss[i - ONSET_WINDOW : i]):
            return i
    return None


def first_warning(found: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The earliest warning or error of a run (by `first_step`; one known from the start first)."""
    graver = [f for f in found if f["severity"] in ("warning", "error")]
    return min(graver, key=lambda f: -1 if f["first_step"] is None else f["first_step"], default=None)

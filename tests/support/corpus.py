"""Running the diagnostics corpus (tests/diagnostics/corpus/): each script as its own process
with the hook against a real `gradwatch serve`, then its runs' findings and logged loss over REST.

A script states what it should get as module-level constants, read here without running it
(`declared`): `EXPECTED_CODES`, `CAUSE_STEP`, `WITHIN`, `EXPECTED_SEVERITY`, `UNSTABLE`,
`STABLE_CONTROL`. Files named `_*.py` are the scripts' shared code, not scripts.

`run_all` forks each script's process from one interpreter that has imported torch and the hook
already (`Prefork`, tests/support/prefork.py): a script's process is its own as before, without
the 2 s of importing torch that were most of a small script's time.
"""

from __future__ import annotations

import ast
import concurrent.futures
import itertools
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

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


#: what every script's process is started with; the settings of one run (`run_env`) are read by
#: the script when it runs, so a forked child takes them as a fresh interpreter would
BASE_ENV = {"PYTHONWARNINGS": "default"}
SCRIPT_TIMEOUT_S = 240


def run_env(server: ServerProcess, folder: Path, every: str) -> dict[str, str]:
    """A script's environment: the server, its spool, and `every` as CORPUS_EVERY (corpus/_sampling.py)."""
    return server_env(
        {**BASE_ENV, "GRADWATCH_SERVER": server.url, "GRADWATCH_SPOOL": str(folder / "spool"), "CORPUS_EVERY": every}
    )


class Prefork:
    """The client of tests/support/prefork.py: `run` forks a script's process from the server's
    interpreter (torch and the hook imported, and the modules `imports` names) and waits for it
    like `subprocess.run`. Thread-safe: several scripts run at once."""

    def __init__(self, folder: Path, imports: Sequence[str] = ()) -> None:
        self.folder = folder
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("prefork.py")), *imports],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=server_env(BASE_ENV),
            cwd=folder,
        )
        self._ids = itertools.count()
        self._replies: dict[str, dict[str, Any]] = {}
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True)
        self._reader.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            message = json.loads(line)
            with self._changed:
                self._replies.setdefault(message["id"], {}).update(message)
                self._changed.notify_all()
        with self._changed:  # the server is gone: nothing more comes
            self._replies["eof"] = {}
            self._changed.notify_all()

    def _wait(self, request_id: str, key: str, timeout: float) -> Any:
        with self._changed:
            got = self._changed.wait_for(
                lambda: key in self._replies.get(request_id, {}) or "eof" in self._replies, timeout
            )
            if key not in self._replies.get(request_id, {}):
                if got:
                    raise RuntimeError(f"the corpus fork server ended (status {self.proc.poll()})")
                return None
            return self._replies[request_id][key]

    def run(
        self, script: Path, env: Mapping[str, str], timeout: float, args: Sequence[str] = ()
    ) -> subprocess.CompletedProcess[str]:
        """`python script *args` in `self.folder` with `env`, its output captured; TimeoutExpired
        past `timeout` s."""
        assert self.proc.stdin is not None
        request_id = str(next(self._ids))
        out, err = (self.folder / "output" / f"{request_id}.{name}" for name in ("stdout", "stderr"))
        out.parent.mkdir(exist_ok=True)
        request = {
            "id": request_id,
            "script": str(script),
            "args": list(args),
            "env": dict(env),
            "cwd": str(self.folder),
        }
        with self._changed:
            self.proc.stdin.write(json.dumps({**request, "stdout": str(out), "stderr": str(err)}) + "\n")
            self.proc.stdin.flush()
        pid = self._wait(request_id, "pid", 60)
        if pid is None:
            raise RuntimeError("the corpus fork server did not fork within 60 s")
        returncode = self._wait(request_id, "returncode", timeout)
        if returncode is None:
            os.kill(pid, signal.SIGKILL)
            self._wait(request_id, "returncode", 60)
            raise subprocess.TimeoutExpired(script.name, timeout, out.read_text(), err.read_text())
        argv = [sys.executable, str(script), *args]
        return subprocess.CompletedProcess(argv, returncode, out.read_text(), err.read_text())

    def close(self) -> None:
        """EOF ends the server (and any script still running: it kills them)."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(30)
        self._reader.join(30)


def run_script(script: Path, server: ServerProcess, folder: Path, prefork: Prefork, every: str = "1") -> Outcome:
    """Run one script against `server`, forked by `prefork`; `every` reaches it as CORPUS_EVERY."""
    done = prefork.run(script, run_env(server, folder, every), SCRIPT_TIMEOUT_S)
    return Outcome(script, done.returncode, done.stdout, done.stderr, every=every)


def run_all(runs: Sequence[tuple[Path, str]], server: ServerProcess, folder: Path, parallel: int) -> list[Outcome]:
    """Run (script, every) pairs a few at a time, then read their runs' findings and loss."""
    prefork = Prefork(folder)
    try:
        with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
            outcomes = list(pool.map(lambda r: run_script(r[0], server, folder, prefork, r[1]), runs))
    finally:
        prefork.close()
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

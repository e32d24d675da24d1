"""A real `gradwatch serve` process for the tests and benchmarks, on a free port.

`start_server(tmp_path, db_url=...)` starts one (on a temporary SQLite file unless given a
database URL) and waits until /api/health answers; `ServerProcess.stop()` ends it gracefully.
The server runs from the installed package, or from this checkout's backend/ when none is.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from support import tiers

REPO = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 30.0


def find_free_port() -> int:
    """A TCP port that nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class ServerProcess:
    """A running `gradwatch serve`: its URLs, database (`db_path` is None on PostgreSQL), process and log."""

    url: str
    ws_url: str
    db_url: str
    db_path: Path | None
    proc: subprocess.Popen[bytes]
    log_path: Path
    env: dict[str, str] = field(repr=False, default_factory=dict)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM (a graceful uvicorn shutdown), SIGKILL if it hangs; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        return self.proc.returncode


def server_command() -> list[str]:
    """`python -m gradwatch_server`, from the installed package (pip install ./backend)."""
    return [sys.executable, "-m", "gradwatch_server"]


def server_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This environment without GRADWATCH_* settings, plus `extra`; runs from source if not installed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRADWATCH_")}
    if importlib.util.find_spec("gradwatch_server") is None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "backend"), env.get("PYTHONPATH")]))
    env.update(extra or {})
    return env


def start_server(
    tmp_path: Path,
    *,
    db_url: str | None = None,
    db_path: Path | None = None,
    token: str | None = None,
    crash_grace_s: float = 1.0,
    env: Mapping[str, str] | None = None,
    port: int | None = None,
    args: Sequence[str] = (),
) -> ServerProcess:
    """Start `gradwatch serve` on a free port and wait for health.

    The database is `db_url`, else the SQLite file `db_path`, else `tmp_path/gradwatch.db`;
    `args` are more options of `serve` (e.g. ``("--workers", "2")``). Under pytest, only a test
    of a tier that may start a server does (tests/support/tiers.py).
    """
    tiers.check_may_start_server()
    port = port or find_free_port()
    if db_url is None:
        db_url = f"sqlite:///{db_path or tmp_path / 'gradwatch.db'}"
    db_path = Path(db_url.removeprefix("sqlite:///")) if db_url.startswith("sqlite:///") else None
    log_path = tmp_path / f"server-{port}.log"
    args = [*server_command(), "serve", "--db", db_url, "--port", str(port), *args]
    if token is not None:
        args += ["--token", token]
    full_env = server_env({"GRADWATCH_CRASH_GRACE_S": str(crash_grace_s), **(env or {})})
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=full_env, cwd=tmp_path)
    server = ServerProcess(
        url=f"http://127.0.0.1:{port}",
        ws_url=f"ws://127.0.0.1:{port}",
        db_url=db_url,
        db_path=db_path,
        proc=proc,
        log_path=log_path,
        env=full_env,
    )
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"gradwatch serve exited with {proc.returncode}:\n{server.log()}")
        try:
            with urllib.request.urlopen(f"{server.url}/api/health", timeout=1) as response:
                if response.status == 200:
                    return server
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.05)
    server.stop()
    raise RuntimeError(f"gradwatch serve did not answer /api/health in {READY_TIMEOUT_S} s:\n{server.log()}")

"""`python -m gradwatch sync` / `gradwatch-sync`: the hook's spool replay, run as users run it.

Spools come from real `watch()` runs that had no server; servers are real `gradwatch serve`
processes. The install test builds the hook's wheel and runs it with the server's dependencies
made unimportable: the shared test environment has them all installed, so a clean venv would need
torch and numpy again from the network (closed here); blocking the imports (`sys.modules[name] =
None` in a `sitecustomize` loaded at start) proves the same thing in a few seconds.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import httpx
import pytest
import torch

import gradwatch
from gradwatch.spool import frame, read_payloads, read_records
from support.server import REPO, find_free_port, start_server
from support.wiresteps import spooled_steps

pytestmark = pytest.mark.unit  # a test that starts a server says so (@pytest.mark.server)

HOOK = [sys.executable, "-m", "gradwatch"]
#: What the server distribution needs and the hook must not: importing any of them fails.
SERVER_ONLY = (
    "gradwatch_server",
    "fastapi",
    "starlette",
    "uvicorn",
    "sqlalchemy",
    "alembic",
    "pydantic",
    "pyarrow",
    "plotly",
    "psycopg",
    "httpx",
    "tqdm",
)
BLOCKER = "import sys\nfor name in {names!r}:\n    sys.modules[name] = None  # import fails\n"


def offline_run(server: str, steps: int, run: str) -> gradwatch.Watcher:
    """A real run whose server is away: everything it sends stays in the spool. Seeded: two runs
    measure the same values at the same steps."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w = gradwatch.watch(opt, model=model, server=server, run=run)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(4, 8)).pow(2).mean().backward()
        opt.step()
    w.close(timeout=0.3)
    return w


def hook_sync(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*HOOK, "sync", *args], capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})}
    )


def grad_norms(url: str, run_id: str, steps: int) -> list[list[float]]:
    body = httpx.get(
        f"{url}/api/runs/{run_id}/params/series", params={"metric": "grad_norm", "param": ["weight", "bias"]}
    ).json()
    assert body["step"][:steps] == list(range(1, steps + 1))
    return [s["value"][:steps] for s in body["series"]]


@pytest.mark.server
def test_sync_delivers_each_run_and_reports_progress(tmp_path: Path, spool_dir: Path) -> None:
    """The first run's spool keeps its steps as binary frames; the second's is rewritten as JSON
    alone (the format of a hook that spools JSON only): both deliver the same values."""
    port = find_free_port()
    url = f"http://127.0.0.1:{port}"
    runs = [offline_run(url, 5 + i, f"offline-{i}") for i in range(2)]
    assert len(list(spool_dir.glob("*.spool"))) == 2
    assert any(isinstance(p, bytes) for p in read_payloads(spool_dir / f"{runs[0].run_id}.spool")[0])
    rewrite_spool(spool_dir / f"{runs[1].run_id}.spool", {})
    assert all(isinstance(p, str) for p in read_payloads(spool_dir / f"{runs[1].run_id}.spool")[0])
    server = start_server(tmp_path, port=port)
    try:
        out = hook_sync("--server", url)
        assert out.returncode == 0, out.stderr
        assert f"syncing 2 spooled runs from {spool_dir} to {url}" in out.stdout
        assert "[1/2] run " in out.stdout and "[2/2] run " in out.stdout
        for i, w in enumerate(runs):
            assert f"run {w.run_id}: " in out.stdout
            run = httpx.get(f"{url}/api/runs/{w.run_id}").json()
            assert (run["steps"], run["status"]) == (5 + i, "finished")
        assert not list(spool_dir.glob("*.spool"))
        assert grad_norms(url, runs[0].run_id, 5) == grad_norms(url, runs[1].run_id, 5)
    finally:
        server.stop()


@pytest.mark.server
def test_a_server_that_refuses_the_token_exits_3_and_keeps_the_spool(tmp_path: Path, spool_dir: Path) -> None:
    port = find_free_port()
    url = f"http://127.0.0.1:{port}"
    w = offline_run(url, 3, "refused")
    server = start_server(tmp_path, port=port, token="right")
    try:
        out = hook_sync("--server", url, "--token", "wrong")
        assert out.returncode == 3, out.stderr
        assert f"run {w.run_id}: refused" in out.stderr and "token" in out.stderr
        assert (spool_dir / f"{w.run_id}.spool").is_file()
        good = hook_sync("--server", url, "--token", "right")
        assert good.returncode == 0, good.stderr
        assert httpx.get(f"{url}/api/runs/{w.run_id}").json()["steps"] == 3
    finally:
        server.stop()


def test_a_server_that_is_down_exits_1_with_what_to_do(spool_dir: Path) -> None:
    url = f"http://127.0.0.1:{find_free_port()}"
    w = offline_run(url, 2, "down")
    out = hook_sync("--server", url, "--timeout", "2")
    assert out.returncode == 1
    assert f"run {w.run_id}: not delivered" in out.stderr
    assert "is the server up (gradwatch serve)?" in out.stderr and "run this again" in out.stderr
    assert (spool_dir / f"{w.run_id}.spool").is_file()


def garbage_server() -> tuple[socket.socket, str]:
    """A plain TCP server on a free port that answers any request with bytes that are not HTTP, then closes."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:  # closed: the test is over
                return
            with conn:  # read the request first: closing on unread bytes would reset the connection
                conn.settimeout(5)
                request = b""
                while b"\r\n\r\n" not in request and (chunk := conn.recv(4096)):
                    request += chunk
                conn.sendall(b"\x00\xffSSH-2.0-not-http garbage\r\n\r\n")

    threading.Thread(target=serve, daemon=True).start()
    return listener, f"http://127.0.0.1:{listener.getsockname()[1]}"


def test_a_port_that_does_not_speak_websocket_exits_1_and_tries_every_file(spool_dir: Path) -> None:
    listener, url = garbage_server()
    try:
        runs = [offline_run(url, 2, f"elsewhere-{i}") for i in range(2)]
        out = hook_sync("--server", url, "--timeout", "2")
    finally:
        listener.close()
    assert out.returncode == 1, out.stderr
    assert "Traceback" not in out.stderr
    assert "[1/2] run " in out.stderr and "[2/2] run " in out.stderr  # the second file was tried too
    assert out.stderr.count("does not speak HTTP/websocket") == 2 and "the spool file stays" in out.stderr
    assert all((spool_dir / f"{w.run_id}.spool").is_file() for w in runs)


def rewrite_spool(path: Path, change: dict[int, str]) -> int:
    """Replace records of a spool file by number (1 is the hello); returns how many it has."""
    records, _ = read_records(path)
    texts = list(records)
    path.write_bytes(b"".join(frame(change.get(i, t)) for i, t in enumerate(texts, 1)))
    return len(texts)


@pytest.mark.server
def test_a_refused_message_or_a_corrupt_record_moves_its_file_aside_and_the_others_go(
    tmp_path: Path, spool_dir: Path
) -> None:
    port = find_free_port()
    url = f"http://127.0.0.1:{port}"
    corrupt, refused, good = (offline_run(url, 3, name) for name in ("corrupt", "refused", "good"))
    rewrite_spool(spool_dir / f"{corrupt.run_id}.spool", {2: '{"v": 1, "type": "step", "no": "seq"}'})
    second = json.loads(list(read_records(spool_dir / f"{refused.run_id}.spool")[0])[1])
    rewrite_spool(spool_dir / f"{refused.run_id}.spool", {2: json.dumps({**second, "step": "not a step"})})
    for age, w in enumerate((corrupt, refused, good)):  # the good file is tried last
        os.utime(spool_dir / f"{w.run_id}.spool", (1_000_000 + age, 1_000_000 + age))
    server = start_server(tmp_path, port=port)
    try:
        out = hook_sync("--server", url)
        assert out.returncode == 3, out.stderr
        assert "Traceback" not in out.stderr
        assert f"run {corrupt.run_id}: rejected: record 2 is not a message with a seq (KeyError" in out.stderr
        assert f"run {refused.run_id}: rejected: the server refused a spooled message" in out.stderr
        assert "2 of 3 spooled runs could not be sent" in out.stderr
        assert f"run {good.run_id}: " in out.stdout
        assert httpx.get(f"{url}/api/runs/{good.run_id}").json()["steps"] == 3
        for w in (corrupt, refused):  # moved aside, never deleted, and never replayed again
            assert not (spool_dir / f"{w.run_id}.spool").exists()
            assert (spool_dir / f"{w.run_id}.spool.rejected").stat().st_size > 0
            assert f"moved aside to {spool_dir / f'{w.run_id}.spool.rejected'}" in out.stderr
        again = hook_sync("--server", url)
        assert again.returncode == 0 and "nothing to sync" in again.stdout, again.stderr
    finally:
        server.stop()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--server", "ftp://x"], "http(s):// or ws(s):// URL"),
        (["--server", "http://"], "with a host"),
        (["--spool", "{missing}"], "no spool folder"),
        (["--timeout", "0"], "--timeout must be more than 0"),
    ],
)
def test_bad_input_exits_2_with_a_message(tmp_path: Path, args: list[str], message: str) -> None:
    args = [a.format(missing=tmp_path / "missing") for a in args]
    out = hook_sync(*args, env={"GRADWATCH_SPOOL": str(tmp_path)})
    assert out.returncode == 2
    assert message in out.stderr and "Traceback" not in out.stderr


def test_an_empty_default_spool_is_nothing_to_sync(tmp_path: Path) -> None:
    out = hook_sync(env={"GRADWATCH_SPOOL": str(tmp_path / "never-made")})
    assert out.returncode == 0 and "nothing to sync" in out.stdout


@pytest.mark.parametrize("argv", [["sync", "--help"], ["--help"]])
def test_help(argv: list[str]) -> None:
    out = subprocess.run([*HOOK, *argv], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "usage: python -m gradwatch" in out.stdout
    if "sync" in argv:
        assert "--server URL" in out.stdout and "exit status" in out.stdout


@pytest.mark.server
@pytest.mark.slow
def test_the_hook_installed_alone_syncs(tmp_path: Path, spool_dir: Path) -> None:
    """The wheel of ./trainer_hook, with no server dependency importable, delivers a real spool to
    a real server, through both `python -m gradwatch sync` and the `gradwatch-sync` script."""
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(REPO / "trainer_hook"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr
    wheel = next(tmp_path.glob("gradwatch-*.whl"))
    entry_points = (
        zipfile.ZipFile(wheel)
        .read(next(n for n in zipfile.ZipFile(wheel).namelist() if n.endswith("entry_points.txt")))
        .decode()
    )
    assert "gradwatch-sync = gradwatch.__main__:sync_main" in entry_points
    assert "gradwatch/py.typed" in zipfile.ZipFile(wheel).namelist()  # users' type checkers read our hints
    site = tmp_path / "site"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stderr
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(BLOCKER.format(names=SERVER_ONLY))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRADWATCH_")}
    env.update(PYTHONPATH=os.pathsep.join([str(blocker), str(site)]), GRADWATCH_SPOOL=str(spool_dir))
    probe = subprocess.run(
        [sys.executable, "-c", "import gradwatch, gradwatch.__main__, sys\nprint(gradwatch.__file__)\nimport fastapi"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
    )
    assert probe.stdout.startswith(str(site)) and "ModuleNotFoundError" in probe.stderr, probe.stderr

    port = find_free_port()
    url = f"http://127.0.0.1:{port}"
    first = offline_run(url, 4, "alone-1")
    records, _ = read_records(spool_dir / f"{first.run_id}.spool")
    assert spooled_steps(list(records)) == [1, 2, 3, 4]
    server = start_server(tmp_path, port=port)
    try:
        out = subprocess.run(
            [sys.executable, "-m", "gradwatch", "sync", "--server", url],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            cwd=tmp_path,
        )
        assert out.returncode == 0, out.stderr
        assert f"run {first.run_id}: " in out.stdout
        second = offline_run(f"http://127.0.0.1:{find_free_port()}", 6, "alone-2")
        script = site / "bin" / "gradwatch-sync"
        out = subprocess.run(
            [str(script), "--server", url], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path
        )
        assert out.returncode == 0, out.stderr
        assert f"run {second.run_id}: " in out.stdout
        for w, steps in ((first, 4), (second, 6)):
            run = httpx.get(f"{url}/api/runs/{w.run_id}").json()
            assert (run["steps"], run["status"]) == (steps, "finished")
        assert not list(spool_dir.glob("*.spool"))
    finally:
        server.stop()


WITHOUT_FCNTL = """
import logging, sys
sys.modules["fcntl"] = None  # as on Windows
logging.basicConfig(level=logging.WARNING)
import torch, gradwatch
from pathlib import Path
from gradwatch.spool import SpoolWriter, pending_spools
try:
    SpoolWriter(Path(sys.argv[1]), "r", "{}")
except OSError as exc:
    print("refused:", exc)
print("pending:", pending_spools(Path(sys.argv[1])))
model = torch.nn.Linear(2, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
w = gradwatch.watch(opt, model=model, server=sys.argv[2])
model(torch.ones(1, 2)).sum().backward()
opt.step()
w.close(timeout=0.2)
print("trained")
"""


def test_without_fcntl_the_hook_imports_and_trains_without_a_spool(tmp_path: Path) -> None:
    (tmp_path / "old.spool").write_bytes(b"")
    out = subprocess.run(
        [sys.executable, "-c", WITHOUT_FCNTL, str(tmp_path), f"http://127.0.0.1:{find_free_port()}"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "GRADWATCH_SPOOL": str(tmp_path)},
    )
    assert out.returncode == 0, out.stderr
    assert "refused: spool files need file locking (fcntl)" in out.stdout
    assert "pending: []" in out.stdout and "trained" in out.stdout
    assert "no spool in" in out.stderr and "fcntl" in out.stderr  # the watcher's warning says why
    assert json.dumps(sorted(p.name for p in tmp_path.iterdir())) == '["old.spool"]'

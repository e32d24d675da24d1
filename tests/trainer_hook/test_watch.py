"""watch(): argument checking, and training that never waits on an absent server."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import pytest
import torch

import gradwatch
from gradwatch.options import ingest_url
from gradwatch.watcher import _on_this_machine
from support.sent import sent_steps
from support.server import start_server

pytestmark = pytest.mark.unit  # a test that starts a server says so (@pytest.mark.server)


def make() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Linear(4, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"every": 0}, ValueError, "every must be a whole number >= 1"),
        ({"every": 2.5}, ValueError, "every must be a whole number >= 1"),
        ({"every": True}, ValueError, "every must be a whole number >= 1"),
        ({"server": "ftp://example"}, ValueError, "http"),
        ({"server": "not a url"}, ValueError, "http"),
        ({"server": "http://127.0.0.1:99999"}, ValueError, "invalid port"),
        ({"server": 8765}, TypeError, "URL string"),
        ({"model": "resnet"}, TypeError, "torch.nn.Module"),
        ({"model": [("fc.weight", 3)]}, TypeError, r"\(name, parameter\) pairs"),
        ({"run": ""}, ValueError, "run must be 1 to 200 printable characters"),
        ({"run": "a\nb"}, ValueError, "run must be"),
        ({"project": 3}, TypeError, "project must be a string"),
        ({"scaler": object()}, TypeError, "GradScaler"),
        ({"token": 123}, TypeError, "token must be a string"),
    ],
)
def test_bad_arguments_raise_clear_errors(kwargs, error, match) -> None:
    model, opt = make()
    with pytest.raises(error, match=match):
        gradwatch.watch(opt, **{"model": model, **kwargs})


def test_not_an_optimizer() -> None:
    model, _ = make()
    with pytest.raises(TypeError, match="needs a torch.optim.Optimizer"):
        gradwatch.watch(model)  # type: ignore[arg-type]


def test_bad_logged_values() -> None:
    model, opt = make()
    with gradwatch.watch(opt, model=model, server="http://127.0.0.1:9") as w:
        with pytest.raises(TypeError, match="loss: logged values must be numbers"):
            w.log(loss="low")
        with pytest.raises(ValueError, match="one element"):
            w.log(loss=torch.ones(3))
        with pytest.raises(ValueError, match="metric names"):
            w.log({"bad name!": 1.0})
        w.close(timeout=0.1)


@pytest.mark.parametrize(
    "server, url",
    [
        ("http://127.0.0.1:8765", "ws://127.0.0.1:8765/ws/ingest"),
        ("https://gw.example.org/base/", "wss://gw.example.org/base/ws/ingest"),
        ("ws://localhost:1", "ws://localhost:1/ws/ingest"),
    ],
)
def test_ingest_url(server: str, url: str) -> None:
    assert ingest_url(server) == url


def test_server_env_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRADWATCH_SERVER", "http://127.0.0.1:9")
    model, opt = make()
    w = gradwatch.watch(opt, model=model)
    assert w.server == "http://127.0.0.1:9"
    assert len(w.run_id) == 12
    w.close(timeout=0.1)


def test_training_with_no_server_never_blocks_and_close_is_bounded() -> None:
    model, opt = make()
    w = gradwatch.watch(opt, model=model, server="http://127.0.0.1:9", every=2)
    for _ in range(20):
        opt.zero_grad()
        model(torch.randn(3, 4)).sum().backward()
        opt.step()
    assert w.step == 20
    started = time.monotonic()
    w.close(timeout=0.5)
    assert time.monotonic() - started < 2.0
    assert w.pending == 21  # 20 steps (10 measured) and the close message, all kept for later delivery
    opt.zero_grad()
    model(torch.randn(3, 4)).sum().backward()
    opt.step()  # hooks are detached after close: no error, not counted
    assert w.step == 20


def test_an_error_inside_the_hook_stops_watching_not_training(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """If gradwatch's own work fails mid-run (here torch runs out of memory for its norms at the
    third step), the error is logged with its traceback, watching stops, and the training goes on
    exactly as it would have without gradwatch."""
    torch.manual_seed(0)
    model, opt = make()
    twin = torch.nn.Linear(4, 2)
    twin.load_state_dict(model.state_dict())
    twin_opt = torch.optim.SGD(twin.parameters(), lr=0.1)
    w = gradwatch.watch(opt, model=model, server="http://127.0.0.1:9", warn=False)
    real_norm = torch._foreach_norm

    def norm_until_step_3(*args, **kwargs):
        if w.step == 3:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB")
        return real_norm(*args, **kwargs)

    monkeypatch.setattr(torch, "_foreach_norm", norm_until_step_3)
    for _ in range(5):
        x = torch.randn(3, 4)
        for m, o in ((model, opt), (twin, twin_opt)):
            o.zero_grad()
            m(x).pow(2).sum().backward()
            o.step()
    assert torch.equal(model.weight, twin.weight) and torch.equal(model.bias, twin.bias)
    assert [m["step"] for m in sent_steps(w)] == [1, 2]
    assert w.step == 3  # not counting any more
    assert w._rounds._tracker.armed == 0 and opt._optimizer_step_pre_hooks == {}
    passes = list(w._rounds._tracker._passes)
    model(torch.randn(3, 4)).sum().backward()  # a graph built after: its gradient hooks are inert
    assert w._rounds._tracker._passes == passes
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "stopped watching" in errors[0].getMessage() and "step 3" in errors[0].getMessage()
    assert errors[0].exc_info[0] is torch.OutOfMemoryError
    w.close(timeout=0.1)


@pytest.mark.parametrize(
    "url, here",
    [
        ("ws://127.0.0.1:8765/ws/ingest", True),
        ("ws://localhost:8765/ws/ingest", True),
        ("ws://[::1]:8765/ws/ingest", True),
        ("ws://0.0.0.0:8765/ws/ingest", True),
        ("ws://10.0.0.7:8765/ws/ingest", False),
        ("wss://gw.example.com/ws/ingest", False),
    ],
)
def test_a_server_on_this_machine_is_told_apart(url: str, here: bool) -> None:
    """every="auto" counts a server's CPU per step as part of what watching costs only when the
    server is on the training's machine (reached over loopback)."""
    assert _on_this_machine(url) is here


def test_config_is_recorded_in_the_hello() -> None:
    model, opt = make()
    config = {"lr": 0.1, "layers": [2, 4], "nested": {"name": "x", "on": True, "none": None}}
    w = gradwatch.watch(opt, model=model, server="http://127.0.0.1:9", config=config)
    try:
        assert w._sender.hello["run"]["config"]["user"] == config
    finally:
        w.close(timeout=0.1)


@pytest.mark.parametrize(
    "config, error, match",
    [
        ("lr=0.1", TypeError, "config must be a mapping"),
        ({"lr": float("nan")}, ValueError, "no NaN or infinity"),
        ({"model": torch.nn.Linear(1, 1)}, ValueError, "config must hold only JSON values"),
        ({(1, 2): "a"}, ValueError, "config must hold only JSON values"),
    ],
)
def test_bad_config(config, error, match) -> None:
    model, opt = make()
    with pytest.raises(error, match=match):
        gradwatch.watch(opt, model=model, server="http://127.0.0.1:9", config=config)


@pytest.mark.parametrize("status", ["failed", "", None, "Finished"])
def test_close_status_must_be_finished_or_crashed(status: object) -> None:
    model, opt = make()
    w = gradwatch.watch(opt, model=model, server="http://127.0.0.1:9")
    with pytest.raises(ValueError, match='status must be "finished" or "crashed"'):
        w.close(timeout=0.1, status=status)  # type: ignore[arg-type]
    w.close(timeout=0.1)  # a refused status leaves the watcher open to close properly


@pytest.mark.server
def test_close_records_how_the_run_ended(server) -> None:
    """The close message carries the status: GET /api/runs lists each run as it was closed."""
    ids = {}
    for status in ("finished", "crashed"):
        model, opt = make()
        w = gradwatch.watch(opt, model=model, server=server.url, run=status, warn=False)
        model(torch.randn(3, 4)).sum().backward()
        opt.step()
        w.close(timeout=20, status=status)
        assert w.pending == 0
        ids[w.run_id] = status
    with httpx.Client(base_url=server.url, timeout=30) as http:
        listed = {r["id"]: r["status"] for r in http.get("/api/runs").raise_for_status().json()["data"]}
    assert {run_id: listed[run_id] for run_id in ids} == ids


SCRIPT = """
import sys, torch, gradwatch
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
w = gradwatch.watch(opt, model=model, server=sys.argv[1], run=sys.argv[2], warn=False)
print(w.run_id, flush=True)
for _ in range(3):
    opt.zero_grad()
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
if sys.argv[2] == "raises":
    raise RuntimeError("the training failed")
"""


@pytest.mark.server
def test_a_script_that_dies_of_an_exception_ends_its_run_crashed(tmp_path, spool_dir) -> None:
    """The run closed at interpreter exit says how the script ended: "crashed" when an uncaught
    exception ended it, "finished" otherwise (a real script in a subprocess, a real server)."""
    server = start_server(tmp_path)
    try:
        script = tmp_path / "train.py"
        script.write_text(SCRIPT)
        env = {**os.environ, "GRADWATCH_SPOOL": str(spool_dir)}
        ended = {}
        for name, code in (("raises", 1), ("ends", 0)):
            proc = subprocess.run(
                [sys.executable, str(script), server.url, name], capture_output=True, text=True, env=env, timeout=120
            )
            assert proc.returncode == code, proc.stderr
            assert ("RuntimeError: the training failed" in proc.stderr) == (name == "raises")  # the user's hook ran too
            ended[proc.stdout.split()[0]] = "crashed" if name == "raises" else "finished"
        with httpx.Client(base_url=server.url, timeout=30) as http:
            runs = http.get("/api/runs").raise_for_status().json()["data"]
        assert {r["id"]: r["status"] for r in runs if r["id"] in ended} == ended
        assert all(r["steps"] == 3 for r in runs if r["id"] in ended)
    finally:
        server.stop()

"""watch(): argument checking, and training that never waits on an absent server."""
from __future__ import annotations

import time

import pytest
import torch

import gradwatch
from gradwatch.watcher import ingest_url


def make() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Linear(4, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


@pytest.mark.parametrize("kwargs, error, match", [
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
])
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


@pytest.mark.parametrize("server, url", [
    ("http://127.0.0.1:8765", "ws://127.0.0.1:8765/ws/ingest"),
    ("https://gw.example.org/base/", "wss://gw.example.org/base/ws/ingest"),
    ("ws://localhost:1", "ws://localhost:1/ws/ingest"),
])
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

"""The hook shows the server's findings in the training process: one GradwatchWarning per code
(again only if it turns graver), none with watch(warn=False), and never an exception into the
sender or the training loop. A real training loop, a real server."""
from __future__ import annotations

import warnings
from collections.abc import Iterator

import httpx
import pytest
import torch
from support.server import ServerProcess, start_server

import gradwatch
from gradwatch.findings import FindingWarner, GradwatchWarning, describe, run_page


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = start_server(tmp_path_factory.mktemp("findings"))
    yield server
    server.stop()


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Linear(4, 8)
        self.unused = torch.nn.Linear(8, 8)  # never in the forward pass
        self.head = torch.nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.body(x)))


def sloppy_training(server: str, **watch_args: object) -> gradwatch.Watcher:
    """20 steps that never call zero_grad() and never use `unused`: two findings, each over many steps."""
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    w = gradwatch.watch(opt, model=model, server=server, project="tests", **watch_args)  # type: ignore[arg-type]
    for _ in range(20):
        model(torch.randn(8, 4)).pow(2).mean().backward()
        opt.step()
    w.close(timeout=30)
    assert w.pending == 0
    return w


def test_each_code_is_one_warning(srv: ServerProcess) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # even so: one warning per code, the hook deduplicates
        w = sloppy_training(srv.url, run="warns")
    shown = [str(c.message) for c in caught if issubclass(c.category, GradwatchWarning)]
    page = f"{srv.url}/runs/{w.run_id}"
    found = httpx.get(f"{srv.url}/api/runs/{w.run_id}/diagnostics", timeout=10).json()
    assert sorted(f["code"] for f in found) == ["grad_accumulation_unbounded", "param_never_gets_grad"]
    assert sorted(shown) == sorted(describe(f, page) for f in found)
    assert any(s.startswith("gradwatch error: Gradients pile up across steps") and s.endswith(f"step 2; {page}]")
               for s in shown)


def test_warn_false_is_silent(srv: ServerProcess) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        w = sloppy_training(srv.url, run="quiet", warn=False)
    assert not [c for c in caught if issubclass(c.category, GradwatchWarning)]
    found = httpx.get(f"{srv.url}/api/runs/{w.run_id}/diagnostics", timeout=10).json()
    assert len(found) == 2  # the server found them all the same


def test_warnings_as_errors_never_break_the_sender(srv: ServerProcess, caplog: pytest.LogCaptureFixture) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # python -W error: warn() raises on the sender thread
        w = sloppy_training(srv.url, run="strict")
    assert w.pending == 0  # every step still delivered
    assert "Gradients pile up across steps" in caplog.text


def test_the_warner_deduplicates_and_ignores_garbage() -> None:
    warner = FindingWarner(page="http://127.0.0.1:8765/runs/abc")
    finding = {"code": "amp_skipped_steps", "severity": "info", "message": "GradScaler skipped 1 step.",
               "params": [], "first_step": 3}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for bad in (None, "x", {"severity": "info"}, {"code": 3}):
            warner(bad)
        warner(finding)
        warner(dict(finding, message="GradScaler skipped 2 steps."))
        warner(dict(finding, severity="warning", message="GradScaler skipped 40 of 80 steps."))
    assert [str(c.message) for c in caught] == [
        "gradwatch info: GradScaler skipped 1 step. [amp_skipped_steps, step 3; http://127.0.0.1:8765/runs/abc]",
        "gradwatch warning: GradScaler skipped 40 of 80 steps. [amp_skipped_steps, step 3; "
        "http://127.0.0.1:8765/runs/abc]"]
    assert warner.findings["amp_skipped_steps"]["severity"] == "warning"
    assert describe({"code": "param_not_in_optimizer", "severity": "warning", "message": "m", "first_step": None}) \
        == "gradwatch warning: m [param_not_in_optimizer, from the start]"


def test_run_page() -> None:
    assert run_page("http://127.0.0.1:8765", "abc") == "http://127.0.0.1:8765/runs/abc"
    assert run_page("wss://host/gw/", "abc") == "https://host/gw/runs/abc"
    assert issubclass(GradwatchWarning, UserWarning)  # so `-W ignore::UserWarning` silences it too


def test_on_finding_gets_each_new_finding_on_the_sender_thread(srv: ServerProcess) -> None:
    got: list[tuple[str, dict[str, object]]] = []
    import threading

    def callback(finding: dict[str, object]) -> None:
        got.append((threading.current_thread().name, finding))

    w = sloppy_training(srv.url, run="called", warn=False, on_finding=callback)
    found = httpx.get(f"{srv.url}/api/runs/{w.run_id}/diagnostics", timeout=10).json()
    assert sorted(f["code"] for _, f in got) == sorted(f["code"] for f in found)  # each once
    assert {thread for thread, _ in got} == {"gradwatch-sender"}  # never the training thread
    by_code = {f["code"]: f for f in found}
    for _, finding in got:
        assert finding["page"] == f"{srv.url}/runs/{w.run_id}"
        assert finding["severity"] == by_code[finding["code"]]["severity"]
        assert finding["first_step"] == by_code[finding["code"]]["first_step"]


def test_a_failing_on_finding_never_reaches_training(srv: ServerProcess, caplog: pytest.LogCaptureFixture) -> None:
    calls: list[str] = []

    def callback(finding: dict[str, object]) -> None:
        calls.append(str(finding["code"]))
        if len(calls) == 1:
            raise RuntimeError("checkpoint disk full")
        raise SystemExit(1)  # even this stays on the sender thread

    w = sloppy_training(srv.url, run="raising", warn=False, on_finding=callback)
    assert w.pending == 0  # every step delivered after the callback raised
    assert len(calls) == 2
    assert caplog.text.count("the on_finding callback raised") == 2
    assert "checkpoint disk full" in caplog.text

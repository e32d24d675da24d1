"""The hook shows the server's findings in the training process: one GradwatchWarning per code
(again only if it turns graver), none with watch(warn=False), and never an exception into the
sender or the training loop. A real training loop, a real server."""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable, Iterator

import httpx
import pytest
import torch

import gradwatch
from gradwatch.findings import FindingWarner, GradwatchWarning, describe, run_page
from support.server import ServerProcess, start_server

pytestmark = pytest.mark.server


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
    assert any(
        s.startswith("gradwatch error: Gradients pile up across steps") and s.endswith(f"step 2; {page}]")
        for s in shown
    )


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
    finding = {
        "code": "amp_skipped_steps",
        "severity": "info",
        "message": "GradScaler skipped 1 step.",
        "params": [],
        "first_step": 3,
    }
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
        "http://127.0.0.1:8765/runs/abc]",
    ]
    assert warner.findings["amp_skipped_steps"]["severity"] == "warning"
    assert (
        describe({"code": "param_not_in_optimizer", "severity": "warning", "message": "m", "first_step": None})
        == "gradwatch warning: m [param_not_in_optimizer, from the start]"
    )


def test_run_page() -> None:
    assert run_page("http://127.0.0.1:8765", "abc") == "http://127.0.0.1:8765/runs/abc"
    assert run_page("wss://host/gw/", "abc") == "https://host/gw/runs/abc"
    assert issubclass(GradwatchWarning, UserWarning)  # so `-W ignore::UserWarning` silences it too


def test_on_finding_gets_each_new_finding_on_a_thread_of_its_own(srv: ServerProcess) -> None:
    got: list[tuple[str, dict[str, object]]] = []

    def callback(finding: dict[str, object]) -> None:
        got.append((threading.current_thread().name, finding))

    w = sloppy_training(srv.url, run="called", warn=False, on_finding=callback)
    found = httpx.get(f"{srv.url}/api/runs/{w.run_id}/diagnostics", timeout=10).json()
    assert sorted(f["code"] for _, f in got) == sorted(f["code"] for f in found)  # each once
    assert {thread for thread, _ in got} == {"gradwatch-on-finding"}  # neither the training nor the sender thread
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
        raise SystemExit(1)  # even this stays on the callback's thread

    w = sloppy_training(srv.url, run="raising", warn=False, on_finding=callback)
    assert w.pending == 0  # every step delivered after the callback raised
    assert len(calls) == 2
    assert caplog.text.count("the on_finding callback raised") == 2
    assert "checkpoint disk full" in caplog.text


class Sloppy:
    """A training loop that never calls zero_grad(), watched with `on_finding`, stepped by hand:
    the server soon finds gradients piling up."""

    def __init__(self, server: str, run: str, on_finding: Callable[[dict[str, object]], None]) -> None:
        torch.manual_seed(0)
        self.model = Net()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-3)
        self.w = gradwatch.watch(
            self.opt, model=self.model, server=server, project="tests", run=run, warn=False, on_finding=on_finding
        )

    def step(self) -> None:
        self.model(torch.randn(8, 4)).pow(2).mean().backward()
        self.opt.step()

    def until(self, event: threading.Event) -> int:
        """Steps until `event` is set (by the callback); how many."""
        steps = 0
        while not event.is_set():
            assert steps < 2000, "no finding came"
            self.step()
            steps += 1
            time.sleep(0.01)
        return steps


def test_a_slow_on_finding_delays_no_step(srv: ServerProcess) -> None:
    """A callback that takes seconds (saving a checkpoint) runs beside the sender: the steps after
    it are all acknowledged while it still runs, none dropped. Under the old code the sender ran it
    and `close(timeout=3)` gave up with steps unacknowledged."""
    started, done = threading.Event(), threading.Event()

    def callback(finding: dict[str, object]) -> None:
        started.set()
        time.sleep(8)
        done.set()

    loop = Sloppy(srv.url, "slow-callback", callback)
    steps = loop.until(started)
    for _ in range(50):  # while the callback sleeps
        loop.step()
    w = loop.w
    w.close(timeout=3)
    assert not done.is_set()  # the callback still runs: close() did not wait on it past its timeout
    assert w.pending == 0 and w._sender.dropped == 0
    run = httpx.get(f"{srv.url}/api/runs/{w.run_id}", timeout=10).json()
    assert run["steps"] == steps + 50 == w.step
    assert run["status"] == "finished"


def test_close_inside_on_finding_leaves_the_final_close_to_deliver(srv: ServerProcess) -> None:
    """`w.close()` inside the callback stops the watching at the next step; the script's own
    close() still waits for and delivers every step watched, and finishes the run. Under the old
    code it joined the sender from itself and the script's close() returned at once."""
    closed_in_callback = threading.Event()

    def callback(finding: dict[str, object]) -> None:
        loop.w.close()
        closed_in_callback.set()

    loop = Sloppy(srv.url, "close-in-callback", callback)
    loop.until(closed_in_callback)
    w = loop.w
    watched = w.step
    for _ in range(10):  # after the request: no longer watched
        loop.step()
    assert w.step in (watched, watched + 1)  # a step in flight when the callback ran may count
    w.close(timeout=30)
    assert w.pending == 0
    run = httpx.get(f"{srv.url}/api/runs/{w.run_id}", timeout=10).json()
    assert run["steps"] == w.step
    assert run["status"] == "finished"


@pytest.mark.timed
def test_a_loss_spike_reaches_on_finding_within_a_second_of_its_step(srv: ServerProcess) -> None:
    """A training loop paced at 20 steps/s logs its loss; one batch makes it jump 10x at step 60.
    The `loss_spike` finding of that step reaches the callback within a second of the step's
    `optimizer.step()`: a hook with `on_finding` sends at FINDING_LINGER_S, not at the 5 s a
    server asks for while no browser watches."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    arrived: dict[str, float] = {}
    w = gradwatch.watch(
        opt,
        model=model,
        server=srv.url,
        project="tests",
        run="fast-finding",
        warn=False,
        on_finding=lambda f: arrived.setdefault(f["code"], time.monotonic()),
    )
    stepped = 0.0
    for step in range(1, 81):
        opt.zero_grad()
        loss = model(torch.randn(16, 4)).pow(2).mean() + 1.0 + (9.0 if step == 60 else 0.0)
        loss.backward()
        w.log(loss=float(loss) * (1 + 0.01 * float(torch.randn(()))))
        opt.step()
        if step == 60:
            stepped = time.monotonic()
        time.sleep(0.05)
    w.close(timeout=30)
    assert "loss_spike" in arrived, arrived
    assert arrived["loss_spike"] - stepped < 1.0, arrived["loss_spike"] - stepped

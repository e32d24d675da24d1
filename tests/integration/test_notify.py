"""`gradwatch serve --notify URL`: each new error or warning finding of a real training run is
POSTed to real local HTTP receivers (http.server on free ports): one that answers, one that fails
twice before answering, one that is slow, one that is down; ingest never waits for any of them."""

from __future__ import annotations

import base64
import json
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

import gradwatch
from gradwatch_server.notify import Notifier, RunRef
from support.server import find_free_port, server_command, server_env, start_server

#: asserts on wall-clock time: `make test` runs it alone, after the parallel tests
pytestmark = pytest.mark.timed

SLOW_S = 6.0


@dataclass
class Receiver:
    """A webhook receiver: what it got (path and JSON body), answering `statuses` in turn, then 200."""

    statuses: list[int] = field(default_factory=list)
    hold: threading.Event | None = None  # set: each request waits for it (at most SLOW_S) first
    got: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    auth: dict[str, str | None] = field(default_factory=dict)  # path: its Authorization header
    requests: int = 0
    server: ThreadingHTTPServer | None = None

    def start(self) -> str:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.requests += 1
                if receiver.hold is not None:
                    receiver.hold.wait(SLOW_S)
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                if status == 200:
                    assert self.headers["Content-Type"] == "application/json"
                    receiver.got.append((self.path, json.loads(body)))
                    receiver.auth[self.path] = self.headers["Authorization"]
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


@pytest.fixture
def receivers() -> Iterator[dict[str, Receiver]]:
    made = {"ok": Receiver(), "flaky": Receiver(statuses=[500, 503]), "slow": Receiver(hold=threading.Event())}
    yield made
    for r in made.values():
        if r.hold is not None:
            r.hold.set()
        r.stop()


def sloppy_training(server: str) -> tuple[gradwatch.Watcher, float]:
    """No zero_grad() and an unused layer: an error and a warning finding. Returns the watcher and
    the seconds that close() took to have every step acknowledged."""
    torch.manual_seed(0)
    model = torch.nn.ModuleDict(
        {"body": torch.nn.Linear(4, 8), "unused": torch.nn.Linear(8, 8), "head": torch.nn.Linear(8, 1)}
    )
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    w = gradwatch.watch(opt, model=model, server=server, run="notified", project="alerts", warn=False)
    for _ in range(20):
        model["head"](torch.relu(model["body"](torch.randn(8, 4)))).pow(2).mean().backward()
        opt.step()
    started = time.monotonic()
    w.close(timeout=30)
    assert w.pending == 0
    return w, time.monotonic() - started


def wait_for(condition: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_findings_reach_every_webhook_and_ingest_never_waits(tmp_path: Path, receivers: dict[str, Receiver]) -> None:
    urls = {name: r.start() + f"/hook/{name}" for name, r in receivers.items()}
    down = f"http://127.0.0.1:{find_free_port()}/hook/down"
    args = [
        "--notify",
        urls["ok"] + "#gw-alerts",
        "--notify",
        urls["flaky"],
        "--notify",
        urls["slow"],
        "--notify",
        down,
    ]
    server = start_server(tmp_path, args=args)
    try:
        w, close_s = sloppy_training(server.url)
        assert close_s < SLOW_S / 2  # acks never waited for the slow receiver (nor the down one)
        found = httpx.get(f"{server.url}/api/runs/{w.run_id}/diagnostics", timeout=10).json()
        notable = {f["code"]: f for f in found if f["severity"] in ("error", "warning")}
        assert set(notable) == {"grad_accumulation_unbounded", "param_never_gets_grad"}
        # The slow receiver held every request until here (at most SLOW_S), not SLOW_S per finding:
        # what it proves is the close above, done in under SLOW_S / 2 while it held.
        assert receivers["slow"].hold is not None
        receivers["slow"].hold.set()

        wait_for(lambda: all(len(r.got) == len(notable) for r in receivers.values()), timeout=3 * SLOW_S)
        time.sleep(0.5)  # nothing more arrives: each finding once
        page = f"{server.url}/runs/{w.run_id}"
        for name, r in receivers.items():
            assert [path for path, _ in r.got] == [f"/hook/{name}"] * len(notable)
            assert sorted(body["code"] for _, body in r.got) == sorted(notable)
            for _, body in r.got:
                want = notable[body["code"]]
                assert body["run"] == {"id": w.run_id, "name": "notified", "project": "alerts"}
                assert (body["severity"], body["first_step"]) == (want["severity"], want["first_step"])
                assert body["url"] == body["click"] == page
                assert body["message"] and body["message"] in body["text"] and page in body["text"]
                assert body["content"] == body["text"][:2000]  # Discord
                assert body["title"] == f"gradwatch {want['severity']}: notified"  # ntfy
                assert body.get("topic") == ("gw-alerts" if name == "ok" else None)
        assert receivers["flaky"].requests == len(notable) + 2  # two failures, retried

        wait_for(lambda: "giving up" in server.log(), timeout=20)  # the down one: retried, then logged
        log = server.log()
        assert "notification to http://127.0.0.1:" in log and "/hook/flaky failed (HTTP 500); retrying (1/4)" in log
        assert "/hook/down failed" in log and "retrying (3/4)" in log
        assert "Traceback" not in log
    finally:
        server.stop()


def test_credentials_in_a_webhook_url_go_as_basic_auth_not_in_the_host() -> None:
    """urllib would read `user:pass@host` as the host: the credentials go in an Authorization header."""
    receiver = Receiver()
    base = receiver.start()
    secret = base.replace("http://", "http://alice:p%40ss%3Aword@") + "/hook/auth?k=1#topic"
    notifier = Notifier([secret, base + "/hook/plain"], "http://dash", attempts=1, backoff_s=0.0)
    try:
        notifier.finding(RunRef("r1", "n", "p"), {"severity": "error", "code": "c", "message": "m", "first_step": 1})
        notifier.close(10.0)
    finally:
        receiver.stop()
    assert [(c.delivered, c.failed) for c in notifier.channels] == [(1, 0), (1, 0)]
    assert sorted(path for path, _ in receiver.got) == ["/hook/auth?k=1", "/hook/plain"]
    sent = receiver.auth["/hook/auth?k=1"]
    assert sent is not None and sent.startswith("Basic ")
    assert base64.b64decode(sent.removeprefix("Basic ")) == b"alice:p@ss:word"  # percent-decoded
    assert receiver.auth["/hook/plain"] is None
    assert "alice" not in notifier.channels[0].shown and "p%40ss" not in notifier.channels[0].shown


def test_the_environment_names_webhooks_and_info_findings_stay_quiet(tmp_path: Path) -> None:
    """$GRADWATCH_NOTIFY (comma-separated); a clean run with intentional accumulation (an info
    finding) sends nothing."""
    one, two = Receiver(), Receiver()
    try:
        urls = f"{one.start()}/a,{two.start()}/b"
        server = start_server(tmp_path, env={"GRADWATCH_NOTIFY": urls})
        try:
            model = torch.nn.Linear(4, 1)
            opt = torch.optim.SGD(model.parameters(), lr=1e-3)
            with gradwatch.watch(opt, model=model, server=server.url, warn=False) as w:
                for _ in range(12):
                    opt.zero_grad()
                    for _ in range(2):  # two micro-batches a step, on purpose
                        model(torch.randn(4, 4)).pow(2).mean().backward()
                    opt.step()
            found = httpx.get(f"{server.url}/api/runs/{w.run_id}/diagnostics", timeout=10).json()
            assert [f["severity"] for f in found] == ["info"]
            time.sleep(0.5)
            assert one.requests == two.requests == 0

            # the same server tells both receivers of a warning: a layer the optimizer leaves out
            net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
            opt = torch.optim.SGD(net[1].parameters(), lr=1e-3)
            with gradwatch.watch(opt, model=net, server=server.url, warn=False):
                for _ in range(3):
                    opt.zero_grad()
                    net(torch.randn(4, 4)).sum().backward()
                    opt.step()
            wait_for(lambda: len(one.got) == len(two.got) == 1, timeout=10)
            assert one.got[0][0] == "/a" and two.got[0][0] == "/b"
            assert one.got[0][1]["code"] == "param_not_in_optimizer"
        finally:
            server.stop()
    finally:
        one.stop()
        two.stop()


@pytest.mark.parametrize(
    "args, env",
    [
        (["--notify", "ftp://example.org/hook"], {}),
        ([], {"GRADWATCH_NOTIFY": "http://127.0.0.1:9/ok,not a url"}),
    ],
)
def test_a_bad_webhook_url_stops_serve_with_a_clear_message(
    tmp_path: Path, args: list[str], env: dict[str, str]
) -> None:
    done = subprocess.run(
        [*server_command(), "serve", "--db", str(tmp_path / "x.db"), "--port", str(find_free_port()), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=server_env(env),
        check=False,
    )
    assert done.returncode == 2
    assert "invalid setting: notify" in done.stderr and "must be http:// or https:// with a host" in done.stderr

"""QuietServer: uvicorn with a main loop that does not wake at rest, a `Date` header renewed by the
requests that read it, and a stop at once when told."""

from __future__ import annotations

import gc
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from email.utils import parsedate_to_datetime
from pathlib import Path

import pytest
from fastapi import FastAPI

from gradwatch_server import serving

pytestmark = pytest.mark.unit


def test_a_stop_signal_ends_the_wait_at_once(monkeypatch: pytest.MonkeyPatch, free_port: int) -> None:
    """With a tick of a minute, the server still stops within seconds of SIGTERM (handled as
    uvicorn's signal handler would), and serves requests with a Date header meanwhile."""
    monkeypatch.setattr(serving, "TICK_S", 60.0)
    app = FastAPI()
    app.get("/ping")(lambda: {"ok": True})
    server = serving.QuietServer(serving.uvicorn.Config(app, host="127.0.0.1", port=free_port, log_level="warning"))
    thread = threading.Thread(target=server.run)  # not the main thread: uvicorn installs no signal handlers
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started
    with urllib.request.urlopen(f"http://127.0.0.1:{free_port}/ping", timeout=5) as reply:
        assert reply.status == 200 and reply.headers["date"]
    time.sleep(0.3)  # the main loop is now waiting out its tick
    asked = time.monotonic()
    server.handle_exit(signal.SIGTERM, None)
    thread.join(timeout=20)
    assert not thread.is_alive()
    assert time.monotonic() - asked < 10  # a minute's tick, had the signal not woken it


def test_tune_gc_freezes_what_exists_and_collects_less_often() -> None:
    """What exists before the server starts is out of the collector's view, and its young
    generation is GC_THRESHOLD's (restored afterwards: this process is pytest's)."""
    before = gc.get_threshold()
    kept = [{"i": i} for i in range(1000)]  # live containers that the freeze must take
    try:
        serving.tune_gc()
        assert gc.get_threshold() == serving.GC_THRESHOLD
        assert gc.get_freeze_count() >= len(kept)
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


@pytest.fixture
def quiet_server(free_port: int) -> Iterator[tuple[str, threading.Thread]]:
    """A QuietServer of one route (`/ping`) run in a thread: its URL and its event loop's thread."""
    app = FastAPI()
    app.get("/ping")(lambda: {"ok": True})
    server = serving.QuietServer(serving.uvicorn.Config(app, host="127.0.0.1", port=free_port, log_level="warning"))
    thread = threading.Thread(target=server.run)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started
    try:
        yield f"http://127.0.0.1:{free_port}", thread
    finally:
        server.handle_exit(signal.SIGTERM, None)
        thread.join(timeout=20)


def served_date(url: str) -> float:
    with urllib.request.urlopen(f"{url}/ping", timeout=5) as reply:
        return parsedate_to_datetime(reply.headers["date"]).timestamp()


def test_the_date_header_is_the_second_of_the_request(quiet_server: tuple[str, threading.Thread]) -> None:
    """The `Date` header is renewed by the request that reads it in a new second, not by a timer:
    two requests 2.2 s apart carry dates at least 2 s apart, each within a second of the clock."""
    url, _ = quiet_server
    first, asked = served_date(url), time.time()
    time.sleep(2.2)
    second, asked_again = served_date(url), time.time()
    assert abs(first - asked) <= 1.5 and abs(second - asked_again) <= 1.5, (first, asked, second, asked_again)
    assert second - first >= 2, (first, second)


def test_a_server_at_rest_does_not_wake(quiet_server: tuple[str, threading.Thread]) -> None:
    """After a request, the event loop's thread is not scheduled once in 5.5 s (its timeslices in
    /proc, `schedstat`): nothing renews a header or looks at the loop's state meanwhile. Each
    wake-up costs CPU that a training beside the server pays."""
    url, thread = quiet_server
    served_date(url)
    time.sleep(0.3)  # the request's last callbacks
    schedstat = Path(f"/proc/self/task/{thread.native_id}/schedstat")
    slices = int(schedstat.read_text().split()[2])
    time.sleep(5.5)
    assert int(schedstat.read_text().split()[2]) == slices

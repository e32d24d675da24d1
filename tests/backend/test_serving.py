"""QuietServer: uvicorn with a main loop that ticks once a second, and stops at once when told."""

from __future__ import annotations

import gc
import signal
import threading
import time
import urllib.request

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

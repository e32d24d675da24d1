"""A dashboard that stops reading must not slow ingest, nor the dashboards that keep up: the
server drops it (1013) once its bounded queue is full. Prints the ingest latency figure."""

from __future__ import annotations

import json
import statistics
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from support.server import start_server
from support.wiremsg import Hook, close, hello, step

pytestmark = pytest.mark.server

PARAMS = 2000  # ~20 KB per live message: a stalled reader's socket buffers fill fast
BASELINE_STEPS, LOADED_STEPS = 150, 600


def ingest(hook: Hook, first: int, count: int) -> list[float]:
    """Send steps one by one; the latency of each is the time until the server's ack."""
    latencies = []
    rng = np.random.default_rng(first)
    for i in range(first, first + count):
        message = step(
            i + 1,
            i,
            scalars={"loss": 1.0 / i},
            arrays={"grad_norm": rng.random(PARAMS, dtype=np.float32)},
            grad_status=[2] * PARAMS,
        )
        started = time.perf_counter()
        reply = hook.call(message)
        latencies.append(time.perf_counter() - started)
        assert reply["type"] == "ack" and reply["seq"] == i + 1, reply
    return latencies


def p95(values: list[float]) -> float:
    return sorted(values)[int(0.95 * (len(values) - 1))]


@pytest.mark.timed
def test_a_stalled_dashboard_does_not_slow_ingest_and_is_dropped(tmp_path: Path) -> None:
    server = start_server(tmp_path)
    origin = server.url
    first, last = 1 + BASELINE_STEPS, BASELINE_STEPS + LOADED_STEPS
    try:
        with Hook(server.ws_url) as hook:
            assert hook.call(hello("busy", params=[f"layer{i}.weight" for i in range(PARAMS)]))["type"] == "welcome"
            hook.call(step(1, 0, scalars={"loss": 1.0}))  # step 0: the run exists before the dashboards

            # A browser that reads everything watches throughout; the stalled one joins halfway.
            healthy_steps: list[int] = []
            stop = threading.Event()

            def follow() -> None:
                with connect(f"{server.ws_url}/ws/live?run=busy", origin=origin, max_size=None) as ws:
                    while not stop.is_set():
                        try:
                            msg = json.loads(ws.recv(timeout=0.2))
                        except TimeoutError:
                            continue
                        if msg["type"] == "step":
                            healthy_steps.append(msg["step"])

            follower = threading.Thread(target=follow)
            follower.start()
            time.sleep(0.5)
            alone = ingest(hook, 1, BASELINE_STEPS)
            stalled_scope = connect(f"{server.ws_url}/ws/live?run=busy", origin=origin, max_size=None, max_queue=1)
            stalled = stalled_scope.__enter__()  # and never read from until the run is over
            time.sleep(0.5)
            loaded = ingest(hook, first, LOADED_STEPS)
            hook.call(close(2 + last))
            # until the browser that keeps up has every step (asserted below), not a fixed second
            deadline = time.monotonic() + 30
            while not set(range(first, last + 1)) <= set(healthy_steps) and time.monotonic() < deadline:
                time.sleep(0.02)
            stop.set()
            follower.join(10)

        # The stalled browser now reads what was buffered for it: it ends with 1013, well before
        # the last step, because the server stopped queueing for it.
        got, code = 0, None
        try:
            while True:
                msg = json.loads(stalled.recv(timeout=10))
                got += msg["type"] == "step"
        except ConnectionClosed as closed:
            code = closed.rcvd.code if closed.rcvd else None
        stalled_scope.__exit__(None, None, None)
    finally:
        server.stop()

    a_med, l_med = statistics.median(alone), statistics.median(loaded)
    print(
        f"\ningest ack latency, {PARAMS} params/step, one dashboard following: median {a_med * 1e3:.2f} ms "
        f"p95 {p95(alone) * 1e3:.2f} ms; with a stalled dashboard too: median {l_med * 1e3:.2f} ms "
        f"p95 {p95(loaded) * 1e3:.2f} ms (x{l_med / a_med:.2f}); stalled dashboard got {got}/{LOADED_STEPS} steps, "
        f"closed with {code}; the following one got {len(set(healthy_steps) & set(range(first, last + 1)))}/{LOADED_STEPS}"
    )
    assert code == 1013
    assert got < LOADED_STEPS
    # every step reached the browser that keeps up
    assert set(range(first, last + 1)) <= set(healthy_steps)
    # Ingest latency is unchanged within the noise of a shared 2-core machine (a stalled client
    # that slowed ingest would push every ack behind a blocked send: seconds, not milliseconds).
    assert l_med < max(3 * a_med, a_med + 0.020), (a_med, l_med)
    assert p95(loaded) < max(5 * p95(alone), p95(alone) + 0.050), (p95(alone), p95(loaded))

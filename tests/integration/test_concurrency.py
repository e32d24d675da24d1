"""16 training runs streaming at once into one server on SQLite while 4 dashboards watch live:
every step of every run stored, no "database is locked", every dashboard kept up. Prints its figure."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import pytest
import torch
from websockets.sync.client import connect

import gradwatch
from support.server import start_server

#: asserts on wall-clock time: `make test` runs it alone, after the parallel tests
pytestmark = pytest.mark.timed

RUNS, STEPS, DASHBOARDS = 16, 40, 4


def train(url: str, index: int, ids: list[str]) -> None:
    torch.manual_seed(index)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 4))
    opt = torch.optim.Adam(model.parameters())
    w = gradwatch.watch(opt, model=model, server=url, run=f"concurrent-{index}", project="load", warn=False)
    ids.append(w.run_id)
    for _ in range(STEPS):
        opt.zero_grad()
        model(torch.randn(8, 16)).pow(2).mean().backward()
        opt.step()
        time.sleep(0.005)
    w.close(timeout=60)
    assert w.pending == 0


def dashboard(ws_url: str, seen: list[int], stop: threading.Event) -> None:
    """A browser on the run list: counts the run events it receives."""
    with connect(ws_url + "/ws/live", origin=ws_url.replace("ws://", "http://")) as ws:
        while not stop.is_set():
            try:
                if json.loads(ws.recv(timeout=0.2)).get("type") == "run":
                    seen.append(1)
            except TimeoutError:
                continue


def test_sixteen_runs_and_four_dashboards(tmp_path: Path) -> None:
    server = start_server(tmp_path)
    try:
        stop = threading.Event()
        seen: list[list[int]] = [[] for _ in range(DASHBOARDS)]
        watchers = [threading.Thread(target=dashboard, args=(server.ws_url, s, stop)) for s in seen]
        for t in watchers:
            t.start()
        time.sleep(0.3)
        ids: list[str] = []
        started = time.monotonic()
        trainers = [threading.Thread(target=train, args=(server.url, i, ids)) for i in range(RUNS)]
        for t in trainers:
            t.start()
        for t in trainers:
            t.join(timeout=120)
        elapsed = time.monotonic() - started
        stop.set()
        for t in watchers:
            t.join(timeout=10)
        runs = {
            r["id"]: r
            for r in httpx.get(f"{server.url}/api/runs", params={"project": "load", "limit": 100}).json()["data"]
        }
        stored = sum(runs[i]["steps"] for i in ids)
        assert len(ids) == RUNS and set(ids) <= set(runs)
        assert all(runs[i]["status"] == "finished" for i in ids)
        assert stored == RUNS * STEPS
        log = server.log()
        assert "database is locked" not in log and "Traceback" not in log
        assert all(len(s) >= RUNS for s in seen)  # each dashboard saw every run appear (and finish)
    finally:
        server.stop()
    print(
        f"\n{RUNS} concurrent runs x {STEPS} steps, {DASHBOARDS} live dashboards: {stored}/{RUNS * STEPS} steps stored "
        f"in {elapsed:.1f} s, 0 'database is locked'"
    )

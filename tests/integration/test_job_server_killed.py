"""The server SIGKILLed in the middle of a 64-rank job (simulated ranks speaking protocol v1 as the
hook does: keep what is not acknowledged, reconnect with backoff, resend from the welcome's
`last_seq`), then restarted on the same SQLite file and port: every step the server acknowledged
before the kill is still there, no step is lost, none is partial, and every global norm equals the
combination of what the ranks sent (the oracle: float64 square root of the sum of squared counted
local norms)."""

from __future__ import annotations

import asyncio
import json
import random
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from gradwatch_server.store import open_store
from support.server import ServerProcess, start_server
from support.wiremsg import close, rank_hello, step

#: asserts on wall-clock time: `make test` runs it alone, after the parallel tests
pytestmark = pytest.mark.timed

JOB = "killed-job"
RANKS, STEPS, PERIOD_S = 64, 16, 0.25
KILL_AT = 5  # the job's stored steps when the server is killed
#: fc.weight sharded across the ranks (every piece counts), fc.bias a replica (rank 0's counts).
COUNTED = {"fc.weight": [True] * RANKS, "fc.bias": [r == 0 for r in range(RANKS)]}


def grads(rank: int, s: int) -> np.ndarray:
    """Rank `rank`'s local gradient norms at step `s`: its own shard of fc.weight, and fc.bias
    the same on every rank (a replica after the all-reduce)."""
    weight = np.random.default_rng(rank * 1000 + s).random()
    bias = np.random.default_rng(s).random()
    return np.array([weight, bias], dtype="<f4")


class Rank:
    """One simulated rank: its frames, what the server acknowledged, and every welcome's last_seq."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        message = rank_hello(JOB, rank, RANKS, local_numel=[3, 3], counted=[True, rank == 0])
        self.hello = json.dumps(message)
        self.acked = 0
        self.welcomes: list[int] = []

    def frame(self, s: int) -> str:
        g = grads(self.rank, s)
        return json.dumps(
            step(s, s, scalars={"loss": 1.0, "time/step_s": 0.1}, arrays={"grad_norm": g}, grad_status=[2, 2])
        )

    async def run(self, url: str, t0: float) -> None:
        backoff = 0.1
        while True:
            try:
                async with connect(url, open_timeout=2, ping_interval=None) as ws:
                    await ws.send(self.hello)
                    welcome = json.loads(await asyncio.wait_for(ws.recv(), 5))
                    assert welcome["type"] == "welcome", welcome
                    self.welcomes.append(int(welcome["last_seq"]))
                    backoff = 0.1
                    reader = asyncio.create_task(self._acks(ws))
                    for s in range(int(welcome["last_seq"]) + 1, STEPS + 1):
                        await asyncio.sleep(max(0.0, t0 + s * PERIOD_S - time.time()))
                        if reader.done():
                            break
                        await ws.send(self.frame(s))
                    if not reader.done():
                        await ws.send(json.dumps(close(STEPS + 1)))
                    await reader
                    if self.acked >= STEPS + 1:
                        return
            except (OSError, TimeoutError, ConnectionClosed, InvalidHandshake):
                pass  # the server is down or restarting: retry
            await asyncio.sleep(backoff * (0.5 + random.random()))  # the hook's backoff, with jitter
            backoff = min(backoff * 2, 2.0)

    async def _acks(self, ws: Any) -> None:
        async for raw in ws:
            message = json.loads(raw)
            if message["type"] == "ack":
                self.acked = max(self.acked, int(message["seq"]))
                if self.acked >= STEPS + 1:
                    return


def stored_steps(url: str) -> int:
    try:
        with urllib.request.urlopen(f"{url}/api/runs/{JOB}", timeout=5) as r:
            return int(json.loads(r.read())["steps"])
    except OSError:
        return 0


def test_a_server_killed_mid_job_loses_no_acknowledged_step_and_stores_every_step_whole(tmp_path: Path) -> None:
    db = tmp_path / "gradwatch.db"
    servers: list[ServerProcess] = [start_server(tmp_path, db_path=db)]
    ranks = [Rank(r) for r in range(RANKS)]
    acked_at_kill: list[int] = []

    async def main() -> None:
        url = servers[0].ws_url + "/ws/ingest"
        t0 = time.time() + 1.0
        tasks = [asyncio.create_task(r.run(url, t0)) for r in ranks]
        while await asyncio.to_thread(stored_steps, servers[0].url) < KILL_AT:
            await asyncio.sleep(0.05)
        acked_at_kill.extend(r.acked for r in ranks)
        servers[0].proc.kill()
        servers[0].proc.wait()
        port = int(servers[0].url.rsplit(":", 1)[1])
        servers.append(await asyncio.to_thread(start_server, tmp_path, db_path=db, port=port))
        await asyncio.wait_for(asyncio.gather(*tasks), 180)

    try:
        asyncio.run(main())
        with urllib.request.urlopen(f"{servers[-1].url}/api/runs/{JOB}/ranks", timeout=10) as r:
            ranks_info = json.loads(r.read())
        deadline = time.monotonic() + 30
        while json.loads(urllib.request.urlopen(f"{servers[-1].url}/api/runs/{JOB}").read())["status"] == "running":
            assert time.monotonic() < deadline, "the job did not finish: " + servers[-1].log()[-2000:]
            time.sleep(0.1)
    finally:
        for server in servers:
            server.stop()
    assert sum(acked_at_kill) > 0, "the server was killed before it acknowledged anything"
    assert min(acked_at_kill) < STEPS, "every rank had its steps acknowledged before the kill: not mid-job"
    for rank, acked in zip(ranks, acked_at_kill):
        if acked <= STEPS:  # its close was not acknowledged: it reconnected to the new server
            assert len(rank.welcomes) >= 2, f"rank {rank.rank} never reconnected"
            assert rank.welcomes[1] >= acked, f"rank {rank.rank}: acked {acked} before the kill, then lost"
    assert ranks_info["partial"]["steps"] == 0 and not any(r["lost"] for r in ranks_info["ranks"])
    store = open_store(f"sqlite:///{db}")
    rows = {r.step: r for chunk in store.iter_steps(JOB) for r in chunk}
    assert sorted(rows) == list(range(1, STEPS + 1))
    for s, row in rows.items():
        sent = np.stack([grads(r, s).astype(np.float64) for r in range(RANKS)])
        weight = np.sqrt(np.sum(sent[:, 0] ** 2))
        bias = sent[0, 1]
        assert row.scalars["dist/ranks"] == RANKS
        assert row.arrays["grad_norm"][0] == pytest.approx(weight, rel=1e-6), s
        assert row.arrays["grad_norm"][1] == pytest.approx(bias, rel=1e-6), s

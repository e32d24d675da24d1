"""A rank SIGKILLed in the middle of a real 2-rank job: the run is marked, nothing the surviving
rank sent is lost, the steps after the dead rank's last one are partial, and the dead rank's
spool, replayed by `python -m gradwatch sync`, completes its own child run and the job's steps it
was missing from.

No collective after setup (each rank trains its own copy), so the survivor goes on as a real job
would until its launcher noticed. The dead rank makes its death deterministic: it reaches the
server through a proxy; once the server has acknowledged its first steps, the proxy cuts the
link (forwarding nothing more, the sockets left open, as on a dead network), the rank takes two
more steps, waits until its spool holds them (written every second) and kills itself with SIGKILL.
Those two steps can only have reached its spool, whenever its sender tried to send them."""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from torch import nn

import gradwatch
from gradwatch.spool import read_records, spool_dir
from support.dist import PRELOAD, _rank_main
from support.distruns import exported, get, job_of, settled, wait_for
from support.proxy import Partition
from support.server import find_free_port, server_env, start_server

pytestmark = pytest.mark.server

DELIVERED, SPOOLED, SURVIVOR_STEPS = 3, 5, 10
RANK_TIMEOUT_S = 2


def spooled_steps(path: Path) -> set[int]:
    """The steps a spool file holds so far (its complete records)."""
    steps: set[int] = set()
    records, _ = read_records(path)
    for record in map(json.loads, records):
        if record.get("type") in ("step", "steps"):
            step = record["step"]
            steps.update(step if isinstance(step, list) else [step])
    return steps


def lost_rank_job(rank: int, world_size: int, urls: tuple[str, str], folder: str) -> tuple[str, list[float]]:
    """Rank 1 (at `urls[1]`, the proxy) has its link cut after step DELIVERED and dies by SIGKILL
    after step SPOOLED; rank 0 trains on to SURVIVOR_STEPS and returns its run id and its losses."""
    torch.manual_seed(rank)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    url, died, cut = urls[rank], Path(folder) / "rank1-died", Path(folder) / "rank1-cut"
    losses = []
    w = gradwatch.watch(opt, model=model, run="lost-rank", project="dist", server=url, warn=False)

    def step() -> None:
        opt.zero_grad()
        loss = model(torch.randn(16, 4)).pow(2).mean()
        loss.backward()
        w.log(loss=loss)
        opt.step()
        losses.append(loss.item())

    for _ in range(DELIVERED):
        step()
    if rank == 1:
        # the job's first steps assembled whole (rank 1's arrays asked for and sent: its digests
        # differ from rank 0's) and acknowledged: the cut then takes nothing of them
        deadline = time.monotonic() + 30
        while w.pending or get(url, f"/api/runs/{job_of(w.run_id)}")["steps"] < DELIVERED:
            assert time.monotonic() < deadline, "the server did not assemble and acknowledge rank 1's first steps"
            time.sleep(0.05)
        cut.with_suffix(".asked").touch()
        while not cut.exists():
            assert time.monotonic() < deadline, "the link was not cut"
            time.sleep(0.02)
        for _ in range(SPOOLED - DELIVERED):
            step()
        spool = spool_dir() / f"{w.run_id}.r1.spool"
        while max(spooled_steps(spool), default=0) < SPOOLED:  # the sender writes it every second
            assert time.monotonic() < deadline, "rank 1's last steps never reached its spool"
            time.sleep(0.05)
        died.write_text(w.run_id)
        os.kill(os.getpid(), signal.SIGKILL)
    while not died.exists():
        time.sleep(0.05)
    for _ in range(SURVIVOR_STEPS - DELIVERED):
        step()
    w.close(timeout=30)
    return w.run_id, losses


def cut_when_asked(partition: Partition, folder: Path, timeout: float = 120.0) -> None:
    """Cut `partition` once rank 1 asks (its `.asked` file), then tell it so (the file itself)."""
    cut, deadline = folder / "rank1-cut", time.monotonic() + timeout
    while not cut.with_suffix(".asked").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    partition.cut()
    cut.touch()


@pytest.mark.timed  # the server gives a missing rank RANK_TIMEOUT_S before it stores a step partial
def test_a_killed_rank_marks_the_run_and_its_spool_completes_it(tmp_path: Path) -> None:
    server = start_server(tmp_path, args=("--rank-timeout", str(RANK_TIMEOUT_S)))
    partition = Partition(int(server.url.rsplit(":", 1)[1]))
    threading.Thread(target=cut_when_asked, args=(partition, tmp_path), daemon=True).start()
    spool = tmp_path / "spool"
    try:
        # the fork server that support.dist's jobs use: torch and the hook imported once, not
        # once per rank (a spawned rank imports them again before it reaches its job)
        multiprocessing.set_forkserver_preload(PRELOAD)
        context = multiprocessing.get_context("forkserver")
        port = find_free_port()
        ranks = [
            context.Process(
                target=_rank_main,
                args=(
                    rank,
                    2,
                    port,
                    str(tmp_path),
                    dict(os.environ),
                    lost_rank_job,
                    ((server.url, partition.url), str(tmp_path)),
                ),
            )
            for rank in range(2)
        ]
        for process in ranks:
            process.start()
        for process in ranks:
            process.join(120)
        assert [p.exitcode for p in ranks] == [0, -signal.SIGKILL]
        status, result = pickle.loads((tmp_path / "rank0.pickle").read_bytes())
        assert status == "ok", result
        run_id, losses = result
        job = job_of(run_id)

        parent = settled(server.url, job, ("crashed",))
        assert (parent["world_size"], parent["steps"]) == (2, SURVIVOR_STEPS)
        view = get(server.url, f"/api/runs/{job}/ranks")
        dead = view["ranks"][1]
        assert (dead["rank"], dead["last_step"], dead["steps"]) == (1, DELIVERED, DELIVERED), view
        assert dead["lost"] or dead["status"] == "crashed", view
        assert view["ranks"][0]["status"] == "finished" and view["ranks"][0]["steps"] == SURVIVOR_STEPS, view
        partial = {
            "steps": SURVIVOR_STEPS - DELIVERED,
            "ranges": [{"first": DELIVERED + 1, "last": SURVIVOR_STEPS, "missing": [1]}],
        }
        assert view["partial"] == partial

        # nothing rank 0 sent is lost: every step of the parent, its loss rank 0's
        stored = exported(server.url, job)
        assert sorted(stored) == list(range(1, SURVIVOR_STEPS + 1))
        assert [stored[s]["scalars"]["loss"] for s in sorted(stored)] == losses
        assert [stored[s]["scalars"]["dist/ranks"] for s in sorted(stored)] == [2] * DELIVERED + [1] * (
            SURVIVOR_STEPS - DELIVERED
        )
        assert len(exported(server.url, f"{job}.r0")) == SURVIVOR_STEPS

        # the dead rank's spool holds the two steps it never sent: replayed, they reach its child run
        assert sorted(exported(server.url, f"{job}.r1")) == list(range(1, DELIVERED + 1))
        assert list(spool.glob("*.spool")), "the killed rank left no spool"
        synced = subprocess.run(
            [sys.executable, "-m", "gradwatch", "sync", "--server", server.url],
            env=server_env({"GRADWATCH_SPOOL": str(spool)}),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert synced.returncode == 0, synced.stdout + synced.stderr
        child = wait_for(
            "rank 1's replayed steps",
            lambda: (s := exported(server.url, f"{job}.r1")) and len(s) == SPOOLED and s,
            timeout=30,
        )
        assert sorted(child) == list(range(1, SPOOLED + 1))
        assert not list(spool.glob("*.spool"))  # delivered, deleted
        # and the job's steps they were missing from are assembled again, whole; the rest stay partial
        after = {
            "steps": SURVIVOR_STEPS - SPOOLED,
            "ranges": [{"first": SPOOLED + 1, "last": SURVIVOR_STEPS, "missing": [1]}],
        }
        assert wait_for("the completed steps", lambda: get(server.url, f"/api/runs/{job}/ranks")["partial"] == after)
        assert get(server.url, f"/api/runs/{job}")["steps"] == SURVIVOR_STEPS
        again = exported(server.url, job)
        assert [again[s]["scalars"]["dist/ranks"] for s in sorted(again)] == [2] * SPOOLED + [1] * (
            SURVIVOR_STEPS - SPOOLED
        )
        own = exported(server.url, f"{job}.r0")  # plain parameters count on rank 0 alone
        norms = [
            {k: v for k, v in got.items() if k not in ("scalars", "desync_ranks")}
            for got in (again[SPOOLED], own[SPOOLED])
        ]
        assert norms[0]["grad_norm"] and norms[0] == norms[1]
        # the ranks train copies seeded apart: a completed step compares them as a whole step does
        assert again[SPOOLED]["desync_ranks"] == stored[1]["desync_ranks"] == dict.fromkeys(stored[1]["grad_norm"], 1.0)
        assert all(again[s]["grad_norm"] == own[s]["grad_norm"] for s in again)
        assert [again[s]["scalars"]["loss"] for s in sorted(again)] == [
            stored[s]["scalars"]["loss"] for s in sorted(stored)
        ]
    finally:
        partition.close()
        server.stop()

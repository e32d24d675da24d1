"""Nothing is lost: no server at all, a server SIGKILLed mid-run, a training process SIGKILLed.
Real processes on loopback; each test prints its figure."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import torch

import gradwatch
from gradwatch.spool import read_records
from support.distruns import settled, wait_for
from support.server import ServerProcess, find_free_port, start_server
from support.wiresteps import spooled_steps

GRADWATCH = [sys.executable, "-m", "gradwatch_server"]


def train(
    w: gradwatch.Watcher, model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int, pause: float = 0.0
) -> None:
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(4, 8)).pow(2).mean().backward()
        opt.step()
        if pause:
            time.sleep(pause)


def stored_steps(url: str, run_id: str) -> list[int]:
    rows = httpx.get(f"{url}/api/runs/{run_id}/series", params={"key": "grad_norm_total", "max_points": 100000}).json()
    return rows["step"]


def sync(url: str, spool: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*GRADWATCH, "sync", "--server", url, "--spool", str(spool)], capture_output=True, text=True, timeout=120
    )


def test_a_run_with_no_server_arrives_whole_after_sync(tmp_path: Path, spool_dir: Path) -> None:
    port = find_free_port()
    url = f"http://127.0.0.1:{port}"
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.Adam(model.parameters())
    w = gradwatch.watch(opt, model=model, server=url, run="offline")
    train(w, model, opt, 40)
    w.close(timeout=0.5)
    spools = list(spool_dir.glob("*.spool"))
    assert len(spools) == 1
    records, _ = read_records(spools[0])
    records = list(records)[1:]  # after the hello: the steps (batched by the sender), then close
    assert spooled_steps(records) == list(range(1, 41)) and json.loads(records[-1])["type"] == "close"
    assert w.pending == len(records)
    server = start_server(tmp_path, port=port)
    try:
        out = sync(url, spool_dir)
        assert out.returncode == 0, out.stderr
        assert f"run {w.run_id}: {len(records)} messages delivered" in out.stdout
        run = httpx.get(f"{url}/api/runs/{w.run_id}").json()
        assert (run["steps"], run["status"]) == (40, "finished")
        assert stored_steps(url, w.run_id) == list(range(1, 41))
        assert not list(spool_dir.glob("*.spool"))  # delivered: the spool is gone
        again = sync(url, spool_dir)
        assert again.returncode == 0 and "nothing to sync" in again.stdout
    finally:
        server.stop()
    print("\nno server during the run, then `gradwatch sync`: 40/40 steps stored")


def test_sync_without_a_server_fails_clearly_and_keeps_the_spool(tmp_path: Path, spool_dir: Path) -> None:
    url = f"http://127.0.0.1:{find_free_port()}"
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w = gradwatch.watch(opt, model=model, server=url)
    train(w, model, opt, 3)
    w.close(timeout=0.2)
    out = sync(url, spool_dir)
    assert out.returncode == 1
    assert "could not be delivered" in out.stderr and "gradwatch serve" in out.stderr
    assert len(list(spool_dir.glob("*.spool"))) == 1
    bad = subprocess.run(
        [*GRADWATCH, "sync", "--server", "ftp://x", "--spool", str(spool_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "http(s)://" in bad.stderr  # bad usage


#: eleven server starts: asserts nothing timed, so it runs with the parallel tests, where beside
#: them on a loaded machine it may take longer than pytest.ini's 300 s
@pytest.mark.timeout(900)
def test_server_sigkilled_mid_run_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    # Two runs per trial, trained step for step side by side, so that each SIGKILL lands on two
    # runs at once, each in its own phase of sending (their senders' linger timers are their own):
    # ten runs and twenty (run, kill) pairs for half the server starts, which are most of a
    # trial's time.
    trials, runs, steps = 5, 2, 120
    port = find_free_port()
    db = tmp_path / "kill.db"
    lost = duplicated = 0
    # A trial starts on the server the one before it left running (the same database and port):
    # two starts a trial, not three; each trial still kills its server twice mid-run.
    holder: dict[str, ServerProcess] = {"s": start_server(tmp_path, db_path=db, port=port)}
    try:
        for trial in range(trials):
            rng = random.Random(trial)
            models = [torch.nn.Linear(8, 2) for _ in range(runs)]
            opts = [torch.optim.Adam(m.parameters()) for m in models]
            watchers = [
                gradwatch.watch(o, model=m, server=holder["s"].url, run=f"kill-{trial}-{r}")
                for r, (m, o) in enumerate(zip(models, opts, strict=True))
            ]
            kill_at = sorted(rng.uniform(0.1, 1.0) for _ in range(2))

            def killer(kill_at: list[float], rng: random.Random, holder: dict[str, ServerProcess]) -> None:
                started = time.monotonic()
                for at in kill_at:
                    time.sleep(max(0.0, at - (time.monotonic() - started)))
                    holder["s"].proc.send_signal(signal.SIGKILL)
                    holder["s"].proc.wait()
                    time.sleep(rng.uniform(0.05, 0.3))
                    holder["s"] = start_server(tmp_path, db_path=db, port=port)

            t = threading.Thread(target=killer, args=(kill_at, rng, holder))
            t.start()
            for _ in range(steps):
                for w, model, opt in zip(watchers, models, opts, strict=True):
                    train(w, model, opt, 1)
                time.sleep(0.01)
            t.join()
            for w in watchers:
                w.close(timeout=30)
                assert w.pending == 0
                got = stored_steps(holder["s"].url, w.run_id)
                lost += len(set(range(1, steps + 1)) - set(got))
                duplicated += len(got) - len(set(got))
                csv = httpx.get(f"{holder['s'].url}/api/runs/{w.run_id}/export", params={"format": "csv"}).text
                assert csv.count("\n") - 1 == steps * 2  # two parameters: each (step, param) row exactly once
    finally:
        holder["s"].stop()
    print(
        f"\nserver SIGKILLed twice per trial, {trials} trials of {runs} runs: {lost} steps lost, {duplicated} duplicated"
    )
    assert lost == 0 and duplicated == 0


TRAINER = """
import sys, time, torch, gradwatch
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
w = gradwatch.watch(opt, model=model, server=sys.argv[1], run="killed")
print(w.run_id, flush=True)
for i in range(1, 1000):
    opt.zero_grad(); model(torch.randn(4, 8)).sum().backward(); opt.step()
    if i == 40:
        print("40", flush=True)
    time.sleep(0.005)
"""


def test_training_process_sigkilled_replays_every_complete_record(tmp_path: Path, spool_dir: Path) -> None:
    port = find_free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-c", TRAINER, url],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "GRADWATCH_SPOOL": str(spool_dir)},
    )
    assert proc.stdout is not None
    run_id = proc.stdout.readline().strip()
    assert proc.stdout.readline().strip() == "40"
    path = spool_dir / f"{run_id}.spool"

    def spooled_past_40() -> bool:
        """The sender spools what was submitted every `linger` (0.25 s with no server): wait until
        the records before the last hold step 40, so that the torn tail made below leaves 40."""
        if not path.exists():
            return False
        records = list(read_records(path)[0])
        return len(spooled_steps(records[:-1])) >= 40

    wait_for("40 steps spooled", spooled_past_40, timeout=60)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    data = path.read_bytes()
    path.write_bytes(data[:-7])  # and a torn tail, as a kill mid-write leaves
    records, report = read_records(path)
    steps = spooled_steps(records)
    assert report.torn and len(steps) >= 40
    server = start_server(tmp_path, port=port)
    try:
        out = sync(url, spool_dir)
        assert out.returncode == 0, out.stderr
        assert "dropped" in out.stdout
        assert stored_steps(url, run_id) == steps == list(range(1, len(steps) + 1))
        # no close record, no hook: crashed once the server's crash grace (1 s in tests) is over
        assert settled(url, run_id, ("crashed",), timeout=30)["status"] == "crashed"
    finally:
        server.stop()
    print(f"\ntraining SIGKILLed: {len(steps)}/{len(steps)} complete spooled steps replayed, torn tail dropped")

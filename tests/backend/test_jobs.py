"""Distributed jobs against a real `gradwatch serve`: the test acts as the ranks (a websocket each,
hellos with `dist` and steps built by hand per docs/protocol.md), and reads the job's run back
over REST. Values are checked against the combination computed here from the local norms sent.

Each module server runs once on SQLite and once on PostgreSQL (`module_db_url`). `srv` waits long
for a silent rank (--rank-timeout 60): its tests never see a rank lost; `quick` loses one after 1 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from sqlalchemy import event
from websockets.sync.client import connect

from gradwatch_server.diagnostics import Diagnostics
from gradwatch_server.jobs.assembler import JobAssembler
from gradwatch_server.live import LiveHub
from gradwatch_server.store import open_store
from support.asgi import in_process_server
from support.databases import new_database
from support.jobs import partial_steps
from support.server import ServerProcess, start_server
from support.wiremsg import Hook, close, f32, hello, rank_hello, step

pytestmark = pytest.mark.server

RANK_TIMEOUT_S = 1.0
#: fc.weight is sharded (half on each rank, both counted); fc.bias is a DDP replica (rank 0 counts).
PIECES = {"local_numel": [3, 3], "counted": [True, True]}
REPLICA_RANK1 = {"local_numel": [3, 3], "counted": [True, False]}


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory, module_db_url: str) -> Iterator[ServerProcess]:
    server = start_server(tmp_path_factory.mktemp("jobs"), db_url=module_db_url, args=("--rank-timeout", "60"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def quick(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, module_db_url: str
) -> Iterator[ServerProcess]:
    # a database of its own: this server would find `srv`'s ranks silent and lose them
    folder = tmp_path_factory.mktemp("jobs-quick")
    kind = "postgresql" if module_db_url.startswith("postgresql") else "sqlite"
    with new_database(request, kind, folder) as url:
        server = start_server(folder, db_url=url, crash_grace_s=0.5, args=("--rank-timeout", str(RANK_TIMEOUT_S)))
        yield server
        server.stop()


@pytest.fixture
def http(srv: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=srv.url, timeout=10) as client:
        yield client


def send(
    hook: Hook,
    seq: int,
    index: int,
    grad: list[float],
    status: list[int] | None = None,
    **scalars: float,
) -> dict[str, Any]:
    return hook.call(
        step(
            seq,
            index,
            scalars={"loss": float(index), **{k.replace("__", "/"): v for k, v in scalars.items()}},
            arrays={"grad_norm": f32(*grad), "param_norm": f32(*[g + 1 for g in grad])},
            grad_status=status or [2, 2],
        )
    )


def job_steps(base_url: str, run_id: str) -> dict[int, dict[str, Any]]:
    """The stored steps of a run, by step, from its JSON export (a job's global steps: its ranks'
    own lines, with a `rank`, follow them)."""
    lines = httpx.get(f"{base_url}/api/runs/{run_id}/export", params={"format": "json"}, timeout=10).text
    return {d["step"]: d for d in map(json.loads, lines.splitlines()) if d["type"] == "step" and d.get("rank") is None}


def global_norm(pieces: list[tuple[float, bool]]) -> float:
    """The oracle: sqrt of the sum of squared counted local norms, float64, then float32."""
    return float(np.float32(math.sqrt(sum(v * v for v, counted in pieces if counted))))


def wait_for(what: Callable[[], Any], timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = what()
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def test_a_step_is_assembled_once_every_rank_sent_it_with_the_global_values(
    srv: ServerProcess, http: httpx.Client
) -> None:
    with (
        connect(f"{srv.ws_url}/ws/live?run=j-values") as watcher,
        connect(f"{srv.ws_url}/ws/live") as lister,
        Hook(srv.ws_url) as r0,
        Hook(srv.ws_url) as r1,
    ):
        assert r0.call(rank_hello("j-values", 0, 2, **PIECES))["run_id"] == "j-values.r0"
        assert r1.call(rank_hello("j-values", 1, 2, **REPLICA_RANK1))["run_id"] == "j-values.r1"
        send(r0, 1, 1, [3.0, 0.5], time__step_s=0.2, mem__params_bytes=100)
        send(r0, 2, 2, [1.0, 0.25], time__step_s=0.2, mem__params_bytes=100)
        assert http.get("/api/runs/j-values").json()["steps"] == 0  # rank 1 has sent nothing
        send(r1, 1, 1, [4.0, 0.5], time__step_s=0.9, mem__params_bytes=50)
        assert http.get("/api/runs/j-values").json()["steps"] == 1  # step 2 waits for rank 1
        send(r1, 2, 2, [2.0, 0.25], time__step_s=0.9, mem__params_bytes=50)
        stored = job_steps(srv.url, "j-values")
        assert sorted(stored) == [1, 2]
        for index, (w0, w1, b) in {1: (3.0, 4.0, 0.5), 2: (1.0, 2.0, 0.25)}.items():
            got = stored[index]
            weight = global_norm([(w0, True), (w1, True)])
            bias = global_norm([(b, True), (b, False)])
            assert got["params"]["grad_norm"] == [weight, bias]
            assert got["params"]["param_norm"] == [
                global_norm([(w0 + 1, True), (w1 + 1, True)]),
                global_norm([(b + 1, True), (b + 1, False)]),
            ]
            assert got["scalars"]["dist/ranks"] == 2.0
            assert got["scalars"]["time/step_s"] == 0.9  # the slowest rank
            assert got["scalars"]["mem/params_bytes"] == 150.0  # the job's footprint
            assert got["scalars"]["loss"] == float(index)
            assert got["grad_status"] == [2, 2]
        # the ranks' own runs keep what each sent
        assert job_steps(srv.url, "j-values.r1")[1]["params"]["grad_norm"] == [4.0, 0.5]
        live: list[dict[str, Any]] = []
        while len(live) < 2:  # the job's steps (run events come to every browser)
            event = json.loads(watcher.recv(timeout=10))
            if event["type"] != "run":
                live.append(event)
        assert [(e["type"], e["step"]) for e in live] == [("step", 1), ("step", 2)]
        assert live[0]["params"]["grad_norm"] == stored[1]["params"]["grad_norm"]
        r0.call(close(3))
        r1.call(close(3))
        events = []
        while (run := json.loads(lister.recv(timeout=10))["run"])["status"] == "running":
            events.append(run["id"])
        assert run["id"] == "j-values" and run["status"] == "finished"
        assert set(events) == {"j-values"}  # the run list never hears of a rank's run
    runs = http.get("/api/runs").json()["data"]
    listed = [r for r in runs if r["id"].startswith("j-values")]
    assert [(r["id"], r["world_size"], r["parent_id"], r["rank"]) for r in listed] == [("j-values", 2, None, None)]
    child = http.get("/api/runs/j-values.r1").json()
    assert (child["parent_id"], child["rank"], child["world_size"], child["status"]) == ("j-values", 1, 2, "finished")
    series = http.get("/api/runs/j-values.r1/series", params={"key": "time/step_s"}).json()
    assert series["value"] == [0.9, 0.9]
    assert http.get("/api/runs/j-values.r1/diagnostics").json() == []


def test_duplicates_and_replays_of_a_rank_are_stored_and_assembled_once(srv: ServerProcess, http: httpx.Client) -> None:
    with Hook(srv.ws_url) as r0, Hook(srv.ws_url) as r1:
        r0.call(rank_hello("j-dup", 0, 2))
        r1.call(rank_hello("j-dup", 1, 2))
        send(r0, 1, 1, [1.0, 1.0])
        send(r1, 1, 1, [2.0, 2.0])
        assert send(r1, 1, 1, [2.0, 2.0]) == {"type": "ack", "seq": 1, "linger": 5.0}  # resent
    with Hook(srv.ws_url) as r1:
        assert r1.call(rank_hello("j-dup", 1, 2))["last_seq"] == 1  # resumed
        send(r1, 1, 1, [9.0, 9.0])  # a spool replay of seq 1: already stored
        send(r1, 2, 2, [3.0, 3.0])
    with Hook(srv.ws_url) as r0:
        r0.call(rank_hello("j-dup", 0, 2))
        send(r0, 2, 2, [4.0, 4.0])
        send(r0, 2, 2, [4.0, 4.0])
    stored = job_steps(srv.url, "j-dup")
    assert sorted(stored) == [1, 2]
    assert stored[1]["params"]["grad_norm"] == [global_norm([(1.0, True), (2.0, True)])] * 2
    assert stored[2]["params"]["grad_norm"] == [global_norm([(4.0, True), (3.0, True)])] * 2
    assert [s["seq"] for s in stored.values()] == [1, 2]
    run = http.get("/api/runs/j-dup").json()
    assert run["steps"] == 2
    assert http.get("/api/runs/j-dup.r1").json()["steps"] == 2


def test_a_refused_rank_harms_nothing_else(srv: ServerProcess, http: httpx.Client) -> None:
    with Hook(srv.ws_url) as r0:
        r0.call(rank_hello("j-refuse", 0, 2))
        send(r0, 1, 1, [3.0, 4.0])
        other = rank_hello("j-refuse", 1, 2)
        other["params"][0]["shape"], other["params"][0]["numel"] = [3, 2], 6
        renamed = rank_hello("j-refuse", 1, 2, params=("fc.weight", "head.bias"))
        wrong_id = rank_hello("j-refuse", 1, 2)
        wrong_id["run"]["id"] = "j-refuse.r0"
        too_high = rank_hello("j-refuse", 1, 2)
        too_high["dist"]["rank"], too_high["run"]["id"] = 2, "j-refuse.r2"
        bigger = rank_hello("j-refuse", 1, 3)
        for message, text in (
            (other, "'fc.weight' has shape [3, 2], the job's is [2, 3]"),
            (renamed, "'head.bias' is not in the job; 'fc.bias' is missing"),
            (wrong_id, "must be the stream id 'j-refuse.r1'"),
            (too_high, "rank 2 is not below world_size 2"),
            (bigger, "job 'j-refuse' has world_size 2; rank 1 says 3"),
        ):
            with Hook(srv.ws_url) as bad:
                bad.send(message)
                code, _, error = bad.refused()
            assert code == 1003 and error is not None and text in error, error
        assert http.get("/api/runs/j-refuse.r1").status_code == 404
        with Hook(srv.ws_url) as r1:
            r1.call(rank_hello("j-refuse", 1, 2))
            send(r1, 1, 1, [3.0, 4.0])
            r1.call(close(2))
        r0.call(close(2))
    assert job_steps(srv.url, "j-refuse")[1]["params"]["grad_norm"] == [
        global_norm([(3.0, True)] * 2),
        global_norm([(4.0, True)] * 2),
    ]
    assert http.get("/api/runs/j-refuse").json()["status"] == "finished"
    assert [p["name"] for p in http.get("/api/runs/j-refuse/params").json()["data"]] == ["fc.weight", "fc.bias"]
    with Hook(srv.ws_url) as plain:  # a job's run takes no single-process hook
        plain.send(hello("j-refuse", name="j-refuse"))
        code, _, error = plain.refused()
    assert code == 1003 and error is not None and "is a distributed job's run" in error
    assert http.get("/api/runs/j-refuse").json()["steps"] == 1
    # a single-process run's id is no job's
    with Hook(srv.ws_url) as plain:
        plain.call(hello("j-plain"))
        plain.call(close(1))
    with Hook(srv.ws_url) as rank:
        rank.send(rank_hello("j-plain", 0, 1))
        code, _, error = rank.refused()
    assert code == 1003 and error is not None and "not a distributed job's run" in error


def test_rank_desync_is_found_when_replicas_differ_and_not_when_equal(srv: ServerProcess, http: httpx.Client) -> None:
    for job, bias1 in (("j-sync", 0.5), ("j-desync", 0.75)):
        with Hook(srv.ws_url) as r0, Hook(srv.ws_url) as r1:
            r0.call(rank_hello(job, 0, 2, **PIECES))
            r1.call(rank_hello(job, 1, 2, **REPLICA_RANK1))
            for i in range(1, 4):
                send(r0, i, i, [1.0 * i, 0.5])
                send(r1, i, i, [2.0 * i, bias1 if i >= 2 else 0.5])  # the weight's shards differ: not judged
            r0.call(close(4))
            r1.call(close(4))
        found = {f["code"]: f for f in http.get(f"/api/runs/{job}/diagnostics").json()}
        if job == "j-sync":
            assert "rank_desync" not in found
            assert r1.findings == [] and r0.findings == []
        else:
            finding = found["rank_desync"]
            assert (finding["severity"], finding["params"], finding["first_step"]) == ("error", ["fc.bias"], 2)
            assert "rank 1" in finding["message"] and "no_sync()" in finding["message"]
            assert [f["code"] for f in r1.findings] == ["rank_desync"]  # its batch completed step 2
    # the engine finds it again from the stored steps alone (a restarted server, an import)
    store = open_store(srv.db_url)
    try:
        again = Diagnostics(store, sole_writer=False).findings("j-desync", steps=3, running=True)
        assert [(f.code, f.params, f.first_step) for f in again if f.code == "rank_desync"] == [
            ("rank_desync", ("fc.bias",), 2)
        ]
    finally:
        store.close()


def digest_oracle(grad_norm: np.ndarray, grad_status: list[int]) -> str:
    """docs/protocol.md, version 2: BLAKE2b-16 of the float32 bytes, 0xFF, the uint8 codes."""
    raw = grad_norm.astype("<f4").tobytes() + b"\xff" + bytes(grad_status)
    return hashlib.blake2b(raw, digest_size=16).hexdigest()


def digest_step(seq: int, index: int, grad: np.ndarray, status: list[int]) -> dict[str, Any]:
    """A DDP replica's measured step in protocol v2: scalars and its grad_digest, no arrays."""
    return {**step(seq, index, scalars={"loss": float(index)}), "v": 2, "grad_digest": digest_oracle(grad, status)}


def test_a_replicas_digest_is_in_sync_and_one_that_differs_is_asked_for_its_arrays(
    srv: ServerProcess, http: httpx.Client
) -> None:
    """Rank 1 is a whole replica (nothing counted): a digest equal to that of rank 0's arrays is
    in sync; a differing one holds the job's step back and asks rank 1 for that step's arrays,
    and rank_desync is judged on them, exactly (fc.weight equal, fc.bias not)."""
    job, status = "j-digest", [2, 2]
    with Hook(srv.ws_url) as r0, Hook(srv.ws_url) as r1:
        r0.call(rank_hello(job, 0, 2))
        r1.call(rank_hello(job, 1, 2, counted=[False, False]))
        rank0 = {1: f32(1.0, 0.5), 2: f32(2.0, 0.5)}
        for i in (1, 2):
            r0.call(step(i, i, scalars={"loss": float(i)}, arrays={"grad_norm": rank0[i]}, grad_status=status))
        assert r1.call(digest_step(1, 1, rank0[1], status))["type"] == "ack"  # the same bits: in sync
        own = f32(2.0, 0.75)  # step 2 never synchronised fc.bias on rank 1
        r1.send(digest_step(2, 2, own, status))
        assert r1.recv() == {"type": "arrays", "steps": [2]}
        assert r1.recv()["type"] == "ack"
        assert sorted(job_steps(srv.url, job)) == [1]  # step 2 waits for rank 1's arrays
        again = step(3, 2, scalars={"loss": 2.0, "flight/resent": 1.0}, arrays={"grad_norm": own}, grad_status=status)
        assert r1.call(again)["type"] == "ack"
        stored = wait_for(lambda: (s := job_steps(srv.url, job)) and 2 in s and s)
        r0.call(close(3))
        r1.call(close(4))
    assert stored[1]["params"]["desync_ranks"] == [0.0, 0.0]  # fc.weight, fc.bias
    assert stored[2]["params"]["desync_ranks"] == [0.0, 1.0]
    assert stored[2]["scalars"]["dist/desync/r1"] == 1.0 and "dist/desync/r1" not in stored[1]["scalars"]
    found = {f["code"]: f for f in http.get(f"/api/runs/{job}/diagnostics").json()}
    assert (found["rank_desync"]["params"], found["rank_desync"]["first_step"]) == (["fc.bias"], 2)
    # a digest that is not 32 hex digits, or in a v1 step: refused, saying why; the job unharmed
    for bad, why in (({"grad_digest": "xyz"}, "grad_digest"), ({"v": 1}, '"v": 2')):
        with Hook(srv.ws_url) as r1:
            r1.call(rank_hello("j-digest-bad", 1, 2, counted=[False, False]))
            r1.send({**digest_step(1, 1, own, status), **bad})
            code, _, error = r1.refused()
        assert code == 1003 and error is not None and why in error, error
    assert sorted(job_steps(srv.url, job)) == [1, 2]


def test_a_closing_replica_is_asked_for_the_arrays_of_its_unjudged_digests_before_its_close_is_acked(
    srv: ServerProcess, http: httpx.Client
) -> None:
    """Rank 1 (a whole replica) sends its digests and closes before rank 0's steps arrive: its
    close is answered by an ask for the arrays of every step no comparison has settled, the
    close is acknowledged once they came (then their acks), and rank_desync, judged when rank
    0's steps arrive after rank 1 is gone, is exact (step 2's fc.bias differs)."""
    job, status = "j-digest-close", [2, 2]
    rank0 = {1: f32(1.0, 0.5), 2: f32(2.0, 0.5)}
    own = {1: rank0[1], 2: f32(2.0, 0.75)}
    with Hook(srv.ws_url) as r0, Hook(srv.ws_url) as r1:
        r0.call(rank_hello(job, 0, 2))
        r1.call(rank_hello(job, 1, 2, counted=[False, False]))
        for i in (1, 2):
            assert r1.call(digest_step(i, i, own[i], status))["type"] == "ack"
        r1.send(close(3))
        assert r1.recv() == {"type": "arrays", "steps": [1, 2]}  # rank 0's pieces not here yet
        for seq, i in ((4, 1), (5, 2)):
            r1.send(
                step(
                    seq,
                    i,
                    scalars={"loss": 1.0, "flight/resent": 1.0},
                    arrays={"grad_norm": own[i]},
                    grad_status=status,
                )
            )
        assert r1.recv() == {"type": "ack", "seq": 5}  # the close's, after its answers, covers them
        assert http.get(f"/api/runs/{job}.r1").json()["status"] == "finished"
        r1.ws.close()
        for i in (1, 2):
            r0.call(step(i, i, scalars={"loss": float(i)}, arrays={"grad_norm": rank0[i]}, grad_status=status))
        stored = wait_for(lambda: (s := job_steps(srv.url, job)) and 2 in s and s)
        r0.call(close(3))
    assert [stored[i]["params"]["desync_ranks"] for i in (1, 2)] == [[0.0, 0.0], [0.0, 1.0]]
    found = {f["code"]: f for f in http.get(f"/api/runs/{job}/diagnostics").json()}
    assert (found["rank_desync"]["params"], found["rank_desync"]["first_step"]) == (["fc.bias"], 2)


def test_a_replicas_digest_is_compared_across_a_server_restart_in_either_order(tmp_path: Path, db_url: str) -> None:
    """A replica's grad_digest is stored with its step (rank_steps), not only kept in the
    process's memory: a server restarted between rank 0's arrays and rank 1's differing digest,
    in either order, asks rank 1 for its arrays and finds the rank_desync (the digest once lived
    in memory only: the comparison was lost, and the step stored with a warning)."""
    status = [2, 2]
    rank0, own = f32(1.0, 0.5), f32(1.0, 0.75)  # rank 1's fc.bias never synchronised
    server = start_server(tmp_path, db_url=db_url, crash_grace_s=60, args=("--rank-timeout", "60"))
    try:
        with Hook(server.ws_url) as a0, Hook(server.ws_url) as a1, Hook(server.ws_url) as b0:
            a0.call(rank_hello("j-dr-a", 0, 2))
            a1.call(rank_hello("j-dr-a", 1, 2, counted=[False, False]))
            b0.call(rank_hello("j-dr-b", 0, 2))
            assert a1.call(digest_step(1, 1, own, status))["type"] == "ack"  # job a: the digest first
            step1 = step(1, 1, scalars={"loss": 1.0}, arrays={"grad_norm": rank0}, grad_status=status)
            assert b0.call(step1)["type"] == "ack"  # job b: rank 0's arrays first
    finally:
        server.stop()  # the hooks keep training and spooling; nothing acknowledged is resent
    server = start_server(tmp_path, db_url=db_url, crash_grace_s=60, args=("--rank-timeout", "60"))
    resent = step(2, 1, scalars={"loss": 1.0, "flight/resent": 1.0}, arrays={"grad_norm": own}, grad_status=status)
    try:
        with Hook(server.ws_url) as a0, Hook(server.ws_url) as a1:
            a1.call(rank_hello("j-dr-a", 1, 2, counted=[False, False]))
            a0.call(rank_hello("j-dr-a", 0, 2))
            assert a0.call(step1)["type"] == "ack"
            assert a1.recv() == {"type": "arrays", "steps": [1]}  # its stored digest differs
            assert a1.call(resent)["type"] == "ack"
            wait_for(lambda: 1 in job_steps(server.url, "j-dr-a"))
            a0.call(close(2))
            a1.call(close(3))
        with Hook(server.ws_url) as b0, Hook(server.ws_url) as b1:
            b0.call(rank_hello("j-dr-b", 0, 2))
            b1.call(rank_hello("j-dr-b", 1, 2, counted=[False, False]))
            b1.send(digest_step(1, 1, own, status))
            assert b1.recv() == {"type": "arrays", "steps": [1]}  # rank 0's stored arrays differ
            assert b1.recv()["type"] == "ack"
            assert b1.call(resent)["type"] == "ack"
            wait_for(lambda: 1 in job_steps(server.url, "j-dr-b"))
            b0.call(close(2))
            b1.call(close(3))
        for job in ("j-dr-a", "j-dr-b"):
            stored = job_steps(server.url, job)
            assert stored[1]["params"]["desync_ranks"] == [0.0, 1.0], job  # fc.weight, fc.bias
            found = {f["code"]: f for f in httpx.get(f"{server.url}/api/runs/{job}/diagnostics").json()}
            assert (found["rank_desync"]["params"], found["rank_desync"]["first_step"]) == (["fc.bias"], 1), job
    finally:
        server.stop()


def test_deleting_the_jobs_run_deletes_the_ranks_runs(srv: ServerProcess, http: httpx.Client) -> None:
    with Hook(srv.ws_url) as r0, Hook(srv.ws_url) as r1:
        r0.call(rank_hello("j-delete", 0, 2))
        r1.call(rank_hello("j-delete", 1, 2))
        send(r0, 1, 1, [1.0, 1.0])
        send(r1, 1, 1, [1.0, 1.0])
        r0.call(close(2))
        r1.call(close(2))
    assert http.delete("/api/runs/j-delete").status_code in (200, 204)
    for run_id in ("j-delete", "j-delete.r0", "j-delete.r1"):
        gone = http.get(f"/api/runs/{run_id}")
        assert gone.status_code == 404 and gone.json()["run"] == "deleted"
    store = open_store(srv.db_url)
    try:
        assert store.rank_runs("j-delete") == [] and partial_steps(store, "j-delete") == []
    finally:
        store.close()


def test_a_silent_rank_is_lost_after_the_timeout_and_its_steps_are_partial(quick: ServerProcess) -> None:
    with Hook(quick.ws_url) as r0, Hook(quick.ws_url) as r1:
        r0.call(rank_hello("j-lost", 0, 2))
        r1.call(rank_hello("j-lost", 1, 2))
        send(r0, 1, 1, [3.0, 3.0])
        started = time.monotonic()  # rank 1 is last heard of when its step 1 is committed
        send(r1, 1, 1, [4.0, 4.0])
        send(r0, 2, 2, [1.0, 1.0])
        send(r0, 3, 3, [2.0, 2.0])
        stored = wait_for(lambda: (s := job_steps(quick.url, "j-lost")) and len(s) == 3 and s)
        assert stored and sorted(stored) == [1, 2, 3]
        assert time.monotonic() - started >= RANK_TIMEOUT_S * 0.95  # not before rank 1 was lost
        assert [stored[s]["scalars"]["dist/ranks"] for s in (1, 2, 3)] == [2.0, 1.0, 1.0]
        assert stored[2]["params"]["grad_norm"] == [1.0, 1.0]  # rank 0's pieces only
        store = open_store(quick.db_url)
        try:
            assert partial_steps(store, "j-lost") == [(2, [1]), (3, [1])]
            assert store.lost_ranks("j-lost", RANK_TIMEOUT_S) == [1]
            assert [r.rank for r in store.rank_runs("j-lost")] == [0, 1]
        finally:
            store.close()
        send(r1, 2, 2, [5.0, 5.0])  # late: step 2 is assembled again with it, step 3 stays partial
        assert job_steps(quick.url, "j-lost.r1")[2]["params"]["grad_norm"] == [5.0, 5.0]
        again = job_steps(quick.url, "j-lost")
        both = global_norm([(1.0, True), (5.0, True)])
        assert again[2]["params"]["grad_norm"] == [both, both] and again[2]["scalars"]["dist/ranks"] == 2.0
        assert again[3] == stored[3] and again[1] == stored[1]
        store = open_store(quick.db_url)
        try:
            assert partial_steps(store, "j-lost") == [(3, [1])]
            assert store.get_run("j-lost").steps == 3  # type: ignore[union-attr]
        finally:
            store.close()
        r0.call(close(4))
        r1.call(close(3))
    status = wait_for(lambda: httpx.get(f"{quick.url}/api/runs/j-lost").json()["status"] != "running" or None)
    assert httpx.get(f"{quick.url}/api/runs/j-lost").json()["status"] == "finished", status


def test_a_rank_that_never_closes_makes_the_job_crashed(quick: ServerProcess) -> None:
    with Hook(quick.ws_url) as r0, Hook(quick.ws_url) as r1:
        r0.call(rank_hello("j-crash", 0, 2))
        r1.call(rank_hello("j-crash", 1, 2))
        send(r0, 1, 1, [1.0, 1.0])
        send(r1, 1, 1, [1.0, 1.0])
        send(r1, 2, 2, [1.0, 1.0])
        r0.call(close(2))
    # rank 1 went away without `close`: after the crash grace its run is crashed, and so the job
    run = wait_for(lambda: (r := httpx.get(f"{quick.url}/api/runs/j-crash").json())["status"] != "running" and r)
    assert run and run["status"] == "crashed"
    assert httpx.get(f"{quick.url}/api/runs/j-crash.r1").json()["status"] == "crashed"
    assert sorted(job_steps(quick.url, "j-crash")) == [1, 2]  # rank 1's last step, assembled without rank 0


def test_ranks_on_two_servers_of_one_postgresql_database_assemble_each_step_once(
    request: pytest.FixtureRequest, postgres: object, tmp_path: Path
) -> None:
    """Two `gradwatch serve` processes on one database, a rank on each: the lock on the job's row
    makes their assemblies take turns."""
    with new_database(request, "postgresql", tmp_path) as url:
        (tmp_path / "a").mkdir()
        (tmp_path / "b").mkdir()
        a = start_server(tmp_path / "a", db_url=url)
        b = start_server(tmp_path / "b", db_url=url)
        try:
            count = 40
            with Hook(a.ws_url) as r0, Hook(b.ws_url) as r1:
                r0.call(rank_hello("j-two", 0, 2))
                r1.call(rank_hello("j-two", 1, 2))
                for i in range(1, count + 1):  # both ranks' batches commit at about the same time
                    r0.send(step(i, i, arrays={"grad_norm": f32(i, 1.0)}))
                    r1.send(step(i, i, arrays={"grad_norm": f32(i, 2.0)}))
                for hook in (r0, r1):  # an ack covers every seq up to it
                    while hook.recv()["seq"] < count:
                        pass
                r0.call(close(count + 1))
                r1.call(close(count + 1))
            run = wait_for(lambda: (r := httpx.get(f"{a.url}/api/runs/j-two").json())["status"] == "finished" and r)
            assert run and run["steps"] == count
            stored = job_steps(a.url, "j-two")
            assert sorted(stored) == list(range(1, count + 1))
            assert [s["seq"] for s in stored.values()] == list(range(1, count + 1))
            assert all(
                s["params"]["grad_norm"] == [global_norm([(i, True)] * 2), global_norm([(1.0, True), (2.0, True)])]
                for i, s in stored.items()
            )
        finally:
            a.stop()
            b.stop()


def test_grad_norm_total_of_a_job_step_is_infinite_with_an_infinite_gradient_and_nan_with_a_nan(
    srv: ServerProcess, http: httpx.Client
) -> None:
    """As the hook's own total: the global grad_norm's entries squared and added, so an infinite
    local norm makes it infinite, a NaN makes it NaN (the ranks' own totals are not used)."""
    with Hook(srv.ws_url) as r0, Hook(srv.ws_url) as r1:
        r0.call(rank_hello("j-inf", 0, 2, **PIECES))
        r1.call(rank_hello("j-inf", 1, 2, **PIECES))
        send(r0, 1, 1, [math.inf, 3.0], [3, 2], grad_norm_total=0.0)
        send(r1, 1, 1, [1.0, 4.0], grad_norm_total=0.0)
        send(r0, 2, 2, [math.nan, math.inf], [3, 3], grad_norm_total=0.0)
        send(r1, 2, 2, [1.0, 4.0], grad_norm_total=0.0)
        send(r0, 3, 3, [1.0, 2.0], grad_norm_total=0.0)
        send(r1, 3, 3, [2.0, 4.0], grad_norm_total=0.0)
        r0.call(close(4))
        r1.call(close(4))
    stored = job_steps(srv.url, "j-inf")
    totals = [stored[s]["scalars"]["grad_norm_total"] for s in (1, 2, 3)]
    assert totals[:2] == ["Infinity", "NaN"], totals  # the JSON export's spelling (docs/api.md)
    assert totals[2] == pytest.approx(math.sqrt(1 + 4 + 4 + 16), rel=1e-6)


def send_cheap(hook: Hook, seq: int, index: int, **scalars: float) -> dict[str, Any]:
    """An unmeasured step (not sampled on this rank): cheap facts only, no grad_status nor norms."""
    return hook.call(
        step(
            seq,
            index,
            scalars={"loss": float(index), **{k.replace("__", "/"): v for k, v in scalars.items()}},
            arrays={"backward_passes": f32(1.0, 1.0)},
        )
    )


def test_a_step_a_rank_holding_counted_pieces_did_not_measure_is_stored_unmeasured(
    srv: ServerProcess, http: httpx.Client
) -> None:
    """Each rank's every="auto" samples alone: at step 1 only rank 0 measured, at step 2 only
    rank 1, at step 3 both. Both ranks' pieces count (FSDP), so steps 1 and 2 are unmeasured
    job steps (cheap facts only), and step 3 has the global norms."""
    with Hook(srv.ws_url) as r0, Hook(srv.ws_url) as r1:
        r0.call(rank_hello("j-sampled", 0, 2, **PIECES))
        r1.call(rank_hello("j-sampled", 1, 2, **PIECES))
        send(r0, 1, 1, [3.0, 4.0], grad_norm_total=5.0, mem__params_bytes=10)
        send_cheap(r1, 1, 1, mem__params_bytes=10)
        send_cheap(r0, 2, 2, mem__params_bytes=10)
        send(r1, 2, 2, [3.0, 4.0], grad_norm_total=5.0, mem__params_bytes=10)
        send(r0, 3, 3, [3.0, 4.0], grad_norm_total=5.0)
        send(r1, 3, 3, [4.0, 3.0], grad_norm_total=5.0)
        r0.call(close(4))
        r1.call(close(4))
    stored = job_steps(srv.url, "j-sampled")
    for index in (1, 2):
        got = stored[index]
        assert sorted(got["params"]) == ["backward_passes"], got["params"]
        assert got["grad_status"] is None
        assert "grad_norm_total" not in got["scalars"]
        assert got["scalars"]["mem/params_bytes"] == 20.0 and got["scalars"]["dist/ranks"] == 2.0
    weight = global_norm([(3.0, True), (4.0, True)])
    assert stored[3]["params"]["grad_norm"] == [weight, weight]
    assert stored[3]["grad_status"] == [2, 2]
    assert stored[3]["scalars"]["grad_norm_total"] == pytest.approx(math.sqrt(2) * weight, rel=1e-6)
    # the dashboard's gradient series have only the measured step
    series = http.get("/api/runs/j-sampled/series", params={"key": "grad_norm_total"}).json()
    assert series["step"] == [3]


def test_ddp_steps_are_measured_when_rank_0_measured_them(srv: ServerProcess, http: httpx.Client) -> None:
    """DDP: every piece counts on rank 0 only, so rank 0 measuring a step is enough; a step rank 0
    did not measure is unmeasured even where rank 1 measured it."""
    with Hook(srv.ws_url) as r0, Hook(srv.ws_url) as r1:
        r0.call(rank_hello("j-ddp-auto", 0, 2, local_numel=[6, 3], counted=[True, True]))
        r1.call(rank_hello("j-ddp-auto", 1, 2, local_numel=[6, 3], counted=[False, False]))
        send(r0, 1, 1, [3.0, 4.0], grad_norm_total=5.0)
        send_cheap(r1, 1, 1)
        send_cheap(r0, 2, 2)
        send(r1, 2, 2, [3.0, 4.0], grad_norm_total=5.0)
        r0.call(close(3))
        r1.call(close(3))
    stored = job_steps(srv.url, "j-ddp-auto")
    assert stored[1]["params"]["grad_norm"] == [3.0, 4.0] and stored[1]["grad_status"] == [2, 2]
    assert stored[1]["scalars"]["grad_norm_total"] == 5.0
    assert sorted(stored[2]["params"]) == ["backward_passes"] and stored[2]["grad_status"] is None
    assert "grad_norm_total" not in stored[2]["scalars"]


def test_the_timer_looking_for_lost_ranks_never_spins(tmp_path: Path) -> None:
    """A quarter of the rank timeout, at least 0.05 s (and at most 5 s) between two looks."""
    store = open_store(f"sqlite:///{tmp_path / 'x.db'}")
    try:
        for timeout, interval in ((0.1, 0.05), (1e-9, 0.05), (1.0, 0.25), (30.0, 5.0)):
            assert JobAssembler(store, LiveHub(8), Diagnostics(store), timeout).interval_s == interval
    finally:
        store.close()


def test_the_timer_rests_while_no_job_runs_and_a_hello_wakes_it(tmp_path: Path) -> None:
    """A sole writer's timer reads the running jobs once, finds none, and reads them no more
    until a hello: the statements SQLite receives say how often it looked."""
    store = open_store(f"sqlite:///{tmp_path / 'x.db'}")
    looks: list[str] = []

    def heard(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        sql = " ".join(statement.split())
        if sql.startswith("SELECT runs.id FROM runs WHERE runs.status = ") and "runs.kind" in sql:
            looks.append(sql)

    event.listen(store.engine, "before_cursor_execute", heard)

    async def scenario() -> list[int]:
        jobs = JobAssembler(store, LiveHub(8), Diagnostics(store), 0.2)  # a look every 0.05 s
        counts = []
        jobs.start()
        try:
            await asyncio.sleep(0.5)
            counts.append(len(looks))
            await asyncio.sleep(0.5)
            counts.append(len(looks))
            with jobs.admitting():  # a hello, which may open a job
                pass
            await asyncio.sleep(0.5)
            counts.append(len(looks))
            await asyncio.sleep(0.5)
            counts.append(len(looks))
        finally:
            await jobs.close()
        return counts

    try:
        assert asyncio.run(scenario()) == [1, 1, 2, 2]
    finally:
        store.close()


def test_a_server_down_longer_than_the_rank_timeout_loses_no_rank(tmp_path: Path, db_url: str) -> None:
    """Nothing is written while the server is down, so after a restart every rank looks silent
    since before the outage: each still gets a full --rank-timeout from the restart to come back
    and replay its spool, and the replayed steps are whole."""
    timeout = ("--rank-timeout", "2")
    server = start_server(tmp_path, db_url=db_url, crash_grace_s=60, args=timeout)
    try:
        with Hook(server.ws_url) as r0, Hook(server.ws_url) as r1:
            r0.call(rank_hello("j-restart", 0, 2))
            r1.call(rank_hello("j-restart", 1, 2))
            send(r0, 1, 1, [3.0, 3.0])
            send(r1, 1, 1, [4.0, 4.0])
            heard = time.monotonic()  # both ranks were last heard of by now
    finally:
        server.stop()  # both hooks would keep training and spooling
    # silent longer than --rank-timeout by the clock (the stop counts, and the restart adds its own)
    time.sleep(max(0.0, heard + 2.25 - time.monotonic()))
    server = start_server(tmp_path, db_url=db_url, crash_grace_s=60, args=timeout)
    try:
        with Hook(server.ws_url) as r0, Hook(server.ws_url) as r1:
            r0.call(rank_hello("j-restart", 0, 2))  # rank 0 comes back first and replays 2, 3
            send(r0, 2, 2, [3.0, 3.0])
            send(r0, 3, 3, [3.0, 3.0])
            time.sleep(0.5)  # at least one look of the lost-rank timer (every 0.5 s)
            r1.call(rank_hello("j-restart", 1, 2))
            send(r1, 2, 2, [4.0, 4.0])
            send(r1, 3, 3, [4.0, 4.0])
            r0.call(close(4))
            r1.call(close(4))
        run = wait_for(lambda: (r := httpx.get(f"{server.url}/api/runs/j-restart").json())["status"] != "running" and r)
        assert run and run["status"] == "finished" and run["steps"] == 3
        stored = job_steps(server.url, "j-restart")
        both = global_norm([(3.0, True), (4.0, True)])
        assert [stored[s]["scalars"]["dist/ranks"] for s in (1, 2, 3)] == [2.0, 2.0, 2.0]
        assert all(stored[s]["params"]["grad_norm"] == [both, both] for s in (1, 2, 3))
        ranks = httpx.get(f"{server.url}/api/runs/j-restart/ranks").json()
        assert ranks["partial"] == {"steps": 0, "ranges": []}
        assert [r["lost"] for r in ranks["ranks"]] == [False, False]
    finally:
        server.stop()


def test_a_disconnected_rank_is_waited_for_the_rank_timeout_not_the_crash_grace(tmp_path: Path, db_url: str) -> None:
    """A rank whose connection dropped (a network blip, a restarting hook) is marked crashed only
    after --rank-timeout, however short the crash grace: the job's steps wait for it meanwhile."""
    server = start_server(tmp_path, db_url=db_url, crash_grace_s=0.2, args=("--rank-timeout", "4"))
    try:
        # a rank that stays away is marked crashed once --rank-timeout has passed: j-gone's rank 1
        # goes first, and its four seconds pass while j-blip's rank comes back (the same server)
        with Hook(server.ws_url) as g0, Hook(server.ws_url) as g1:
            g0.call(rank_hello("j-gone", 0, 2))
            g1.call(rank_hello("j-gone", 1, 2))
            send(g1, 1, 1, [4.0, 4.0])
            g1.ws.close()  # gone without a close
            gone = time.monotonic()
            with Hook(server.ws_url) as r0:
                r0.call(rank_hello("j-blip", 0, 2))
                with Hook(server.ws_url) as r1:
                    r1.call(rank_hello("j-blip", 1, 2))
                    send(r0, 1, 1, [3.0, 3.0])
                    send(r1, 1, 1, [4.0, 4.0])
                # rank 1's connection is gone, without a close
                send(r0, 2, 2, [3.0, 3.0])
                send(r0, 3, 3, [3.0, 3.0])
                time.sleep(1.5)  # the crash grace many times over, and the timer's looks (every 1 s)
                assert httpx.get(f"{server.url}/api/runs/j-blip.r1").json()["status"] == "running"
                assert httpx.get(f"{server.url}/api/runs/j-blip").json()["steps"] == 1
                with Hook(server.ws_url) as r1:
                    assert r1.call(rank_hello("j-blip", 1, 2))["last_seq"] == 1
                    send(r1, 2, 2, [4.0, 4.0])
                    send(r1, 3, 3, [4.0, 4.0])
                    r1.call(close(4))
                r0.call(close(4))
            stored = job_steps(server.url, "j-blip")
            assert [stored[s]["scalars"]["dist/ranks"] for s in (1, 2, 3)] == [2.0, 2.0, 2.0]
            assert httpx.get(f"{server.url}/api/runs/j-blip/ranks").json()["partial"]["steps"] == 0
            crashed = wait_for(
                lambda: httpx.get(f"{server.url}/api/runs/j-gone.r1").json()["status"] == "crashed", timeout=30
            )
            assert crashed and time.monotonic() - gone >= 4.0 * 0.95
            g0.call(close(1))
    finally:
        server.stop()


def test_a_job_whose_other_ranks_never_said_hello_finishes_with_partial_steps(quick: ServerProcess) -> None:
    """watch() called on rank 0 only of a job of two: rank 1 never reaches the server. Once rank 0
    finished and rank 1 was not seen for --rank-timeout, the job is finished (every rank that
    connected finished), its steps partial without rank 1, and the ranks endpoint lists rank 0
    only (the dashboard names rank 1 as never reached)."""
    started = time.monotonic()
    with Hook(quick.ws_url) as r0:
        r0.call(rank_hello("j-alone", 0, 2))
        for i in (1, 2, 3):
            send(r0, i, i, [3.0, 4.0])
        r0.call(close(4))
    # the same with no step at all (nobody is ahead of rank 1, and still the job ends): its wait
    # for rank 1 runs alongside j-alone's
    with Hook(quick.ws_url) as r0:
        r0.call(rank_hello("j-alone-empty", 0, 2))
        r0.call(close(1))
    run = wait_for(lambda: (r := httpx.get(f"{quick.url}/api/runs/j-alone").json())["status"] != "running" and r)
    assert time.monotonic() - started >= RANK_TIMEOUT_S * 0.95  # rank 1 was waited for first
    assert run and (run["status"], run["steps"]) == ("finished", 3)
    ranks = httpx.get(f"{quick.url}/api/runs/j-alone/ranks").json()
    assert ranks["world_size"] == 2
    assert [(r["rank"], r["status"], r["lost"]) for r in ranks["ranks"]] == [(0, "finished", False)]
    assert ranks["partial"] == {"steps": 3, "ranges": [{"first": 1, "last": 3, "missing": [1]}]}
    assert [s["scalars"]["dist/ranks"] for s in job_steps(quick.url, "j-alone").values()] == [1.0] * 3
    run = wait_for(lambda: (r := httpx.get(f"{quick.url}/api/runs/j-alone-empty").json())["status"] != "running" and r)
    assert run and (run["status"], run["steps"]) == ("finished", 0)


def test_the_assembler_keeps_nothing_of_a_job_once_settled_or_deleted(tmp_path: Path) -> None:
    """Its per-job state (lock, when first seen, findings told) lives while the job runs: a
    finished job, a deleted one, and one settled by another worker (found by the timer) leave
    nothing behind, however many jobs a long-lived server sees."""
    url = f"sqlite:///{tmp_path / 'x.db'}"
    with in_process_server(url, rank_timeout_s=0.4) as server, server.client() as http:
        jobs = server.app.state.jobs

        def held() -> frozenset[str]:
            found: frozenset[str] = server.portal.call(jobs.held)
            return found

        for job in [f"j-mem{n}" for n in range(5)]:
            with server.hook() as r0, server.hook() as r1:
                r0.call(rank_hello(job, 0, 2))
                r1.call(rank_hello(job, 1, 2))
                assert wait_for(lambda name=job: name in held())
                for i in (1, 2):
                    send(r0, i, i, [1.0, 2.0], [0, 2])  # a parameter without gradient: a finding
                    send(r1, i, i, [1.0, 2.0], [0, 2])
                r0.call(close(3))
                r1.call(close(3))
            assert http.get(f"/api/runs/{job}").json()["status"] == "finished"
        assert wait_for(lambda: held() == frozenset())  # the last assembly ends after the status
        with server.hook() as r0, server.hook() as r1:
            r0.call(rank_hello("j-deleted", 0, 2))
            r1.call(rank_hello("j-deleted", 1, 2))
            send(r0, 1, 1, [1.0, 2.0])
            send(r1, 1, 1, [1.0, 2.0])
            assert held() == {"j-deleted"}
            assert http.delete("/api/runs/j-deleted").status_code == 204
            # an assembly under way at the deletion (the steps just sent) keeps the state until
            # it ends, then lets it go
            assert wait_for(lambda: held() == frozenset())
            # what was under way at the deletion (a rank's frame heard, its batch's assembly)
            # brings nothing back
            server.portal.call(jobs.hear, "j-deleted", 0)
            assert server.portal.call(jobs.assemble, "j-deleted") is None
            assert held() == frozenset()
        with server.hook() as r0, server.hook() as r1:
            r0.call(rank_hello("j-elsewhere", 0, 2))
            r1.call(rank_hello("j-elsewhere", 1, 2))
            assert wait_for(lambda: held() == {"j-elsewhere"})
            other = open_store(url)  # another worker marks the job crashed
            try:
                assert other.mark_crashed("j-elsewhere", time.time() + 1)
            finally:
                other.close()
            assert wait_for(lambda: held() == frozenset(), timeout=10)


def test_a_rank_queued_behind_the_writer_or_its_admission_is_not_lost(tmp_path: Path) -> None:
    """Lost means silent, not slow. While the server's writer is busy (held here, as by a crowd's
    hellos or another rank's large batch), rank 1's step and rank 2's hello wait on it for three
    times `--rank-timeout`, with rank 0 ahead: neither is lost (GET /ranks, while they wait), and
    once the writer is free the job's steps are assembled from all three ranks, none partial."""
    timeout = 0.4
    url = f"sqlite:///{tmp_path / 'x.db'}"
    with in_process_server(url, rank_timeout_s=timeout) as server, server.client() as http:
        store = server.app.state.store
        with server.hook() as r0, server.hook() as r1, server.hook() as r2:
            r0.call(rank_hello("j-queued", 0, 3))
            r1.call(rank_hello("j-queued", 1, 3))
            for i in (1, 2):
                send(r0, i, i, [1.0, 2.0])
            send(r1, 1, 1, [1.0, 2.0])
            with store._write_lock:  # the writer is busy (SQLite's writers take turns on this lock)
                r1.send(step(2, 2, scalars={"loss": 2.0}, arrays={"grad_norm": f32(1, 2), "param_norm": f32(2, 3)}))
                r2.send(rank_hello("j-queued", 2, 3))
                # the rank waits from when the server has read its frame (a busy test process can
                # hold the server's event loop back from reading it): then three rank timeouts
                memory = server.app.state.jobs.memory("j-queued")
                assert wait_for(lambda: memory.heard.last(1, math.inf) == math.inf, timeout=30)
                time.sleep(3 * timeout)
                ranks = http.get("/api/runs/j-queued/ranks").json()["ranks"]
                assert [(r["rank"], r["lost"]) for r in ranks] == [(0, False), (1, False)]
            assert r1.recv()["type"] == "ack"
            assert r2.recv()["type"] == "welcome"
            for i in (1, 2):
                send(r2, i, i, [1.0, 2.0])
            stored = wait_for(lambda: (s := job_steps_in(http, "j-queued")) and len(s) == 2 and s)
            assert stored and [stored[s]["scalars"]["dist/ranks"] for s in (1, 2)] == [3.0, 3.0]
            assert partial_steps(store, "j-queued") == []
            assert [r["lost"] for r in http.get("/api/runs/j-queued/ranks").json()["ranks"]] == [False] * 3


def job_steps_in(http: httpx.Client, run_id: str) -> dict[int, dict[str, Any]]:
    lines = http.get(f"/api/runs/{run_id}/export", params={"format": "json"}).text
    return {d["step"]: d for d in map(json.loads, lines.splitlines()) if d["type"] == "step" and d.get("rank") is None}


def test_a_jobs_first_step_and_its_ranks_closes_assemble_once_not_once_per_rank(tmp_path: Path) -> None:
    """An assembly reads every rank (its runs, their new steps): one per global step, not one per
    rank's frame. A job's first step used to be assembled once per rank's first frame (the job's
    last step was unknown until the first assembly) and every rank's close ran one: quadratic
    in the ranks at a job's start and end. Here 12 ranks send 3 steps and close: the assemblies
    (counted by their read of the job's ranks) are the 3 steps', the last close's, and the
    timer's (one per `interval_s`); the job is finished, every step whole."""
    ranks, steps = 12, 3
    url = f"sqlite:///{tmp_path / 'x.db'}"
    with in_process_server(url, rank_timeout_s=20.0) as server, server.client() as http:
        store = server.app.state.store
        assemblies: list[str] = []

        def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            if statement.startswith("SELECT runs.id, runs.rank, runs.status, runs.last_step, runs.updated_at"):
                assemblies.append(statement)

        with contextlib.ExitStack() as stack:
            hooks = [stack.enter_context(server.hook()) for _ in range(ranks)]
            for rank, hook in enumerate(hooks):
                assert hook.call(rank_hello("j-once", rank, ranks))["type"] == "welcome"
            event.listen(store.engine, "before_cursor_execute", count)
            started = time.monotonic()
            for i in range(1, steps + 1):
                for hook in hooks:
                    assert send(hook, i, i, [1.0, 2.0])["type"] == "ack"
            for hook in hooks:
                assert hook.call(close(steps + 1))["type"] == "ack"
            elapsed = time.monotonic() - started
        event.remove(store.engine, "before_cursor_execute", count)
        assert http.get("/api/runs/j-once").json()["status"] == "finished"
        stored = job_steps_in(http, "j-once")
        assert [stored[s]["scalars"]["dist/ranks"] for s in range(1, steps + 1)] == [float(ranks)] * steps
        timer = int(elapsed / server.app.state.jobs.interval_s) + 1
        assert steps + 1 <= len(assemblies) <= steps + 1 + timer < ranks


def test_a_closing_ranks_wait_for_its_jobs_step_ends_when_the_step_is_stored_or_the_job_settled_elsewhere(
    tmp_path: Path,
) -> None:
    """A rank's close is acked once the job's run holds the rank's last step: the close waits on
    the assembler (no poll), and the assembly that stores the step wakes it; its ack comes with
    that step stored. A job settled by another worker (here another store on the same file marks
    it crashed) wakes nothing here: the wait still ends, the job's run read from the store."""
    url = f"sqlite:///{tmp_path / 'x.db'}"
    with in_process_server(url, rank_timeout_s=60.0) as server, server.client() as http:
        jobs = server.app.state.jobs
        with server.hook() as r0, server.hook() as r1:
            r0.call(rank_hello("j-wake", 0, 2))
            r1.call(rank_hello("j-wake", 1, 2))
            send(r0, 1, 1, [1.0, 2.0])
            r0.send(close(2))
            assert wait_for(lambda: server.portal.call(jobs.waiting, "j-wake") == 1)
            assert send(r1, 1, 1, [3.0, 4.0])["type"] == "ack"
            assert r0.recv() == {"type": "ack", "seq": 2}
            stored = job_steps_in(http, "j-wake")
            assert stored[1]["scalars"]["dist/ranks"] == 2.0
            assert server.portal.call(jobs.waiting, "j-wake") == 0
        with server.hook() as r0, server.hook() as r1:
            r0.call(rank_hello("j-elsewhere", 0, 2))
            r1.call(rank_hello("j-elsewhere", 1, 2))
            send(r0, 1, 1, [1.0, 2.0])
            r0.send(close(2))
            assert wait_for(lambda: server.portal.call(jobs.waiting, "j-elsewhere") == 1)
            other = open_store(url)  # another worker marks the job crashed
            try:
                assert other.mark_crashed("j-elsewhere", time.time() + 1)
            finally:
                other.close()
            assert r0.recv() == {"type": "ack", "seq": 2}
            assert http.get("/api/runs/j-elsewhere").json()["status"] == "crashed"


def test_frames_committed_while_a_jobs_assembly_waits_join_it(tmp_path: Path) -> None:
    """A worker of `serve --workers N` cannot tell from memory whether the ranks on the other
    workers have a step (here rank 4, not connected to this server), so every rank's frame asks
    for an assembly that reads every rank. Those committed while one waits for the job's lock
    (held here, as by the assembly before it) join it: 4 frames, 1 assembly (counted by its read
    of the job's ranks), each frame acknowledged; the step is assembled whole once rank 4 sends
    it, its norms exact (oracle: the square root of the sum of the counted squared pieces)."""
    ranks, here = 5, 4
    url = f"sqlite:///{tmp_path / 'x.db'}"
    with in_process_server(url, rank_timeout_s=20.0) as server, server.client() as http:
        store, jobs = server.app.state.store, server.app.state.jobs
        assemblies: list[str] = []

        def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            if statement.startswith("SELECT runs.id, runs.rank, runs.status, runs.last_step, runs.updated_at"):
                assemblies.append(statement)

        with contextlib.ExitStack() as stack:
            hooks = [stack.enter_context(server.hook()) for _ in range(ranks)]
            for rank, hook in enumerate(hooks[:here]):
                assert hook.call(rank_hello("j-join", rank, ranks, **PIECES))["type"] == "welcome"
            state = jobs._jobs["j-join"]
            server.portal.call(state.lock.acquire)
            event.listen(store.engine, "before_cursor_execute", count)
            try:
                for rank, hook in enumerate(hooks[:here]):
                    hook.send(step(1, 1, arrays={"grad_norm": f32(rank + 1.0, 2.0)}))
                assert wait_for(lambda: state.waiting is not None and len(state.waiting.late) == here)
            finally:
                server.portal.call(state.lock.release)
            assert [hook.recv()["type"] for hook in hooks[:here]] == ["ack"] * here
            event.remove(store.engine, "before_cursor_execute", count)
            assert len(assemblies) == 1
            assert job_steps_in(http, "j-join") == {}  # rank 4 has not sent step 1
            assert hooks[here].call(rank_hello("j-join", here, ranks, **PIECES))["type"] == "welcome"
            assert hooks[here].call(step(1, 1, arrays={"grad_norm": f32(here + 1.0, 2.0)}))["type"] == "ack"
            stored = wait_for(lambda: job_steps_in(http, "j-join"))
        assert list(stored) == [1] and stored[1]["scalars"]["dist/ranks"] == ranks
        assert stored[1]["params"]["grad_norm"] == [
            global_norm([(r + 1.0, True) for r in range(ranks)]),
            global_norm([(2.0, True)] * ranks),
        ]
        assert partial_steps(store, "j-join") == []

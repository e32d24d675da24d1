"""A distributed job is one run: every rank of a real gloo job (tests/support/dist.py) watches,
the ranks agree on the job's id once at watch() (c10d store, or torchrun's environment), each
streams as `JOB.rR` with `dist` in its hello and its own spool file, sends its step times, and
the hook makes no collective of its own. No server is reachable here: what each rank sent is read
back from its sender (tests/support/sent.py) and from its spool file."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import re
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
import torch.distributed as dist
from torch import nn

import gradwatch
from gradwatch import distributed
from gradwatch.sampling import AutoInterval
from gradwatch.spool import pending_spools, read_records
from gradwatch_server import protocol
from support.collectives import GRADWATCH_DIR, count_collectives
from support.dist import run_ranks
from support.distruns import wait_for
from support.sent import measured, sent_steps
from support.server import find_free_port, start_server

pytestmark = pytest.mark.unit  # a test that starts a server says so (@pytest.mark.server)

NOWHERE = "http://127.0.0.1:9"
STEPS = 4
#: rank 1 sleeps this long before each forward pass: the straggler
STRAGGLE_S = 0.2


def ddp_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)))


def hello_of(w: gradwatch.Watcher) -> dict[str, Any]:
    return json.loads(json.dumps(w._sender.hello))


def spool_records(path: Path) -> list[dict[str, Any]]:
    records, _ = read_records(path)
    return [json.loads(text) for text in records]


# -- the job: one run, a stream per rank ------------------------------------------------------
def watched_ddp_job(rank: int, world_size: int) -> dict[str, Any]:
    model = ddp_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w = gradwatch.watch(opt, model=model.module, run="ddp-job", project="dist", server=NOWHERE, warn=False)
    ends, backward_calls = [time.perf_counter()], []
    g = torch.Generator().manual_seed(rank)
    for _ in range(STEPS):
        if rank == 1:
            time.sleep(STRAGGLE_S)
        loss = model(torch.randn(8, 4, generator=g)).square().mean()
        backward_calls.append(time.perf_counter())
        loss.backward()
        opt.step()
        ends.append(time.perf_counter())
        opt.zero_grad()
    steps = sent_steps(w)
    w.close(timeout=0.1)  # no server: what was sent stays in the spool
    if rank == 1:  # its own default name would be a later second's
        time.sleep(1.1)
    again = gradwatch.watch(opt, model=model.module, server=NOWHERE, warn=False)
    again.close(timeout=0.1)
    dist.barrier()  # rank 0 holds the store: it stays until rank 1 has read the second job's id
    return {
        "run_id": w.run_id,
        "url": w.url,
        "hello": hello_of(w),
        "steps": [{"step": m["step"], "scalars": m["scalars"]} for m in steps],
        "ends": ends,
        "backward_calls": backward_calls,
        "again": (again.run_id, hello_of(again)),
    }


def test_a_ddp_job_is_one_run_with_a_stream_per_rank(spool_dir: Path) -> None:
    ranks = run_ranks(watched_ddp_job, world_size=2)
    job = ranks[0]["run_id"]
    assert distributed.JOB_ID.match(job)
    for rank, out in enumerate(ranks):
        assert out["run_id"] == job, "every rank's run id is the job's"
        assert out["url"] == f"{NOWHERE}/runs/{job}", "the page the user is shown is the job's"
        hello = out["hello"]
        assert hello["dist"] == {"job": job, "rank": rank, "world_size": 2}
        assert hello["run"]["id"] == f"{job}.r{rank}"
        assert (hello["run"]["name"], hello["run"]["project"]) == ("ddp-job", "dist")
        assert hello["run"]["config"]["dist"] == {"backend": "gloo", "local_rank": rank, "meshes": []}
        assert [p["name"] for p in hello["params"]] == ["0.weight", "0.bias", "2.weight", "2.bias"]
        assert [p["counted"] for p in hello["params"]] == [rank == 0] * 4, "the layout has the agreed rank"
        assert [m["step"] for m in out["steps"]] == list(range(1, STEPS + 1))
    # a second watch() in the same job is a second run, with an id the ranks again agree on
    again = [out["again"] for out in ranks]
    assert again[0][0] == again[1][0] != job
    assert [hello["run"]["id"] for _, hello in again] == [f"{again[0][0]}.r0", f"{again[0][0]}.r1"]
    names = [hello["run"]["name"] for _, hello in again]
    assert names[0] == names[1] and re.match(r"^run-\d{8}-\d{6}$", names[0]), "rank 0's default name on every rank"

    # each rank's own spool file, named by its stream id, the dist hello first
    files = {p.name for p in pending_spools(spool_dir)}
    assert files == {f"{j}.r{r}.spool" for j in (job, again[0][0]) for r in (0, 1)}
    for rank in (0, 1):
        records = spool_records(spool_dir / f"{job}.r{rank}.spool")
        assert records[0] == ranks[rank]["hello"]
        assert sorted({s for m in records[1:] if m["type"] != "close" for s in _steps(m)}) == list(range(1, STEPS + 1))
        assert records[-1]["type"] == "close"


def _steps(message: dict[str, Any]) -> list[int]:
    return message["step"] if isinstance(message["step"], list) else [message["step"]]


@pytest.mark.timed
def test_every_rank_sends_its_step_times_and_the_straggler_shows(spool_dir: Path) -> None:
    ranks = run_ranks(watched_ddp_job, world_size=2)
    for rank, out in enumerate(ranks):
        ends, calls = out["ends"], out["backward_calls"]
        for k, m in enumerate(out["steps"]):
            step_s, before = m["scalars"]["time/step_s"], m["scalars"]["time/before_backward_s"]
            assert 0 < before <= step_s, (rank, m["step"])
            # the loop's own clock: the step's time is between two optimizer.step() returns, the
            # first gradient comes after backward() was called
            assert step_s == pytest.approx(ends[k + 1] - ends[k], abs=0.05), (rank, m["step"])
            assert before >= calls[k] - ends[k] - 0.005, (rank, m["step"])
            if rank == 1:
                assert before >= STRAGGLE_S, m["step"]
    fast, slow = ([m["scalars"] for m in out["steps"]] for out in ranks)
    # rank 0 is quick to its backward, then waits there for rank 1: its step is as long
    assert statistics.median(s["time/before_backward_s"] for s in fast) < STRAGGLE_S / 2
    assert statistics.median(s["time/step_s"] for s in fast[1:]) > STRAGGLE_S / 2
    assert statistics.median(s["time/before_backward_s"] for s in slow) >= STRAGGLE_S


# -- replay: each rank's spool, by gradwatch-sync, into one run -------------------------------
def offline_ddp_job(rank: int, world_size: int, server: str) -> str:
    model = ddp_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w = gradwatch.watch(opt, model=model.module, run="offline-job", server=server, warn=False)
    for _ in range(STEPS):
        model(torch.randn(8, 4)).square().mean().backward()
        opt.step()
        opt.zero_grad()
    w.close(timeout=0.3)
    return w.run_id


@pytest.mark.server
def test_gradwatch_sync_replays_each_ranks_spool_into_one_run(tmp_path: Path, spool_dir: Path) -> None:
    if "dist" not in protocol.Hello.model_fields:
        pytest.skip("this server does not take distributed jobs yet (its hello has no dist)")
    url = f"http://127.0.0.1:{find_free_port()}"
    job = run_ranks(offline_ddp_job, world_size=2, args=(url,))[0]
    spools = [f"{job}.r0.spool", f"{job}.r1.spool"]
    # Both ranks' processes are reaped here and each closed its spool, but on a loaded machine a
    # spool can still read as locked for a moment: listed again for a while, and if a lock
    # outlives its run, the message says which process holds it.
    try:
        wait_for("both ranks' spools pending", lambda: sorted(p.name for p in pending_spools(spool_dir)) == spools, 10)
    except AssertionError as exc:
        present = sorted(p.name for p in spool_dir.glob("*.spool"))
        raise AssertionError(f"{exc}; files {present}; /proc/locks:\n{Path('/proc/locks').read_text()}") from None
    server = start_server(tmp_path, port=int(url.rsplit(":", 1)[1]))
    try:
        done = subprocess.run(
            [sys.executable, "-m", "gradwatch", "sync", "--server", url], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stdout + done.stderr
        for rank in (0, 1):
            assert re.search(rf"run {job}\.r{rank}: \d+ messages delivered", done.stdout), done.stdout
        assert not list(spool_dir.glob("*.spool"))
        with httpx.Client(base_url=url, timeout=30) as http:
            run = http.get(f"/api/runs/{job}").json()
            assert (run["name"], run["world_size"], run["steps"], run["status"]) == (
                "offline-job",
                2,
                STEPS,
                "finished",
            )
            for rank in (0, 1):  # each rank's stream is a run of its own, under the job's
                child = http.get(f"/api/runs/{job}.r{rank}").json()
                assert (child["parent_id"], child["rank"], child["steps"]) == (job, rank, STEPS), child
            assert [r["id"] for r in http.get("/api/runs").json()["data"]] == [job]
            for key in ("time/step_s", "time/before_backward_s"):  # the job's slowest rank's, per step
                values = http.get(f"/api/runs/{job}/series", params={"key": key}).json()["value"]
                assert len(values) == STEPS and all(v > 0 for v in values), (key, values)
    finally:
        server.stop()


# -- no collective ----------------------------------------------------------------------------
def fsdp2_model(world_size: int) -> nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    mesh = init_device_mesh("cpu", (world_size,))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def collectives_of_watched_steps(rank: int, world_size: int, kind: str) -> dict[str, Any]:
    counted = count_collectives()
    # the counters see a collective of gradwatch's: one made from a frame of the package's own files
    probe = compile("dist.all_reduce(torch.ones(1))", str(Path(GRADWATCH_DIR) / "probe.py"), "exec")
    exec(probe, {"dist": dist, "torch": torch})
    control = counted.by_gradwatch()
    counted.calls.clear()
    model = ddp_model() if kind == "ddp" else fsdp2_model(world_size)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    w = gradwatch.watch(opt, model=model, server=NOWHERE, warn=False, every=2, updates=True)
    for _ in range(STEPS):
        model(torch.randn(8, 4)).square().mean().backward()
        opt.step()
        opt.zero_grad()
    sent = sent_steps(w)
    w.close(timeout=0.5)
    dist.barrier()  # the test's own collective: seen, and not gradwatch's
    return {
        "control": control,
        "calls": counted.calls,
        "steps": [m["step"] for m in sent],
        "timed": [m["step"] for m in sent if m["scalars"]["time/step_s"] > 0],
        "measured": [m["step"] for m in sent if "grad_norm" in m["params"]],
        "dist": w.dist,
    }


@pytest.mark.parametrize("kind", ["ddp", "fsdp2"])
def test_the_hook_makes_no_collective(spool_dir: Path, kind: str) -> None:
    if kind == "fsdp2" and importlib.util.find_spec("gradwatch.pieces") is None:
        pytest.skip("FSDP2's DTensor parameters are measured on their local pieces from gradwatch.pieces on")
    for out in run_ranks(collectives_of_watched_steps, world_size=2, args=(kind,)):
        assert out["control"] == ["torch.distributed.all_reduce", "ProcessGroup.allreduce"]
        assert out["dist"] is not None and out["steps"] == out["timed"] == list(range(1, STEPS + 1))
        assert out["measured"] == [2, 4], "every=2: the step times ride with the unmeasured steps too"
        assert ("torch.distributed.barrier", False) in out["calls"], "the counters see the test's own barrier"
        assert [name for name, ours in out["calls"] if ours] == [], "gradwatch made a collective"


# -- the ranks measure the same steps ---------------------------------------------------------
SAMPLED_STEPS = 24


def measured_steps_of_a_job(rank: int, world_size: int, every: object, intervals: tuple[int, ...]) -> list[int]:
    """The steps this rank measured in a DDP job watched with `every`; with `intervals`, the
    rank's `every="auto"` interval is forced to intervals[rank] (as if its costs said so)."""
    model = ddp_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w = gradwatch.watch(opt, model=model, server=NOWHERE, warn=False, every=every)
    if intervals:
        sampler = w._sampler
        assert isinstance(sampler, AutoInterval)

        def forced() -> None:
            sampler.interval = intervals[rank]

        sampler._update = forced  # type: ignore[method-assign]
    g = torch.Generator().manual_seed(rank)
    for _ in range(SAMPLED_STEPS):
        model(torch.randn(8, 4, generator=g)).square().mean().backward()
        opt.step()
        opt.zero_grad()
    steps = [m["step"] for m in measured(sent_steps(w))]
    w.close(timeout=0.1)
    dist.barrier()
    return steps


def test_every_n_measures_the_same_steps_on_every_rank_the_multiples_of_n(spool_dir: Path) -> None:
    zero, one = run_ranks(measured_steps_of_a_job, world_size=2, args=(3, ()))
    assert zero == one == list(range(3, SAMPLED_STEPS + 1, 3))


def test_auto_intervals_that_differ_between_ranks_share_the_longer_ones_steps(spool_dir: Path) -> None:
    """Rank 1 is the costlier: its interval (5) is longer than rank 0's (3). Rounded up to powers
    of two (8 and 4), every step rank 1 measures is one that rank 0 measures too."""
    zero, one = run_ranks(measured_steps_of_a_job, world_size=2, args=("auto", (3, 5)))
    assert one and set(one) <= set(zero), (zero, one)
    assert one == [1] + list(range(8, SAMPLED_STEPS + 1, 8)), "step 1, then the multiples of 8"
    assert zero == [1] + list(range(4, SAMPLED_STEPS + 1, 4))


# -- when the ranks cannot agree --------------------------------------------------------------
class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []
        self.threads: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())
        self.threads.append(record.threadName or "")


def rank_zero_never_watches(rank: int, world_size: int) -> dict[str, Any]:
    store = dist.distributed_c10d._get_default_store()
    if rank == 0:  # keeps the store's server up until rank 1 is done
        store.wait(["test/done"], timedelta(seconds=60))
        return {}
    distributed.STORE_TIMEOUT_S = 0.5
    records = Records()
    logging.getLogger("gradwatch").addHandler(records)
    opt = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    started = time.monotonic()
    w = gradwatch.watch(opt, server=NOWHERE, warn=False)
    waited = time.monotonic() - started
    second = gradwatch.watch(opt, server=NOWHERE, warn=False)  # times out again, warns no more
    w.close(timeout=0.1)
    second.close(timeout=0.1)
    store.set("test/done", "1")
    return {"dist": (w.dist, second.dist), "hello": hello_of(w), "warnings": records.messages, "waited": waited}


@pytest.mark.timed
def test_a_rank_that_gets_no_job_id_warns_and_is_a_run_of_its_own(spool_dir: Path) -> None:
    out = run_ranks(rank_zero_never_watches, world_size=2)[1]
    assert out["dist"] == (None, None)
    assert "dist" not in out["hello"] and distributed.JOB_ID.match(out["hello"]["run"]["id"])
    assert "." not in out["hello"]["run"]["id"] and "dist" not in out["hello"]["run"]["config"]
    assert 0.5 <= out["waited"] < 10
    warned = [text for text in out["warnings"] if "could not agree" in text]
    assert len(warned) == 1, out["warnings"]
    assert "rank 1 of 2 could not agree on one run" in warned[0]
    assert "timeout" in warned[0].lower(), warned[0]


def rank_one_may_not_watch(rank: int, world_size: int, rank_one_watches: bool) -> dict[str, Any]:
    """Rank 0 watches and trains past the store timeout; rank 1 watches only if told to."""
    store = dist.distributed_c10d._get_default_store()
    distributed.STORE_TIMEOUT_S = 0.5
    records = Records()
    logging.getLogger("gradwatch").addHandler(records)
    if rank == 1:
        if rank_one_watches:
            gradwatch.watch(torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1), server=NOWHERE, warn=False).close(
                timeout=0.1
            )
        store.wait(["test/done"], timedelta(seconds=60))  # rank 0 holds the store's server
        store.set("test/seen", "1")  # rank 0 may end (and its store's server) once this wait is answered
        return {}
    model = nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w = gradwatch.watch(opt, model=model, server=NOWHERE, warn=False)
    watched = time.monotonic()
    # the training goes on meanwhile: past the timeout, and until the warning comes when it must
    while time.monotonic() - watched < 2.0 or (
        not rank_one_watches and not records.messages and time.monotonic() - watched < 20.0
    ):
        model(torch.randn(4, 2)).square().mean().backward()
        opt.step()
        opt.zero_grad()
        time.sleep(0.01)
    w.close(timeout=0.1)
    store.set("test/done", "1")
    store.wait(["test/seen"], timedelta(seconds=60))
    return {"warnings": records.messages, "threads": records.threads, "job": w.run_id, "steps": w.step}


@pytest.mark.timed
def test_rank_zero_warns_of_the_ranks_that_never_call_watch(spool_dir: Path) -> None:
    out = run_ranks(rank_one_may_not_watch, world_size=2, args=(False,))[0]
    assert out["steps"] > 10, "the training went on while rank 0 waited for the check"
    warned = [(m, t) for m, t in zip(out["warnings"], out["threads"]) if "did not call watch()" in m]
    assert len(warned) == 1, out["warnings"]
    text, thread = warned[0]
    assert text.startswith("gradwatch: rank 1 of 2 did not call watch()"), text
    assert out["job"] in text
    assert "Call gradwatch.watch() on every rank (the HF/Lightning callbacks do)" in text
    assert thread != "MainThread", "the check runs on a thread of its own"


@pytest.mark.timed
def test_rank_zero_says_nothing_when_every_rank_called_watch(spool_dir: Path) -> None:
    out = run_ranks(rank_one_may_not_watch, world_size=2, args=(True,))[0]
    assert out["steps"] > 10
    assert not [m for m in out["warnings"] if "did not call watch()" in m], out["warnings"]


# -- torchrun's environment, without a process group (in this process) -----------------------
@pytest.fixture
def fresh_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not dist.is_initialized()
    monkeypatch.setattr(distributed, "_calls", 0)
    monkeypatch.setattr(distributed, "_warned", False)


def torchrun_env(monkeypatch: pytest.MonkeyPatch, run_id: str, rank: int = 1, world_size: int = 2) -> None:
    for key, value in dict(RANK=rank, LOCAL_RANK=rank, WORLD_SIZE=world_size, TORCHELASTIC_RUN_ID=run_id).items():
        monkeypatch.setenv(key, str(value))


def test_under_torchrun_without_a_process_group_the_job_id_is_the_launchers(
    monkeypatch: pytest.MonkeyPatch, fresh_counts: None, spool_dir: Path
) -> None:
    torchrun_env(monkeypatch, "a1b2c3")
    opt = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    first = gradwatch.watch(opt, server=NOWHERE, warn=False)
    first.close(timeout=0.1)
    second = gradwatch.watch(opt, server=NOWHERE, warn=False)
    second.close(timeout=0.1)
    for n, w in enumerate((first, second)):
        job = hashlib.sha1(f"a1b2c3/{n}".encode()).hexdigest()[:12]
        assert w.run_id == job
        assert hello_of(w)["dist"] == {"job": job, "rank": 1, "world_size": 2}
        assert hello_of(w)["run"]["id"] == f"{job}.r1"
        assert hello_of(w)["run"]["config"]["dist"] == {"backend": None, "local_rank": 1, "meshes": []}
        assert (spool_dir / f"{job}.r1.spool").exists()
        assert w.url == f"{NOWHERE}/runs/{job}" and f'href="{NOWHERE}/runs/{job}"' in w._repr_html_()
        assert f"id {job}, rank 1 of 2, step 0" in w._repr_html_()


@pytest.mark.parametrize("run_id", ["none", ""])
def test_under_torchrun_without_a_run_id_a_rank_warns_once_and_is_a_run_of_its_own(
    monkeypatch: pytest.MonkeyPatch, fresh_counts: None, caplog: pytest.LogCaptureFixture, run_id: str
) -> None:
    torchrun_env(monkeypatch, run_id)
    opt = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    with caplog.at_level(logging.WARNING, logger="gradwatch"):
        watchers = [gradwatch.watch(opt, server=NOWHERE, warn=False) for _ in range(2)]
    for w in watchers:
        w.close(timeout=0.1)
        assert w.dist is None and "dist" not in hello_of(w) and hello_of(w)["run"]["id"] == w.run_id
    warned = [r.getMessage() for r in caplog.records if "could not agree" in r.getMessage()]
    assert len(warned) == 1 and "init_process_group" in warned[0]


@pytest.mark.parametrize(
    "env",
    [
        {"WORLD_SIZE": "1", "RANK": "0"},
        {"WORLD_SIZE": "2"},
        {"WORLD_SIZE": "two", "RANK": "1"},
        {"RANK": "3", "WORLD_SIZE": "2"},
    ],
)
def test_one_process_or_an_environment_that_is_no_job_is_a_plain_run(
    monkeypatch: pytest.MonkeyPatch, fresh_counts: None, caplog: pytest.LogCaptureFixture, env: dict[str, str]
) -> None:
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "a1b2c3")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    opt = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    with caplog.at_level(logging.WARNING, logger="gradwatch"):
        w = gradwatch.watch(opt, server=NOWHERE, warn=False)
    w.close(timeout=0.1)
    assert w.dist is None and "dist" not in hello_of(w) and distributed._calls == 0
    assert not [r for r in caplog.records if "could not agree" in r.getMessage()]


def test_the_config_lists_the_distinct_device_meshes_of_dtensor_parameters(tmp_path: Path) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        flat = init_device_mesh("cpu", (1,))
        hybrid = init_device_mesh("cpu", (1, 1), mesh_dim_names=("rep", "shard"))
        params = [
            distribute_tensor(torch.ones(4, 2), flat, [Shard(0)]),
            torch.ones(3),
            distribute_tensor(torch.ones(4), hybrid, [Replicate(), Shard(0)]),
            distribute_tensor(torch.ones(2), flat, [Replicate()]),
        ]
        assert distributed.meshes(params) == [
            {"shape": [1], "dim_names": None},
            {"shape": [1, 1], "dim_names": ["rep", "shard"]},
        ]
        assert distributed.meshes([torch.ones(2)]) == []
    finally:
        dist.destroy_process_group()


def test_a_process_group_of_one_is_a_plain_run(tmp_path: Path, fresh_counts: None) -> None:
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        opt = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
        w = gradwatch.watch(opt, server=NOWHERE, warn=False)
        w.close(timeout=0.1)
    finally:
        dist.destroy_process_group()
    assert w.dist is None and "dist" not in hello_of(w) and hello_of(w)["run"]["id"] == w.run_id
    assert distributed._calls == 0
    assert [sorted(p) for p in hello_of(w)["params"]] == [["dtype", "group", "name", "numel", "optimizer", "shape"]] * 2

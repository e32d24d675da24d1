"""DDP on a real 2-rank gloo job against a real server: one run per job whose values are exact.

One job (tests/support/dist.py) runs three watched trainings in turn, each with its own run: a
plain one, one accumulating 4 micro-batches under `no_sync()`, and one whose step 2 is taken
inside `no_sync()` (the ranks then step on different gradients). Each rank computes its own
norms in the test's code (torch.linalg.vector_norm on its own tensors) as the oracle of its child
run; the parent's global values are checked against a single process trained on the full batch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import gradwatch
from support.distruns import assert_norms, exported, get, job_of, job_on_server, settled
from support.server import ServerProcess

pytestmark = pytest.mark.server

STEPS, BATCH, ACCUMULATE = 4, 16, 4

Oracle = dict[int, dict[str, dict[str, float]]]


def build() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 16), nn.Tanh(), nn.Linear(16, 3))


def data(steps: int, micro: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(steps, micro, BATCH, 8, generator=g), torch.randint(0, 3, (steps, micro, BATCH), generator=g)


def norms(named: list[tuple[str, torch.Tensor]], of: Any) -> dict[str, float]:
    return {n: torch.linalg.vector_norm(of(p)).item() for n, p in named}


def state_norms(named: list[tuple[str, torch.Tensor]], opt: torch.optim.Optimizer) -> dict[str, dict[str, float]]:
    out = {"param_norm": norms(named, lambda p: p)}
    for key in ("exp_avg", "exp_avg_sq"):
        out[f"{key}_norm"] = {n: torch.linalg.vector_norm(opt.state[p][key]).item() for n, p in named}
    return out


def train(rank: int, url: str, run: str, micro: int, desync_step: int | None = None) -> tuple[str, Oracle]:
    """A watched DDP training; the run id and this rank's own norms per step (its oracle)."""
    model = DistributedDataParallel(build())
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    named = list(model.module.named_parameters())
    x, y = data(STEPS, micro)
    mine = slice(rank * BATCH // 2, (rank + 1) * BATCH // 2)
    oracle: Oracle = {}
    with gradwatch.watch(opt, model=model, run=run, project="dist", server=url, warn=False) as w:
        for step in range(1, STEPS + 1):
            opt.zero_grad(set_to_none=True)
            for m in range(micro):
                skip = m < micro - 1 or step == desync_step  # the desync step never synchronises
                with model.no_sync() if skip else contextlib.nullcontext():
                    nn.functional.cross_entropy(model(x[step - 1, m, mine]), y[step - 1, m, mine]).div(micro).backward()
            grads = norms(named, lambda p: p.grad)
            opt.step()
            oracle[step] = {"grad_norm": grads, **state_norms(named, opt)}
        if rank > 0:  # rank 0 closes first: a replica closing before rank 0's steps reached the
            torch.distributed.barrier()  # server is asked for every digest not yet compared
    if rank == 0:
        torch.distributed.barrier()
    return w.run_id, oracle


def ddp_job(rank: int, world_size: int, url: str) -> dict[str, tuple[str, Oracle]]:
    return {
        "plain": train(rank, url, "ddp-plain", 1),
        "accumulate": train(rank, url, "ddp-accumulate", ACCUMULATE),
        "desync": train(rank, url, "ddp-desync", 1, desync_step=2),
    }


def full_batch_reference() -> Oracle:
    """One process, the same init and data, the mean loss over the whole batch: what DDP's
    averaged gradients equal."""
    model = build()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    named = list(model.named_parameters())
    x, y = data(STEPS)
    oracle: Oracle = {}
    for step in range(1, STEPS + 1):
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x[step - 1, 0]), y[step - 1, 0]).backward()
        grads = norms(named, lambda p: p.grad)
        opt.step()
        oracle[step] = {"grad_norm": grads, **state_norms(named, opt)}
    return oracle


Job = tuple[ServerProcess, list[dict[str, tuple[str, Oracle]]]]


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Job]:
    """The job, run once for the module's tests."""
    with job_on_server(tmp_path_factory.mktemp("ddp"), ddp_job) as (server, ranks):
        for name in ranks[0]:
            settled(server.url, job_of(ranks[0][name][0]))
        yield server, ranks


def test_each_ddp_job_is_one_run_of_two_ranks(job: Job) -> None:
    server, ranks = job
    jobs = {name: job_of(run_id) for name, (run_id, _) in ranks[0].items()}
    assert jobs == {name: job_of(run_id) for name, (run_id, _) in ranks[1].items()}  # both ranks agreed
    listed = {r["id"]: r for r in get(server.url, "/api/runs", limit=100)["data"]}
    assert set(listed) == set(jobs.values())  # the ranks' child runs are not listed
    for name, run_id in jobs.items():
        run = listed[run_id]
        assert (run["world_size"], run["status"], run["steps"], run["name"]) == (2, "finished", STEPS, f"ddp-{name}")
        view = get(server.url, f"/api/runs/{run_id}/ranks")
        assert [(r["rank"], r["run_id"], r["steps"]) for r in view["ranks"]] == [
            (0, f"{run_id}.r0", STEPS),
            (1, f"{run_id}.r1", STEPS),
        ]
        assert view["partial"]["steps"] == 0


def test_global_norms_equal_one_process_on_the_full_batch(job: Job) -> None:
    """DDP averages the ranks' gradients: the run's grad norms are those of the mean loss over the
    whole batch; parameters and Adam's state are replicas, counted once (not sqrt(2) times)."""
    server, ranks = job
    stored = exported(server.url, job_of(ranks[0]["plain"][0]))
    assert assert_norms(stored, full_batch_reference(), "parent vs full batch") == STEPS * 4 * 6
    for step, row in stored.items():
        assert row["scalars"]["dist/ranks"] == 2, step


def test_each_ranks_child_run_holds_its_own_norms(job: Job) -> None:
    server, ranks = job
    for rank, results in enumerate(ranks):
        for name in ("plain", "desync"):
            run_id, oracle = results[name]
            child = f"{job_of(run_id)}.r{rank}"
            assert get(server.url, f"/api/runs/{child}")["rank"] == rank
            rows = exported(server.url, child)
            assert sorted(rows) == sorted(oracle)  # every step stored, its scalars at least
            if rank > 0:  # a replica sends its grad_digest: its arrays only where the server asked
                rows = {s: row for s, row in rows.items() if "grad_norm" in row}
                assert sorted(rows) == ([2] if name == "desync" else []), (name, sorted(rows))
                oracle = {s: oracle[s] for s in rows}
            assert assert_norms(rows, oracle, f"{name} rank {rank}") == len(oracle) * 4 * 6
    # the desync run's step 2 was not synchronised: the ranks' own gradients differ there
    step2 = [r["desync"][1][2]["grad_norm"]["0.weight"] for r in ranks]
    assert step2[0] != pytest.approx(step2[1], rel=1e-3)


def test_accumulation_under_no_sync_is_reported_as_k_and_not_as_an_error(
    job: Job,
) -> None:
    server, ranks = job
    run_id = job_of(ranks[0]["accumulate"][0])
    stored = exported(server.url, run_id)
    assert [row["scalars"]["backward_passes"] for row in stored.values()] == [ACCUMULATE] * STEPS
    findings = get(server.url, f"/api/runs/{run_id}/diagnostics")
    assert [f["code"] for f in findings if f["severity"] != "info"] == [], findings
    accumulation = [f for f in findings if f["code"] == "grad_accumulation"]
    assert len(accumulation) == 1 and str(ACCUMULATE) in accumulation[0]["message"], findings


def test_a_step_inside_no_sync_is_rank_desync(job: Job) -> None:
    server, ranks = job
    run_id = job_of(ranks[0]["desync"][0])
    findings = get(server.url, f"/api/runs/{run_id}/diagnostics")
    desync = [f for f in findings if f["code"] == "rank_desync"]
    assert len(desync) == 1, findings
    assert desync[0]["severity"] == "error" and desync[0]["first_step"] == 2
    assert set(desync[0]["params"]) == {n for n, _ in build().named_parameters()}
    assert "1" in desync[0]["message"]  # names the rank that differs
    for name in ("plain", "accumulate"):
        others = get(server.url, f"/api/runs/{job_of(ranks[0][name][0])}/diagnostics")
        assert "rank_desync" not in {f["code"] for f in others}, (name, others)


def test_the_ranks_leave_no_spool(job: Job) -> None:
    """Every rank's stream was acknowledged before its close returned: nothing left to replay."""
    server, _ = job
    assert server.db_path is not None
    assert not list((server.db_path.parent / "spool").glob("*.spool"))


def test_each_rank_times_its_steps_and_the_run_keeps_the_slowest(job: Job) -> None:
    """Every step of each child run has the rank's own step time, time before backward and
    memory; the job's run has the maximum over the ranks."""
    server, ranks = job
    run_id = job_of(ranks[0]["plain"][0])
    children = [exported(server.url, f"{run_id}.r{rank}") for rank in range(2)]
    parent = exported(server.url, run_id)
    for key in ("time/step_s", "time/before_backward_s", "mem/rss_bytes"):
        for step in range(1, STEPS + 1):
            mine = [child[step]["scalars"][key] for child in children]
            assert all(v > 0 for v in mine), (key, step, mine)
            assert parent[step]["scalars"][key] == max(mine), (key, step)
    for step in range(1, STEPS + 1):
        assert all(c[step]["scalars"]["time/before_backward_s"] < c[step]["scalars"]["time/step_s"] for c in children)
        footprint = [c[step]["scalars"]["mem/params_bytes"] for c in children]
        assert parent[step]["scalars"]["mem/params_bytes"] == sum(footprint)

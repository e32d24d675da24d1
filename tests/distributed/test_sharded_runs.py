"""FSDP2, HSDP and FSDP1 on a real 2-rank gloo job against a real server: every per-parameter
norm the run stores (gradient, parameter, Adam's two moments) equals the norm of the full tensor,
and FSDP2's optimizer signals (`optimizer_signals=True`) the signals of the full tensors,
gathered here in the test (`full_tensor()`, `summon_full_params`, all-gathers of FSDP1's
slices of gradients and optimizer state): collectives of the test's own, beside the watched steps.

One job trains the same small model (one layer whose single row leaves rank 1 an empty shard)
under each sharding in turn, each watched as its own run.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard

import gradwatch
from support.distruns import ADAM_METRICS, assert_norms, exported, get, job_of, job_on_server, settled
from support.server import ServerProcess

pytestmark = pytest.mark.server

STEPS, BATCH = 3, 8
#: name -> (FSDP version, the mesh: its shape, FSDP1's use_orig_params)
CONFIGS: dict[str, tuple[int, Any]] = {
    "fsdp2": (2, (2,)),
    "hsdp-2x1": (2, (2, 1)),  # two replicas of an unsharded model: counted once
    "hsdp-1x2": (2, (1, 2)),  # one replica sharded over both ranks
    "fsdp1": (1, True),
    "fsdp1-flat": (1, False),
}

Oracle = dict[int, dict[str, dict[str, float]]]


def build() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(8, 16), nn.Tanh(), nn.LayerNorm(16), nn.Linear(16, 3), nn.Tanh(), nn.Linear(3, 1)
    )  # the last layer: one row, which rank 0's shard holds whole


def wrap(model: nn.Module, version: int, setting: Any) -> nn.Module:
    if version == 1:
        return FullyShardedDataParallel(model, use_orig_params=setting, device_id=torch.device("cpu"))
    names = ("rep", "shard") if len(setting) == 2 else None
    mesh = init_device_mesh("cpu", setting, mesh_dim_names=names)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def clean(name: str) -> str:
    return name.replace("_fsdp_wrapped_module.", "")


def norm(t: torch.Tensor) -> float:
    return torch.linalg.vector_norm(t).item()


def full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def gathered_grads(model: nn.Module, version: int, setting: Any) -> dict[str, float]:
    if version == 2:
        return {n: norm(full(p.grad)) for n, p in model.named_parameters()}
    if setting:  # use_orig_params=True
        with FullyShardedDataParallel.summon_full_params(model, with_grads=True):
            return {clean(n): norm(p.grad) for n, p in model.named_parameters()}
    flat = model._handle.flat_param  # type: ignore[union-attr]
    return {n: norm(t) for n, t in unflatten(flat, flat.grad).items()}


def unflatten(flat: Any, local: torch.Tensor) -> dict[str, torch.Tensor]:
    """FSDP1's flat parameter (use_orig_params=False) of which every rank holds an equal slice
    (`local`: of the parameter, its gradient or a state tensor): all-gathered and cut into the
    original parameters (the padding at the end left out)."""
    pieces = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(pieces, local.contiguous())
    whole = torch.cat(pieces)
    out, offset = {}, 0
    for fqn, numel in zip(flat._fqns, flat._numels):
        out[clean(fqn)] = whole[offset : offset + numel]
        offset += numel
    return out


def gathered_pieces(local: torch.Tensor, numel: int) -> torch.Tensor:
    """FSDP1 with use_orig_params=True: each rank holds a contiguous 1-D slice of each original
    parameter (possibly empty), in rank order; all-gathered and joined, the whole tensor."""
    pieces: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(pieces, local.detach().reshape(-1))
    whole = torch.cat(pieces)
    assert whole.numel() == numel, (whole.numel(), numel)
    return whole


def gathered_state(
    model: nn.Module, opt: torch.optim.Optimizer, version: int, setting: Any
) -> dict[str, dict[str, float]]:
    named = list(model.named_parameters())
    keys = ("exp_avg", "exp_avg_sq")
    if version == 2:
        out = {"param_norm": {n: norm(full(p)) for n, p in named}}
        for key in keys:
            out[f"{key}_norm"] = {n: norm(full(opt.state[p][key])) for n, p in named}
        return out
    with FullyShardedDataParallel.summon_full_params(model):
        out = {"param_norm": {clean(n): norm(p) for n, p in model.named_parameters()}}
    if not setting:  # one flat parameter, its state flat too
        flat = model._handle.flat_param  # type: ignore[union-attr]
        for key in keys:
            out[f"{key}_norm"] = {n: norm(t) for n, t in unflatten(flat, opt.state[flat][key]).items()}
        return out
    numels = {clean(n): p.numel() for n, p in build().named_parameters()}
    for key in keys:
        out[f"{key}_norm"] = {}
        for n, p in named:
            local = opt.state[p][key] if key in opt.state.get(p, {}) else torch.zeros(0)  # no state: an empty slice
            out[f"{key}_norm"][clean(n)] = norm(gathered_pieces(local, numels[clean(n)]))
    return out


def local_grads(model: nn.Module) -> dict[str, float]:
    """This rank's own piece of each gradient (FSDP2: the DTensor's local shard)."""
    return {n: norm(p.grad.to_local()) for n, p in model.named_parameters()}


def train(rank: int, url: str, name: str) -> tuple[str, Oracle, Oracle]:
    """A watched training under `name`'s sharding: run id, the full tensors' norms per step, and
    this rank's own gradient pieces' norms (FSDP2 only)."""
    version, setting = CONFIGS[name]
    model = wrap(build(), version, setting)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(STEPS, BATCH, 8, generator=g), torch.randn(STEPS, BATCH, 1, generator=g)
    mine = slice(rank * BATCH // 2, (rank + 1) * BATCH // 2)
    oracle: Oracle = {}
    local: Oracle = {}
    with gradwatch.watch(opt, model=model, run=name, project="dist", server=url, warn=False) as w:
        for step in range(1, STEPS + 1):
            opt.zero_grad(set_to_none=True)
            nn.functional.mse_loss(model(x[step - 1, mine]), y[step - 1, mine]).backward()
            grads = gathered_grads(model, version, setting)
            if name == "fsdp2":
                local[step] = {"grad_norm": local_grads(model)}
            opt.step()
            oracle[step] = {"grad_norm": grads, **gathered_state(model, opt, version, setting)}
    return w.run_id, oracle, local


#: Adam's epsilon of the signals' run: large enough that some entries of v̂ fall below (2 eps)^2
SIGNALS_EPS = 3e-3


def full_signals(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, dict[str, float]]:
    """The optimizer signals of the full tensors (gathered), in float64, as docs/diagnostics.md
    defines them: eps_share = the share of entries of v̂ = v / (1 - beta2^t) below (2 eps)^2,
    v_decoupling = mean(g^2) / mean(v̂), momentum_cosine = cos(g, exp_avg)."""
    out: dict[str, dict[str, float]] = {"eps_share": {}, "v_decoupling": {}, "momentum_cosine": {}}
    (group,) = opt.param_groups
    for n, p in model.named_parameters():
        state = opt.state[p]
        g, m, v = (full(t).double().reshape(-1) for t in (p.grad, state["exp_avg"], state["exp_avg_sq"]))
        v_hat = v / (1 - group["betas"][1] ** float(state["step"]))
        out["eps_share"][n] = float((v_hat < (2 * group["eps"]) ** 2).double().mean())
        out["v_decoupling"][n] = float((g * g).mean() / v_hat.mean())
        out["momentum_cosine"][n] = float(g @ m / (g.norm() * m.norm()))
    return out


def train_signals(rank: int, url: str) -> tuple[str, Oracle]:
    """FSDP2 with `optimizer_signals=True`: the run id and, per step, the full tensors' signals."""
    model = wrap(build(), 2, (2,))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, eps=SIGNALS_EPS)
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(STEPS, BATCH, 8, generator=g), torch.randn(STEPS, BATCH, 1, generator=g)
    mine = slice(rank * BATCH // 2, (rank + 1) * BATCH // 2)
    oracle: Oracle = {}
    with gradwatch.watch(
        opt, model=model, run="fsdp2-signals", project="dist", server=url, warn=False, optimizer_signals=True
    ) as w:
        for step in range(1, STEPS + 1):
            opt.zero_grad(set_to_none=True)
            nn.functional.mse_loss(model(x[step - 1, mine]), y[step - 1, mine]).backward()
            opt.step()
            oracle[step] = full_signals(model, opt)
    return w.run_id, oracle


def sharded_job(rank: int, world_size: int, url: str) -> dict[str, Any]:
    return {**{name: train(rank, url, name) for name in CONFIGS}, "signals": train_signals(rank, url)}


Job = tuple[ServerProcess, list[dict[str, Any]]]


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Job]:
    """The job, run once for the module's tests."""
    with job_on_server(tmp_path_factory.mktemp("sharded"), sharded_job) as (server, ranks):
        for name in [*CONFIGS, "signals"]:
            settled(server.url, job_of(ranks[0][name][0]))
        yield server, ranks


@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_stored_norm_equals_the_full_tensors(job: Job, name: str) -> None:
    server, ranks = job
    run_id, oracle, _ = ranks[0][name]
    assert job_of(ranks[1][name][0]) == job_of(run_id)
    run = get(server.url, f"/api/runs/{job_of(run_id)}")
    assert (run["world_size"], run["steps"], run["name"]) == (2, STEPS, name)
    names = [p["name"] for p in get(server.url, f"/api/runs/{job_of(run_id)}/params")["data"]]
    assert names == [n for n, _ in build().named_parameters()]  # the module's own names, no FSDP prefix
    stored = exported(server.url, job_of(run_id))
    assert assert_norms(stored, oracle, name) == STEPS * len(ADAM_METRICS) * len(names)


def test_each_fsdp2_rank_stores_its_own_shards_norms(job: Job) -> None:
    """Rank 1's shard of the one-row layer is empty: its norm is 0, not absent."""
    server, ranks = job
    for rank, results in enumerate(ranks):
        run_id, _, local = results["fsdp2"]
        stored = exported(server.url, f"{job_of(run_id)}.r{rank}")
        assert_norms({s: {"grad_norm": stored[s]["grad_norm"]} for s in stored}, local, f"fsdp2 rank {rank}")
    assert ranks[1]["fsdp2"][2][1]["grad_norm"]["5.bias"] == 0.0


def test_fsdp2_optimizer_signals_equal_the_full_tensors(job: Job) -> None:
    """Each rank measures the signals of its DTensor shards (the one-row layer's shard on rank 1 is
    empty); the job's step holds the signals of the whole tensors, combined from the norms the
    ranks send, equal to the signals computed here on the gathered tensors."""
    server, ranks = job
    run_id, oracle = ranks[0]["signals"]
    stored = exported(server.url, job_of(run_id))
    assert sorted(stored) == list(range(1, STEPS + 1))
    shares = set()
    for step, signals in oracle.items():
        for metric, by_param in signals.items():
            for name, value in by_param.items():
                got = stored[step][metric][name]
                assert got == pytest.approx(value, rel=1e-4, abs=1e-5), (step, metric, name, got, value)
        shares |= set(signals["eps_share"].values())
    assert len(shares) > 2 and 0 < min(shares - {0.0, 1.0}) < 1  # shares strictly between 0 and 1 seen
    assert "eps_regime_norm" not in stored[1]  # the signals' wire form is not kept on the job

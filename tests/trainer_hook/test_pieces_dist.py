"""Exact global norms from each rank's local pieces, in real 2-rank gloo jobs (DDP, FSDP2, HSDP,
FSDP1 with and without `use_orig_params`).

Each rank watches its optimizer (no server: the test reads the messages the Watcher queued) and,
as the oracle, gathers the FULL tensors itself (`full_tensor()`, all_gather of the shards). The
parent combines the ranks' local norms as the server does (DIST-SPEC.md: the square root of the
sum of squares over the `counted` pieces) and compares every parameter and quantity with the
oracle's norm, at every one of several Adam steps.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.distributed as dist

import gradwatch
from gradwatch.layout import build_layout
from support.dist import run_ranks
from support.sent import measured, sent_steps

pytestmark = [pytest.mark.unit, pytest.mark.slow]  # each test spawns a 2-rank job (seconds)

NOWHERE = "http://127.0.0.1:9"
STEPS = 3
QUANTITIES = ("grad_norm", "param_norm", "exp_avg_norm", "exp_avg_sq_norm", "update_norm", "param_before_norm")
STATUS = {None: 0, "zero": 1, "nonzero": 2, "nonfinite": 3}
NAMES = ["a.weight", "a.bias", "b.weight", "b.bias"]


class Net(torch.nn.Module):
    """43 elements (FSDP1 pads its flat parameters); `a` has 5 output rows (FSDP2 gives rank 0
    three and rank 1 two); the first three outputs of `a` are masked, so rank 0's shard of
    `a`'s gradient is exactly zero while the whole gradient is not."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(4, 5)
        self.b = torch.nn.Linear(5, 3)
        self.register_buffer("mask", torch.tensor([0.0, 0.0, 0.0, 1.0, 1.0]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)) * self.mask)


def _wrap(kind: str, net: Net) -> torch.nn.Module:
    if kind == "ddp":
        return torch.nn.parallel.DistributedDataParallel(net)
    if kind in ("fsdp2", "hsdp21", "hsdp12"):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        shape = {"fsdp2": (2,), "hsdp21": (2, 1), "hsdp12": (1, 2)}[kind]
        names = None if len(shape) == 1 else ("rep", "shard")
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
        fully_shard(net.a, mesh=mesh)
        fully_shard(net.b, mesh=mesh)
        fully_shard(net, mesh=mesh)
        return net
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy

    options: dict[str, Any] = {"use_orig_params": kind == "fsdp1o", "device_id": torch.device("cpu")}
    if kind == "fsdp1h":  # two replicas of one shard each
        options.update(
            sharding_strategy=ShardingStrategy.HYBRID_SHARD,
            device_mesh=init_device_mesh("cpu", (2, 1), mesh_dim_names=("rep", "shard")),
        )
    elif kind == "fsdp1n":
        options.update(sharding_strategy=ShardingStrategy.NO_SHARD)
    net.a = FSDP(net.a, **options)  # type: ignore[assignment]
    return FSDP(net, **options)


def _gather_cat(local: torch.Tensor | None) -> torch.Tensor | None:
    """Every rank's 1-D piece (None where it has none), concatenated in rank order."""
    pieces: list[torch.Tensor | None] = [None] * dist.get_world_size()
    dist.all_gather_object(pieces, None if local is None else local.detach().reshape(-1).clone())
    present = [p for p in pieces if p is not None]
    return torch.cat(present) if present else None


def _full(kind: str, model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, dict[str, Any]]:
    """The oracle: per original parameter, its FULL param, grad and Adam state, gathered here."""
    out: dict[str, dict[str, Any]] = {}

    def add(name: str, **tensors: torch.Tensor | None) -> None:
        out[name] = tensors

    if kind == "ddp":
        for name, p in model.module.named_parameters():  # type: ignore[union-attr]
            state = opt.state.get(p, {})
            add(name, param=p, grad=p.grad, exp_avg=state.get("exp_avg"), exp_avg_sq=state.get("exp_avg_sq"))
    elif kind in ("fsdp2", "hsdp21", "hsdp12"):
        for name, p in model.named_parameters():
            state = opt.state.get(p, {})
            full = {k: None if state.get(k) is None else state[k].full_tensor() for k in ("exp_avg", "exp_avg_sq")}
            add(name, param=p.full_tensor(), grad=None if p.grad is None else p.grad.full_tensor(), **full)  # type: ignore[attr-defined]
    elif kind == "fsdp1o":  # the original params are each rank's contiguous range of their flattening
        for name, p in model.named_parameters():
            state = opt.state.get(p, {})
            add(
                _clean(name),
                param=_gather_cat(p),
                grad=_gather_cat(p.grad),
                exp_avg=_gather_cat(state.get("exp_avg")),
                exp_avg_sq=_gather_cat(state.get("exp_avg_sq")),
            )
    else:  # fsdp1: the padded flat shards, concatenated, split as FSDP unflattens them
        gather = _gather_cat if kind == "fsdp1" else lambda t: t  # the others hold the whole on each rank
        for name, flat in model.named_parameters():
            prefix = _clean(name.removesuffix("_flat_param"))
            state = opt.state.get(flat, {})
            whole = {
                "param": gather(flat),
                "grad": gather(flat.grad),
                "exp_avg": gather(state.get("exp_avg")),
                "exp_avg_sq": gather(state.get("exp_avg_sq")),
            }
            sizes = flat._numels_with_padding  # type: ignore[attr-defined]
            # the shards' padding to a multiple of the world size is at the end
            split = {k: None if v is None else torch.split(v[: sum(sizes)], sizes) for k, v in whole.items()}
            real = [j for j, pad in enumerate(flat._is_padding_mask) if not pad]  # type: ignore[attr-defined]
            for k, fqn in enumerate(flat._fqns):  # type: ignore[attr-defined]
                add(prefix + fqn, **{q: None if v is None else v[real[k]] for q, v in split.items()})
    return out


def _clean(name: str) -> str:
    return ".".join(c for c in name.split(".") if c not in ("_fsdp_wrapped_module", "module"))


def _norm(t: torch.Tensor | None) -> float | None:
    return None if t is None else float(torch.linalg.vector_norm(t.detach().double()))


def _status(t: torch.Tensor | None) -> int:
    if t is None:
        return 0
    if not bool(torch.isfinite(t).all()):
        return 3
    return 2 if bool((t != 0).any()) else 1


def _job(rank: int, world_size: int, kind: str) -> dict[str, Any]:
    torch.manual_seed(0)
    model = _wrap(kind, Net())
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    w = gradwatch.watch(opt, model=model, server=NOWHERE, warn=False, updates=True)
    data = torch.Generator().manual_seed(100 + rank)
    oracle, grads_bytes = [], []
    before = {n: q["param"].clone() for n, q in _full(kind, model, opt).items()}
    for _ in range(STEPS):
        opt.zero_grad()
        model(torch.randn(6, 4, generator=data)).pow(2).sum().backward()
        grads = {n: (_norm(q["grad"]), _status(q["grad"])) for n, q in _full(kind, model, opt).items()}
        grads_bytes.append(sum(_local(p.grad).nbytes for p in model.parameters() if p.grad is not None))
        opt.step()
        after = _full(kind, model, opt)
        oracle.append(
            {
                n: {
                    "grad_norm": grads[n][0],
                    "grad_status": grads[n][1],
                    "param_norm": _norm(q["param"]),
                    "exp_avg_norm": _norm(q["exp_avg"]),
                    "exp_avg_sq_norm": _norm(q["exp_avg_sq"]),
                    "update_norm": _norm(q["param"] - before[n]),
                    "param_before_norm": _norm(before[n]),
                    "numel": q["param"].numel(),
                }
                for n, q in after.items()
            }
        )
        before = {n: q["param"].clone() for n, q in after.items()}
    msgs = measured(sent_steps(w))
    local_bytes = {  # what this rank holds, each tensor once, for the memory scalars
        "params": sum(_local(p).nbytes for p in opt.param_groups[0]["params"]),
        "optimizer": sum(_local(t).nbytes for s in opt.state.values() for t in s.values()),
    }
    w.close(timeout=0.1)
    local_bytes["grads"] = grads_bytes
    # without model=, a FlatParameter is still split into its original parameters
    alone = [(p["name"], p["local_numel"]) for p in build_layout([opt], None).hello_params()]
    return {
        "hello": w._sender.hello["params"],
        "steps": msgs,
        "oracle": oracle,
        "bytes": local_bytes,
        "alone": alone,
    }


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t  # type: ignore[no-any-return]


def _combined(ranks: list[dict[str, Any]], step: int, metric: str, name: str) -> float | None:
    """The server's rule: sqrt of the sum of squares over counted pieces; None where all are ABSENT."""
    values = [
        r["steps"][step]["params"][metric][name]
        for r in ranks
        if next(p for p in r["hello"] if p["name"] == name).get("counted", True)
    ]
    present = [v for v in values if v is not None]
    return math.sqrt(sum(v * v for v in present)) if present else None


def _combined_status(ranks: list[dict[str, Any]], step: int, name: str) -> int:
    codes = {
        r["steps"][step]["grad_status"][name]
        for r in ranks
        if next(p for p in r["hello"] if p["name"] == name).get("counted", True)
    }
    for code in (3, 2, 1):
        if code in codes:
            return code
    return 0


def _check(kind: str) -> list[dict[str, Any]]:
    ranks = run_ranks(_job, 2, (kind,))
    for r in ranks:
        assert sorted(p["name"] for p in r["hello"]) == sorted(NAMES), kind  # in the optimizer's order
        assert [m["step"] for m in r["steps"]] == list(range(1, STEPS + 1))
    oracle = ranks[0]["oracle"]
    for name in NAMES:
        entries = [next(p for p in r["hello"] if p["name"] == name) for r in ranks]
        full = oracle[0][name]["numel"]
        for e in entries:  # the full shape on every rank
            assert e["numel"] == full == math.prod(e["shape"]), (kind, name, e)
        counted = sum(e["local_numel"] for e in entries if e["counted"])
        assert counted == full, (kind, name, entries)  # the counted pieces tile the parameter once
    for step in range(STEPS):
        for name in NAMES:
            for metric in QUANTITIES:
                want = oracle[step][name][metric]
                got = _combined(ranks, step, metric, name)
                assert want is not None and got is not None, (kind, step, name, metric)
                assert got == pytest.approx(want, rel=1e-5, abs=1e-30), (kind, step, name, metric)
            assert _combined_status(ranks, step, name) == oracle[step][name]["grad_status"], (kind, step, name)
    for r in ranks:
        for step, m in enumerate(r["steps"]):
            assert m["scalars"]["mem/params_bytes"] == r["bytes"]["params"], kind
            assert m["scalars"]["mem/optimizer_bytes"] == r["bytes"]["optimizer"], kind
            assert m["scalars"]["mem/grads_bytes"] == r["bytes"]["grads"][step], kind
            # one backward pass per step, after a zero_grad() that set the grads to None
            assert set(m["params"]["backward_passes"].values()) == {1.0}, (kind, m["step"])
            assert set(m["params"]["grad_clear"].values()) == ({None} if step == 0 else {1.0}), (kind, m["step"])
    return ranks


def test_ddp_replicas_count_once() -> None:
    ranks = _check("ddp")
    assert [[p["counted"] for p in r["hello"]] for r in ranks] == [[True] * 4, [False] * 4]
    for name in NAMES:  # the replicas' local norms agree: DDP synchronised them
        for m0, m1 in zip(ranks[0]["steps"], ranks[1]["steps"]):
            assert m0["params"]["grad_norm"][name] == pytest.approx(m1["params"]["grad_norm"][name], rel=1e-6)


def test_fsdp2_uneven_shards() -> None:
    ranks = _check("fsdp2")
    local = [{p["name"]: p["local_numel"] for p in r["hello"]} for r in ranks]
    assert local == [
        {"a.weight": 12, "a.bias": 3, "b.weight": 10, "b.bias": 2},
        {"a.weight": 8, "a.bias": 2, "b.weight": 5, "b.bias": 1},
    ]
    # rank 0's piece of a.weight's gradient is zero, rank 1's is not: the combined status is nonzero
    assert [r["steps"][0]["grad_status"]["a.weight"] for r in ranks] == [1, 2]


@pytest.mark.parametrize("kind", ["hsdp21", "hsdp12"])
def test_hsdp_replicas_count_once(kind: str) -> None:
    ranks = _check(kind)
    counted = [[p["counted"] for p in r["hello"]] for r in ranks]
    assert counted == ([[True] * 4, [False] * 4] if kind == "hsdp21" else [[True] * 4, [True] * 4])


@pytest.mark.parametrize("kind", ["fsdp1o", "fsdp1"])
def test_fsdp1_pieces_without_padding(kind: str) -> None:
    ranks = _check(kind)
    local = [{p["name"]: p["local_numel"] for p in r["hello"]} for r in ranks]
    # a's flat parameter holds 25 elements (13 per rank, one of padding on rank 1); b's 18, or
    # with use_orig_params 20: b.weight's 15 are padded to 16 (alignment), and 3 + 1 for b.bias
    b0 = 10 if kind == "fsdp1o" else 9
    assert local == [
        {"a.weight": 13, "a.bias": 0, "b.weight": b0, "b.bias": 0},
        {"a.weight": 7, "a.bias": 5, "b.weight": 15 - b0, "b.bias": 3},
    ]
    if kind == "fsdp1":  # without model=: the optimizer's order (the root's b, then a), fallback names
        for r in ranks:
            local = {p["name"]: p["local_numel"] for p in r["hello"]}
            assert r["alone"] == [
                ("group0.param0.b.weight", local["b.weight"]),  # the root's FQNs name its submodule
                ("group0.param0.b.bias", local["b.bias"]),
                ("group0.param1.weight", local["a.weight"]),
                ("group0.param1.bias", local["a.bias"]),
            ]
    # an empty piece whose tensor exists has norm 0 (the param of a use_orig_params slice, or the
    # flat slices of the flat parameter and its grad)
    assert all(m["params"]["param_norm"]["a.bias"] == 0.0 for m in ranks[0]["steps"])


@pytest.mark.parametrize("kind", ["fsdp1h", "fsdp1n"])
def test_fsdp1_replicas_count_once(kind: str) -> None:
    """HYBRID_SHARD with shard groups of one rank, and NO_SHARD: each rank holds the whole."""
    ranks = _check(kind)
    assert [[(p["local_numel"] == p["numel"], p["counted"]) for p in r["hello"]] for r in ranks] == [
        [(True, True)] * 4,
        [(True, False)] * 4,
    ]

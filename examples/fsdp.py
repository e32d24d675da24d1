"""Sharded data-parallel training (FSDP2 `fully_shard`) on CPU with gloo, watched on every rank.

    torchrun --nproc-per-node 2 examples/fsdp.py --server http://127.0.0.1:8765
    torchrun --nproc-per-node 2 examples/fsdp.py --fsdp1          # FullyShardedDataParallel
    torchrun --nproc-per-node 2 examples/fsdp.py --fsdp1 --flat   # ... with use_orig_params=False

Each rank holds a piece (a shard) of every parameter, of its gradient and of Adam's state, and
gradwatch on each rank measures only its own piece: the sum of squares of its local data. The
server adds the pieces into each full tensor's exact norm, without gathering anything during
training (no collective of gradwatch's own). Parameters keep their module names (FSDP1's
`_fsdp_wrapped_module.` is stripped; with `--flat` the flat parameter is mapped back to them).

`--oracle FILE` makes the example gather the full tensors itself at every step (FSDP2:
`full_tensor()`; FSDP1: `summon_full_params`, and its optimizer state's slices all-gathered:
collectives, for checking only) and rank 0 write their norms (JSON lines), which the run's
values equal.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard

import gradwatch

FEATURES, CLASSES = 32, 9  # 9 classes: the last layer's rows do not split evenly over 2 ranks


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(FEATURES, 128), nn.GELU(), nn.Linear(128, 128), nn.GELU(), nn.LayerNorm(128), nn.Linear(128, CLASSES)
    )


def shard(model: nn.Module, world: int, fsdp1: bool, flat: bool) -> nn.Module:
    """FSDP2: each Linear its own unit, then the root (the LayerNorm); FSDP1: one unit, the root."""
    if fsdp1:
        return FullyShardedDataParallel(model, use_orig_params=not flat, device_id=torch.device("cpu"))
    mesh = init_device_mesh("cpu", (world,))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a DTensor (a collective: every rank calls it)."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def gathered_grads(model: nn.Module, fsdp1: bool) -> dict[str, float]:
    if not fsdp1:
        return {n: torch.linalg.vector_norm(full(p.grad)).item() for n, p in model.named_parameters()}
    with FullyShardedDataParallel.summon_full_params(model, with_grads=True):
        return {clean(n): torch.linalg.vector_norm(p.grad).item() for n, p in model.named_parameters()}


def gathered_state(model: nn.Module, opt: torch.optim.Optimizer, fsdp1: bool) -> dict[str, dict[str, float]]:
    norms: dict[str, dict[str, float]] = {"param_norm": {}, "exp_avg_norm": {}, "exp_avg_sq_norm": {}}
    if fsdp1:
        with FullyShardedDataParallel.summon_full_params(model):
            norms["param_norm"] = {clean(n): torch.linalg.vector_norm(p).item() for n, p in model.named_parameters()}
    else:
        norms["param_norm"] = {n: torch.linalg.vector_norm(full(p)).item() for n, p in model.named_parameters()}
    for name, p in model.named_parameters():
        for key in ("exp_avg", "exp_avg_sq"):
            state = opt.state.get(p, {}).get(key, torch.zeros(0))  # FSDP1: a rank with no slice has no state
            norms[f"{key}_norm"][clean(name)] = torch.linalg.vector_norm(
                full(state) if not fsdp1 else joined(state)
            ).item()
    return norms


def joined(piece: torch.Tensor) -> torch.Tensor:
    """FSDP1 (use_orig_params=True): every rank's 1-D slice of a parameter's state, joined in rank
    order: the whole tensor. (`FullyShardedDataParallel.optim_state_dict` would gather it too,
    but on CPU with torch 2.13 it returned `exp_avg_sq` under `exp_avg` as well.)"""
    pieces: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(pieces, piece.detach().reshape(-1))
    return torch.cat(pieces)


def clean(name: str) -> str:
    return name.replace("_fsdp_wrapped_module.", "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--server", default=None, help="gradwatch server URL (default: $GRADWATCH_SERVER or http://127.0.0.1:8765)"
    )
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=64, help="rows per step, over all ranks")
    ap.add_argument("--fsdp1", action="store_true", help="FullyShardedDataParallel instead of fully_shard")
    ap.add_argument("--flat", action="store_true", help="with --fsdp1: use_orig_params=False (one flat parameter)")
    ap.add_argument(
        "--name",
        default=None,
        help="the run's name (default: fsdp2-mlp, fsdp1-mlp...; not --run, which torchrun takes for its --run-path)",
    )
    ap.add_argument("--project", default="examples")
    ap.add_argument("--oracle", type=Path, default=None, help="gather the full tensors; rank 0 writes their norms")
    args = ap.parse_args()
    if args.steps < 1:
        ap.error("--steps must be 1 or more")
    if args.flat and not args.fsdp1:
        ap.error("--flat is an FSDP1 setting: add --fsdp1")
    if args.flat and args.oracle is not None:
        ap.error("--oracle needs the original parameters' gradients, which FSDP1 gathers only with use_orig_params")

    dist.init_process_group("gloo")  # torchrun's environment: RANK, WORLD_SIZE, MASTER_ADDR...
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.batch % world:
        ap.error(f"--batch must be a multiple of the world size ({world})")
    model = shard(build_model(), world, args.fsdp1, args.flat)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(args.steps, args.batch, FEATURES, generator=g)
    y = torch.randint(0, CLASSES, (args.steps, args.batch), generator=g)
    mine = slice(rank * args.batch // world, (rank + 1) * args.batch // world)  # this rank's rows
    run = args.name or ("fsdp1-flat-mlp" if args.flat else "fsdp1-mlp" if args.fsdp1 else "fsdp2-mlp")
    records: list[dict[str, Any]] = []

    with gradwatch.watch(opt, model=model, run=run, project=args.project, server=args.server) as w:
        if rank == 0:
            print(f"gradwatch run id: {w.run_id}", flush=True)
        for step in range(args.steps):
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(model(x[step, mine]), y[step, mine])
            loss.backward()
            w.log(loss=loss.detach())
            grads = gathered_grads(model, args.fsdp1) if args.oracle is not None else {}
            opt.step()
            if args.oracle is not None:
                records.append({"step": step + 1, "grad_norm": grads, **gathered_state(model, opt, args.fsdp1)})
            if rank == 0 and (step % 10 == 0 or step == args.steps - 1):
                print(f"step {step + 1:4d}  loss {loss.item():.4f}", flush=True)
        if rank == 0:
            print(f"done; waiting for the server to acknowledge {w.pending} messages", flush=True)
    if args.oracle is not None and rank == 0:
        args.oracle.write_text("".join(json.dumps(r) + "\n" for r in records))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""Mistake: under DDP, one step's backward runs inside `model.no_sync()`, so the ranks step on their
own, unsynchronised gradients (2 ranks, gloo, on CPU)."""

import contextlib
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

import gradwatch

EXPECTED_CODES = {"rank_desync"}
CAUSE_STEP = 4


def train(rank: int, world_size: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    torch.manual_seed(0)
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    )
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    torch.manual_seed(100 + rank)  # each rank its own batches
    data = torch.randn(256, 8)
    target = data[:, :1] * 2 - data[:, 1:2]
    w = gradwatch.watch(opt, model=model, run="mistake_ddp_step_inside_no_sync", project="corpus")
    for step in range(1, 13):
        idx = torch.randint(0, 256, (32,))
        opt.zero_grad()
        with model.no_sync() if step == CAUSE_STEP else contextlib.nullcontext():
            torch.nn.functional.mse_loss(model(data[idx]), target[idx]).backward()
        opt.step()
    w.close(timeout=30)
    if rank == 0:
        print("gradwatch run:", w.run_id, flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free_port = s.getsockname()[1]
    # Forked ranks: this process has imported torch and run no op yet (a spawned rank would
    # import torch again); the ranks and their job are the same either way.
    mp.start_processes(train, args=(2, free_port), nprocs=2, start_method="fork")

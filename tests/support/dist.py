"""Run a function on every rank of a real CPU `torch.distributed` job (gloo, one process per rank).

`run_ranks(fn, world_size=2, args=(...))` spawns `world_size` processes, initialises the default
process group in each (gloo, a free port on loopback), calls `fn(rank, world_size, *args)`, and
returns what each rank returned, in rank order. `fn` must be a module-level function (it is
pickled by name) and return something picklable. A rank that raises fails the call with that
rank's traceback. Each rank runs with one intra-op thread (`OMP_NUM_THREADS=1`), as on a real
CPU job of several ranks per machine, and the test's environment otherwise (GRADWATCH_SPOOL...).

The ranks start from multiprocessing's fork server (`forkserver`), which imports torch and the
hook once per test process (`PRELOAD`) instead of once per rank as `spawn` did: importing torch
was most of a small job's time. Like `spawn`, a rank is a fresh process of its own that imports
the test's module by name and starts no thread of the parent's; it takes the environment of the
`run_ranks` call (the fork server's own is that of its start).
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from support.server import find_free_port

#: Seconds a whole job may take before the parent gives up on it.
JOB_TIMEOUT_S = 180.0
#: What the fork server imports once, before it forks any rank (a module it cannot import is skipped).
PRELOAD = ["torch", "torch.distributed", "torch.multiprocessing", "gradwatch.watcher"]


def _rank_main(
    rank: int,
    world_size: int,
    port: int,
    out_dir: str,
    env: dict[str, str],
    fn: Callable[..., Any],
    args: Sequence[Any],
) -> None:
    os.environ.clear()
    os.environ.update(env)
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        OMP_NUM_THREADS="1",
    )
    torch.set_num_threads(1)
    out = Path(out_dir) / f"rank{rank}.pickle"
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
        try:
            result = ("ok", fn(rank, world_size, *args))
        finally:
            dist.destroy_process_group()
    except BaseException:
        result = ("error", traceback.format_exc())
    out.write_bytes(pickle.dumps(result))


def run_ranks(fn: Callable[..., Any], world_size: int = 2, args: Sequence[Any] = ()) -> list[Any]:
    """`fn(rank, world_size, *args)` on each rank of a fresh gloo job; the ranks' results in order."""
    multiprocessing.set_forkserver_preload(PRELOAD)
    with tempfile.TemporaryDirectory(prefix="gradwatch-dist-") as out_dir:
        ctx = mp.start_processes(
            _rank_main,
            args=(world_size, find_free_port(), out_dir, dict(os.environ), fn, tuple(args)),
            nprocs=world_size,
            join=False,
            start_method="forkserver",
        )
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while not ctx.join(timeout=1.0):
            if time.monotonic() > deadline:
                for process in ctx.processes:
                    process.kill()
                raise AssertionError(f"the {world_size}-rank job did not end within {JOB_TIMEOUT_S:.0f} s")
        results = []
        for rank in range(world_size):
            path = Path(out_dir) / f"rank{rank}.pickle"
            assert path.exists(), f"rank {rank} left no result"
            status, value = pickle.loads(path.read_bytes())
            assert status == "ok", f"rank {rank} raised:\n{value}"
            results.append(value)
        return results

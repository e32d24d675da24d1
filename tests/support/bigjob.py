"""A big distributed job written straight into a database through the store's own write path, as
the assembly leaves it (docs/distributed.md, "What the job keeps of each rank"): for the reads of
a 1,024-rank job (benchmarks/job_reads.py, tests/browser/test_ranks_view.py) without streaming
it, which takes minutes on a small machine.

Written: every rank's hello (`Store.open_ranks`'s `open_ranks`, the batched admission); every rank's steps (`Store.write_steps` on its
run: a `rank_steps` row each, its summary), with its scalars and per-parameter rows for its last
`rank_rows` steps only (what the assembly's pruning keeps of older steps is the summary); the job's global steps
(`Store.write_steps` on the job's run); the spread
across the ranks per step (`rank_spread`, store/spread.py); and the last rank lost `lost` steps
before the end, those steps of the job partial. Rank STRAGGLER's time before backward is 5x
the others': the spread's one outlier. What each rank sent is `rank_scalars(rank, step)`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from sqlalchemy import insert

from gradwatch_server.protocol import Hello
from gradwatch_server.schema import partial_steps
from gradwatch_server.store import StepData, Store
from gradwatch_server.store.admission import open_ranks
from gradwatch_server.store.jobs import OpenedRank
from gradwatch_server.store.rank_rows import prune
from gradwatch_server.store.spread import write_spread

STRAGGLER = 7
T0 = 1_700_000_000.0


def rank_hello(job: str, rank: int, ranks: int, params: Sequence[tuple[str, list[int]]]) -> Hello:
    """Rank `rank`'s hello: DDP replicas, counted on rank 0."""
    return Hello.model_validate(
        {
            "v": 1,
            "type": "hello",
            "run": {
                "id": f"{job}.r{rank}",
                "name": job,
                "project": "big-jobs",
                "started_at": T0,
                "hook_version": "0.1.0",
                "optimizer": "AdamW",
                "config": {"every": 1},
            },
            "params": [
                {
                    "name": name,
                    "shape": shape,
                    "numel": math.prod(shape),
                    "dtype": "bfloat16",
                    "group": 0,
                    "optimizer": 0,
                    "local_numel": math.prod(shape),
                    "counted": rank == 0,
                }
                for name, shape in params
            ],
            "groups": [{"optimizer": 0, "index": 0, "name": None, "hparams": {"lr": 3e-4}}],
            "dist": {"job": job, "rank": rank, "world_size": ranks},
        }
    )


def rank_scalars(rank: int, step: int) -> dict[str, float]:
    """What rank `rank` sends at `step`: its timings, memory, local total norm and the loss."""
    before = 0.3 * (5 if rank == STRAGGLER else 1) * (1 + 0.01 * (rank % 7))
    return {
        "loss": 2.5 - step * 1e-3,
        "time/step_s": 0.98 + 0.001 * (rank % 5),
        "time/before_backward_s": before,
        f"mem/cuda:{rank % 8}/allocated": 4.0e10 + rank * 1e6,
        "mem/rss_bytes": 8.0e9,
        "grad_norm_total": 1.0 + 0.01 * (step % 10),
    }


def param_arrays(tensors: int, rng: np.random.Generator) -> dict[str, bytes]:
    """A measured step's per-parameter rows: AdamW's four norms, the cheap counts, the status."""
    out = {m: rng.random(tensors).astype("<f4").tobytes() for m in ("grad_norm", "param_norm", "exp_avg_norm")}
    out["exp_avg_sq_norm"] = rng.random(tensors).astype("<f4").tobytes()
    out["backward_passes"] = np.ones(tensors, "<f4").tobytes()
    out["grad_clear"] = np.ones(tensors, "<f4").tobytes()
    out["grad_status"] = np.full(tensors, 2, np.uint8).tobytes()
    return out


def fill_job(
    store: Store,
    job: str,
    ranks: int,
    params: Sequence[tuple[str, list[int]]],
    steps: int,
    *,
    rank_rows: int = 5,
    lost: int = 0,
) -> None:
    """Write the job (see the module docstring): `ranks` ranks of `params`, `steps` steps."""
    rng = np.random.default_rng(0)
    hellos = [rank_hello(job, rank, ranks, params) for rank in range(ranks)]
    with store._write() as conn:  # Store.open_ranks's, opened at T0
        opened = open_ranks(conn, hellos, T0, store.param_lists)
    assert all(isinstance(r, OpenedRank) for r in opened), "a rank's hello was refused"
    rows = param_arrays(len(params), rng)  # one set of rank rows: the reads never look at their values
    summaries: list[dict[str, Any]] = []
    for rank in range(ranks):
        last = steps - (lost if rank == ranks - 1 else 0)
        batch = []
        for step in range(1, last + 1):
            sent = rank_scalars(rank, step)
            kept = step > steps - rank_rows
            batch.append(StepData(step, step, T0 + step, sent, rows if kept else {}))
            summaries.append(
                {
                    "run_id": f"{job}.r{rank}",
                    "step": step,
                    "time": T0 + step,
                    "step_s": sent["time/step_s"],
                    "before_backward_s": sent["time/before_backward_s"],
                    "memory_bytes": sent[f"mem/cuda:{rank % 8}/allocated"],
                    "local_norm": sent["grad_norm_total"],
                }
            )
        store.write_steps(f"{job}.r{rank}", batch, rank_run=True)
    with store._write() as conn:  # what the assembly does with the job's steps (store/jobs.py `_write`, `_prune`)
        prune(conn, [f"{job}.r{rank}" for rank in range(ranks)], 0, steps - rank_rows, [])
        write_spread(conn, job, summaries)
    batch = [
        StepData(
            step, step, T0 + step, {**rank_scalars(0, step), "dist/ranks": float(ranks)}, param_arrays(len(params), rng)
        )
        for step in range(1, steps + 1)
    ]
    for lo in range(0, len(batch), 100):
        store.write_steps(job, batch[lo : lo + 100])
    if lost:
        missing = json.dumps([ranks - 1])
        with store._write() as conn:
            conn.execute(
                insert(partial_steps),
                [{"run_id": job, "step": s, "missing": missing} for s in range(steps - lost + 1, steps + 1)],
            )

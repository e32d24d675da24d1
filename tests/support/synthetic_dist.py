"""A distributed job built by hand as wire protocol v1 messages (docs/protocol.md, DIST-SPEC):
one `SyntheticRun` per rank, each with `dist` in its hello, its own stream id `JOB.rRANK`, the
full shapes with this rank's share in `local_numel`, and the per-rank scalars every rank sends
(`time/step_s`, `time/before_backward_s`, its own CUDA device's memory).

Every scalar a rank sent is kept (`RankRun.sent`), so that tests compare what the server serves
with what went over the wire. Each rank's stream goes through a real websocket (`Ingest`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from support.synthetic import Ingest, SyntheticRun

#: Small parameters: a few tensors, so that a job of several ranks seeds in a blink.
SMALL = [("embed.weight", [16, 8]), ("block.fc.weight", [8, 8]), ("block.fc.bias", [8]), ("head.weight", [4, 8])]


@dataclass
class RankRun(SyntheticRun):
    """Rank `rank` of job `job` (world size `world_size`); `before_backward_s` sets how long its
    forward pass takes (a straggler's is longer), and the step time follows it."""

    job: str = "job"
    rank: int = 0
    world_size: int = 2
    before_backward_s: float = 0.01
    sent: dict[int, dict[str, Any]] = field(default_factory=dict)

    def hello(self) -> dict[str, Any]:
        hello = super().hello()
        hello["dist"] = {"job": self.job, "rank": self.rank, "world_size": self.world_size}
        for p in hello["params"]:
            # FSDP-like: dim 0 split across the ranks, every piece counted.
            rows = p["shape"][0]
            share = rows // self.world_size + (1 if self.rank < rows % self.world_size else 0)
            p["local_numel"] = share * (p["numel"] // rows)
            p["counted"] = True
        return hello

    def step(self, seq: int, step: int) -> dict[str, Any]:
        message = super().step(seq, step)
        scalars = {k: v for k, v in message["scalars"].items() if not k.startswith("mem/cuda:")}
        wobble = 1 + 0.1 * math.sin(step / 3 + self.rank)
        scalars["time/before_backward_s"] = self.before_backward_s * wobble
        scalars["time/step_s"] = self.before_backward_s * wobble + 0.03
        scalars[f"mem/cuda:{self.rank}/allocated"] = 1.0e8 * (1 + self.rank) + 1.0e5 * step
        scalars[f"mem/cuda:{self.rank}/reserved"] = 2.0e8 * (1 + self.rank)
        message["scalars"] = scalars
        self.sent[step] = scalars
        return message


def rank_runs(
    job: str, name: str, world_size: int, *, straggler: int | None = None, params: list[tuple[str, list[int]]] = SMALL
) -> list[RankRun]:
    """The ranks of one job, each with its own seed (its own shard's gradients); `straggler`'s
    forward pass takes five times as long as the others'."""
    return [
        RankRun(
            f"{job}.r{rank}",
            name,
            params=list(params),
            seed=rank,
            total_steps=200,
            job=job,
            rank=rank,
            world_size=world_size,
            before_backward_s=0.05 if rank == straggler else 0.01,
        )
        for rank in range(world_size)
    ]


def send_job(ws_url: str, ranks: list[RankRun], steps: int, lost: dict[int, int] | None = None) -> None:
    """Every rank sends steps 1..`steps` over its own websocket, a few steps at a time in turn,
    and once every rank has sent its last step, each closes `finished`; a rank in `lost` ({rank:
    its last step}) stops there and its connection drops without a close (the server marks it
    crashed after its grace period).

    The closes come last, as a real job's ranks end together: a rank's close waits (up to the
    server's JOB_CLOSE_WAIT_S, 2 s) for the job to hold its last step, which the ranks after it
    had not sent yet when each closed in its turn (a 48-rank job spent most of its 36 s so)."""
    lost = lost or {}
    hooks = [Ingest(ws_url, r) for r in ranks]
    try:
        done = dict.fromkeys(range(len(ranks)), False)
        while not all(done.values()):
            for rank, hook in enumerate(hooks):
                if done[rank]:
                    continue
                last = lost.get(rank, steps)
                count = min(5, last - hook.last_step)
                if count > 0:
                    hook.steps(count)
                if hook.last_step >= last:
                    done[rank] = True
                    if rank in lost:
                        hook.__exit__(None, None, None)  # a lost rank's connection drops here, mid-job
        for rank, hook in enumerate(hooks):
            if rank not in lost:
                hook.close("finished")
                hook.__exit__(None, None, None)
    finally:
        for hook in hooks:
            hook.__exit__(None, None, None)

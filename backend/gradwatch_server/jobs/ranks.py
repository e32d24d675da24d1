"""What GET /api/runs/{id}/ranks answers: a distributed job's ranks, which of them were lost, and
its partial steps (docs/api.md, Ranks)."""

from __future__ import annotations

from ..models import PartialPublic, PartialRangePublic, RankPublic, RanksPublic
from ..store import PartialRange, Run, Store
from .memory import JobMemory


class NotAJob(ValueError):
    """The run is one rank's stream of a job: its job's run has the ranks (a 400 naming it)."""


def is_job(run: Run) -> bool:
    """A distributed job's parent run (not one rank's own run)."""
    return run.kind == "job"


def left_behind(ranks: list[Run], ranges: list[PartialRange]) -> set[int]:
    """Ranks that stopped while others went on and were assembled without: not finished, and
    missing from the job's last partial range, which lies after the rank's last step (a rank that
    fell behind and came back is missing from earlier ranges only; one that closed early finished)."""
    if not ranges:
        return set()
    last = ranges[-1]
    return {
        r.rank
        for r in ranks
        if r.rank is not None
        and r.status != "finished"
        and r.rank in last.missing
        and (r.last_step is None or r.last_step < last.last)
    }


def job_ranks(
    store: Store, run: Run, rank_timeout: float, since: float | None = None, memory: JobMemory | None = None
) -> RanksPublic:
    """The job's ranks by rank, and its partial steps; a single-process run has none. A rank is
    lost when it is running but silent for `rank_timeout` (counted from `since` at the earliest:
    when this server process first saw the job) while another is ahead (the assembly's rule,
    `Store.lost_ranks`), or when it was left behind (`left_behind`: it crashed or timed out and
    the job went on without it). `memory`: what the asking process heard of the ranks (a rank
    queued behind its writer is slow, not lost)."""
    if run.kind == "rank":
        raise NotAJob(
            f"run {run.id!r} is rank {run.rank} of job {run.parent_id!r}: "
            f"GET /api/runs/{run.parent_id}/ranks lists the job's ranks"
        )
    if not is_job(run):
        return RanksPublic(world_size=1, ranks=[], partial=PartialPublic(steps=0, ranges=[]))
    children = store.rank_runs(run.id)
    ranges = store.partial_ranges(run.id)
    lost = left_behind(children, ranges) | set(store.lost_ranks(run.id, rank_timeout, since, memory))
    return RanksPublic(
        world_size=run.world_size or 1,
        ranks=[
            RankPublic(
                rank=c.rank or 0,
                run_id=c.id,
                status=c.status,  # type: ignore[arg-type]  # one of RUN_STATUSES, checked by the model
                last_step=c.last_step,
                steps=c.steps,
                updated_at=c.updated_at,
                lost=c.rank in lost,
            )
            for c in children
        ],
        partial=PartialPublic(
            steps=sum(r.steps for r in ranges),
            ranges=[PartialRangePublic(first=r.first, last=r.last, missing=r.missing) for r in ranges],
        ),
    )

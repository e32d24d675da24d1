"""A distributed job's ranks: each rank's own run, the lost ranks and the partial steps."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException, Query

from ..deps import JobsDep, RunDep, SettingsDep, StoreDep
from ..jobs.rank_spread import spread
from ..jobs.ranks import NotAJob, job_ranks
from ..models import RankOutlierPublic, RankSpreadPublic, RanksPublic

router = APIRouter(prefix="/runs/{run_id}", tags=["runs"])


@router.get("/ranks", responses={400: {"description": "the run is a rank's own run: ask its job's"}})
def ranks(run: RunDep, store: StoreDep, settings: SettingsDep, jobs: JobsDep) -> RanksPublic:
    """The job's ranks (child run id, status, last step, steps, last change, lost) and its partial
    steps as ranges with the ranks they miss; a single-process run has `world_size` 1 and none."""
    try:
        return job_ranks(store, run, settings.rank_timeout_s, jobs.since(run.id), jobs.memory(run.id))
    except NotAJob as exc:
        raise HTTPException(400, str(exc)) from None


#: Steps of the window the spread covers (the job's last ones), by default and at most.
SPREAD_STEPS, MAX_SPREAD_STEPS = 200, 2000
SpreadMetric = Literal["time/step_s", "time/before_backward_s", "memory", "grad_norm_total"]


@router.get("/ranks/spread", responses={400: {"description": "the run is a rank's own run: ask its job's"}})
def ranks_spread(
    run: RunDep,
    store: StoreDep,
    metric: SpreadMetric,
    steps: Annotated[int, Query(ge=1, le=MAX_SPREAD_STEPS)] = SPREAD_STEPS,
) -> RankSpreadPublic:
    """A per-rank scalar across the job's ranks over its last `steps` steps: per step its
    quantiles (min, p5, p50, p95, max) and the outlier ranks, judged on the window's last steps
    up to 16,384 rank values (`memory`: each rank's CUDA allocated bytes, else its resident set).
    A single-process run has no ranks: empty lists."""
    if run.parent_id is not None:
        raise HTTPException(400, f"run {run.id!r} is a rank of job {run.parent_id!r}: ask the job's spread")
    rows = store.rank_spread(run.id, metric, steps)
    found = spread(rows.steps, rows.quantiles, rows.rank, rows.value)
    low, p5, p50, p95, high = found.quantiles
    return RankSpreadPublic(
        metric=metric,
        ranks=found.ranks,
        steps=found.steps,
        min=low,
        p5=p5,
        p50=p50,
        p95=p95,
        max=high,
        outliers=[
            RankOutlierPublic(rank=o.rank, median=o.median, others=o.others, high=o.high) for o in found.outliers
        ],
    )

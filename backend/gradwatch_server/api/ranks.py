"""A distributed job's ranks: each rank's own run, the lost ranks and the partial steps."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException

from ..deps import JobsDep, RunDep, SettingsDep, StoreDep
from ..jobs.ranks import NotAJob, job_ranks
from ..models import RanksPublic

router = APIRouter(prefix="/runs/{run_id}", tags=["runs"])


@router.get("/ranks", responses={400: {"description": "the run is a rank's own run: ask its job's"}})
def ranks(run: RunDep, store: StoreDep, settings: SettingsDep, jobs: JobsDep) -> RanksPublic:
    """The job's ranks (child run id, status, last step, steps, last change, lost) and its partial
    steps as ranges with the ranks they miss; a single-process run has `world_size` 1 and none."""
    try:
        return job_ranks(store, run, settings.rank_timeout_s, jobs.since(run.id))
    except NotAJob as exc:
        raise HTTPException(400, str(exc)) from None

"""Runs: list, one run, its parameters, param groups and series names; rename, tag and delete
(token-guarded)."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Query, Response

from ..deps import DiagnosticsDep, JobsDep, RunDep, StoreDep, TokenDep
from ..models import (
    MAX_TAG_LENGTH,
    GroupPublic,
    GroupsPublic,
    MetricsPublic,
    ParamPublic,
    ParamsPublic,
    RunPublic,
    RunsPublic,
    RunStatus,
    RunUpdate,
)

router = APIRouter(prefix="/runs", tags=["runs"])


@router.get("")
def list_runs(
    store: StoreDep,
    project: Annotated[str | None, Query(description="exact project name")] = None,
    q: Annotated[str | None, Query(max_length=256, description="substring of name or project, any case")] = None,
    status: RunStatus | None = None,
    tag: Annotated[str | None, Query(max_length=MAX_TAG_LENGTH, description="runs with this tag (exact)")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=2**62, description="runs to skip (newest first)")] = 0,
) -> RunsPublic:
    """Runs, newest first, each with its tags and findings counts; `count` is the number of all matches."""
    found, count = store.list_runs(project=project, q=q, status=status, tag=tag, limit=limit, offset=offset)
    return RunsPublic(data=[RunPublic.of(r) for r in found], count=count)


@router.get("/{run_id}")
def get_run(run: RunDep) -> RunPublic:
    return RunPublic.of(run)


@router.patch("/{run_id}", dependencies=[TokenDep])
def update_run(run: RunDep, update: RunUpdate, store: StoreDep) -> RunPublic:
    """Rename the run (`name`), replace its tags (`tags`), or both."""
    store.update_run(run.id, name=update.name, tags=update.tags)
    return RunPublic.of(store.get_run(run.id) or run)


@router.delete("/{run_id}", dependencies=[TokenDep], status_code=204)
async def delete_run(run: RunDep, store: StoreDep, diagnostics: DiagnosticsDep, jobs: JobsDep) -> Response:
    """Delete the run and all its data."""
    await asyncio.to_thread(store.delete_run, run.id)
    diagnostics.forget(run.id)
    jobs.forget(run.id)  # on the event loop, which the job assembler's state belongs to
    return Response(status_code=204)


@router.get("/{run_id}/params")
def get_params(run: RunDep, store: StoreDep) -> ParamsPublic:
    """The run's parameters, in the order of the per-parameter arrays."""
    found = store.get_params(run.id)
    return ParamsPublic(data=[ParamPublic.of(p) for p in found], count=len(found))


@router.get("/{run_id}/groups")
def get_groups(run: RunDep, store: StoreDep) -> GroupsPublic:
    """The run's param groups and their settings (learning rate, ...) as the hook saw them at start."""
    found = store.get_groups(run.id)
    return GroupsPublic(data=[GroupPublic.of(g) for g in found], count=len(found))


@router.get("/{run_id}/metrics")
def get_metrics(run: RunDep, store: StoreDep) -> MetricsPublic:
    """Names of the run's scalar series and per-parameter metrics."""
    return MetricsPublic(scalars=store.series_names(run.id, "scalar"), params=store.series_names(run.id, "param"))

"""Chart data: one scalar's series, per-parameter series, the parameter x step heatmap."""
from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query

from .. import charts
from ..deps import RunDep, StoreDep
from ..models import Heatmap, ParamSeriesPublic, Series
from ..protocol import MAX_INT64

router = APIRouter(prefix="/runs/{run_id}", tags=["series"])

Start = Annotated[int | None, Query(ge=0, le=MAX_INT64, description="first step, inclusive")]
End = Annotated[int | None, Query(ge=0, le=MAX_INT64, description="last step, inclusive")]
MaxPoints = Annotated[int, Query(ge=2, le=100_000, description="downsample above this many steps")]
Name = Annotated[str, Query(min_length=1, max_length=128)]


@router.get("/series")
def scalar_series(run: RunDep, store: StoreDep, key: Name, start: Start = None, end: End = None,
                  max_points: MaxPoints = 2000) -> Series:
    return charts.scalar_series(store, run.id, key, start, end, max_points)


@router.get("/params/series")
def param_series(
    run: RunDep,
    store: StoreDep,
    metric: Name,
    param: Annotated[list[str] | None, Query(max_length=100, description="parameter names (repeat)")] = None,
    top: Annotated[int, Query(ge=1, le=100, description="without `param`: this many parameters")] = 5,
    order: Annotated[Literal["desc", "asc"], Query(description="largest or smallest first")] = "desc",
    start: Start = None,
    end: End = None,
    max_points: MaxPoints = 2000,
) -> ParamSeriesPublic:
    """Parameters by name, or the `top` by the metric's value at the last step of the window."""
    return charts.param_series(store, run.id, store.get_params(run.id), metric, param or [], top, order,
                               start, end, max_points)


@router.get("/heatmap")
def heatmap(run: RunDep, store: StoreDep, metric: Name, start: Start = None, end: End = None,
            max_steps: Annotated[int, Query(ge=1, le=5000)] = 400) -> Heatmap:
    return charts.heatmap(store, run.id, store.get_params(run.id), metric, start, end, max_steps)

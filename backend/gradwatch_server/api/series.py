"""Chart data: one scalar's series, per-parameter series, the parameter x step heatmap."""

from __future__ import annotations

from typing import Annotated, Literal

import pydantic_core
from fastapi import APIRouter, Query, Response

from .. import charts, spread
from ..deps import RunDep, StoreDep
from ..models import Heatmap, ParamSeriesPublic, Series, Spread
from ..protocol import MAX_INT64
from ..store import Param, Store

router = APIRouter(prefix="/runs/{run_id}", tags=["series"])

Start = Annotated[int | None, Query(ge=0, le=MAX_INT64, description="first step, inclusive")]
End = Annotated[int | None, Query(ge=0, le=MAX_INT64, description="last step, inclusive")]
MaxPoints = Annotated[int, Query(ge=2, le=100_000, description="downsample above this many steps")]
Name = Annotated[str, Query(min_length=1, max_length=128)]
WithTime = Annotated[
    bool, Query(description="add `time` (each point's wall time) and `time0` (the run's first step's)")
]
Smooth = Annotated[
    float,
    Query(
        ge=0,
        le=0.999,
        description=(
            "TensorBoard's debiased exponential moving average with this weight (0: none, up to 0.999), "
            "applied to the raw series from the run's first step, then windowed and downsampled; a 422 when "
            f"the series has more than {charts.SMOOTH_ROWS} stored steps up to `end`"
        ),
    ),
]
CellEncoding = Annotated[
    charts.Encoding,
    Query(
        description=(
            "json: the cells in `z`; f32: `z` null and the cells in `z_f32`, base64 float32 (under a third "
            "of the bytes for a float metric, and no number for the browser to parse)"
        )
    ),
]


# exclude_unset: `time` and `time0` appear only when asked for; every other field is always set.
@router.get("/series", response_model_exclude_unset=True)
def scalar_series(
    run: RunDep,
    store: StoreDep,
    key: Name,
    start: Start = None,
    end: End = None,
    max_points: MaxPoints = 2000,
    time: WithTime = False,
    smooth: Smooth = 0.0,
) -> Series:
    return charts.scalar_series(store, run.id, key, start, end, max_points, with_time=time, smooth=smooth)


@router.get("/params/series", response_model_exclude_unset=True)
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
    time: WithTime = False,
    smooth: Smooth = 0.0,
    rank_by: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=128,
            description=(
                "without `param`: choose the `top` by this metric's value at the last step of the window "
                "rather than by `metric`'s (the dashboard draws the optimizer state of the parameters "
                "with the largest gradients)"
            ),
        ),
    ] = None,
) -> ParamSeriesPublic:
    """Parameters by name, or the `top` by the metric's (or `rank_by`'s) value at the last step of the window."""
    params = store.get_params(run.id)
    names = param or []
    if not names and rank_by is not None and rank_by != metric:
        names = _top_by(store, run.id, params, rank_by, top, order, start, end)
        if not names:  # nothing stored in the window yet
            _known(store, run.id, metric)
            return ParamSeriesPublic(metric=metric, downsampled=False, step=[], series=[])
    return charts.param_series(
        store, run.id, params, metric, names, top, order, start, end, max_points, with_time=time, smooth=smooth
    )


@router.get("/params/spread")
def param_spread(
    run: RunDep,
    store: StoreDep,
    metric: Name = "grad_norm",
    start: Start = None,
    end: End = None,
    max_points: MaxPoints = 500,
) -> Spread:
    """Min, quartiles, median and max of a metric across the parameters at each step (a bucket's
    parameter means when downsampled): docs/api.md, Spread."""
    return spread.spread(store, run.id, run.param_count, metric, start, end, max_points)


def _known(store: Store, run_id: str, metric: str) -> None:
    known = store.series_names(run_id, "param")
    if metric not in known:
        listed = ", ".join(known[:20]) or "none yet"
        raise charts.NotFound(f"run {run_id!r} has no parameter metric {metric!r} (it has: {listed})")


def _top_by(
    store: Store,
    run_id: str,
    params: list[Param],
    metric: str,
    top: int,
    order: Literal["desc", "asc"],
    start: int | None,
    end: int | None,
) -> list[str]:
    """The names of the `top` parameters by `metric` at the last step of [start, end]."""
    _known(store, run_id, metric)
    last = store.last_metric_row(run_id, metric, start, end)
    return [] if last is None else [params[i].name for i in charts.top_indices(last[1], top, order)]


@router.get("/heatmap", response_model=Heatmap)
def heatmap(
    run: RunDep,
    store: StoreDep,
    metric: Name,
    start: Start = None,
    end: End = None,
    max_steps: Annotated[int, Query(ge=1, le=5000)] = 400,
    encoding: CellEncoding = "json",
) -> Response:
    # Up to millions of cells, already JSON values: pydantic-core writes them as they are, much
    # faster than through the model's union type (docs/benchmarks.md). Fields left unset (z_f32
    # in a JSON answer) stay out of the body.
    grid = charts.heatmap(store, run.id, store.get_params(run.id), metric, start, end, max_steps, encoding=encoding)
    body = {k: v for k, v in dict(grid).items() if k in grid.model_fields_set}
    return Response(pydantic_core.to_json(body), media_type="application/json")

"""Export a run as a streamed download: CSV, JSON lines or Parquet; per parameter or per step."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import StreamingResponse

from ..deps import RunDep, StoreDep
from ..exporters import FORMATS, safe_filename
from ..step_table import STEP_FORMATS

router = APIRouter(prefix="/runs/{run_id}", tags=["export"])

Table = Literal["params", "steps"]


@router.get("/export", response_class=StreamingResponse)
def export(
    run: RunDep,
    store: StoreDep,
    format_name: Annotated[str, Query(alias="format", description="csv, json (JSON lines) or parquet")] = "csv",
    table: Annotated[
        Table,
        Query(
            description=(
                "params: one row per (step, parameter), the per-parameter metrics (json: the whole run, "
                "re-importable); steps: one row per step, one column per scalar (loss, learning rates, "
                "grad_norm_total, memory, user scalars)"
            )
        ),
    ] = "params",
    ranks: Annotated[
        bool,
        Query(
            description=(
                "a distributed job's run: also each rank's own rows, after the job's, with a last column "
                "`rank` (false: the job's global rows alone, without the column); no effect on other runs"
            )
        ),
    ] = True,
) -> StreamingResponse:
    """The run's data, streamed as a download (docs/api.md, Export)."""
    formats = STEP_FORMATS if table == "steps" else FORMATS
    fmt = formats.get(format_name)
    if fmt is None:
        raise HTTPException(400, f"format must be one of {', '.join(formats)}")
    filename = safe_filename(run, f"steps.{fmt.suffix}" if table == "steps" else fmt.suffix)
    return StreamingResponse(
        fmt.write(store, run, None, ranks=ranks),
        media_type=fmt.media_type,
        headers={"Content-Disposition": f'attachment; filename="{filename}"'},
    )

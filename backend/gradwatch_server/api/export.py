"""Export a run as a streamed download: CSV, JSON lines or Parquet."""
from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import StreamingResponse

from ..deps import RunDep, StoreDep
from ..exporters import FORMATS, safe_filename

router = APIRouter(prefix="/runs/{run_id}", tags=["export"])


@router.get("/export", response_class=StreamingResponse)
def export(run: RunDep, store: StoreDep,
           format_name: Annotated[str, Query(alias="format", description="csv, json (JSON lines) or parquet")] = "csv",
           ) -> StreamingResponse:
    """The run's data, streamed as a download (docs/api.md, Export)."""
    fmt = FORMATS.get(format_name)
    if fmt is None:
        raise HTTPException(400, f"format must be one of {', '.join(FORMATS)}")
    filename = safe_filename(run, fmt.suffix)
    return StreamingResponse(fmt.write(store, run, None), media_type=fmt.media_type,
                             headers={"Content-Disposition": f'attachment; filename="{filename}"'})

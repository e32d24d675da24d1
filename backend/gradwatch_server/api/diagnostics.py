"""Diagnostics: findings about a run (see DESIGN.md, Diagnostics, for the codes)."""
from __future__ import annotations

from fastapi import APIRouter

from ..deps import RunDep
from ..models import Finding

router = APIRouter(prefix="/runs/{run_id}", tags=["diagnostics"])


@router.get("/diagnostics")
def diagnostics(run: RunDep) -> list[Finding]:
    """Findings, each {code, severity, message, params, first_step}; none are computed yet."""
    return []

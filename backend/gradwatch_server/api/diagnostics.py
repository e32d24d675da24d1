"""Diagnostics: findings about a run (the codes: docs/diagnostics.md)."""

from __future__ import annotations

from fastapi import APIRouter

from ..deps import DiagnosticsDep, RunDep
from ..models import Finding

router = APIRouter(prefix="/runs/{run_id}", tags=["diagnostics"])


@router.get("/diagnostics")
def diagnostics(run: RunDep, engine: DiagnosticsDep) -> list[Finding]:
    """Findings, in the order they began: each {code, severity, message, params, first_step, figure}.

    Live runs are diagnosed as their steps arrive; a stored or imported run whose findings are
    missing or stale is diagnosed from its stored steps on this request. A rank's run of a
    distributed job has none (its job's run has the findings).
    """
    if run.kind == "rank":
        return []  # a rank's run is not diagnosed: its job's run is, on the assembled steps
    found = engine.findings(run.id, steps=run.steps, running=run.status == "running")
    return [Finding.model_validate(f.to_dict()) for f in found]

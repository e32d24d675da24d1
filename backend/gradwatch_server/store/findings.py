"""Diagnostic findings of runs, and how far each run's diagnosis goes."""

from __future__ import annotations

import json
from collections.abc import Sequence

from sqlalchemy import Connection, delete, insert, select

from ..schema import diagnoses, findings, runs
from .records import DiagnosisMark, StoredFinding, UnknownRun


def save_findings(
    conn: Connection, run_id: str, found: Sequence[StoredFinding], mark: DiagnosisMark | None, replace: bool, now: float
) -> None:
    """Store findings (each replaces the run's finding of its code) and the mark; `replace`
    first removes every other finding of the run (a fresh diagnosis)."""
    if conn.execute(select(runs.c.id).where(runs.c.id == run_id)).one_or_none() is None:
        raise UnknownRun(f"no run {run_id!r}")
    if replace:
        conn.execute(delete(findings).where(findings.c.run_id == run_id))
    elif found:
        conn.execute(delete(findings).where(findings.c.run_id == run_id, findings.c.code.in_([f.code for f in found])))
    if found:
        conn.execute(
            insert(findings),
            [
                {
                    "run_id": run_id,
                    "code": f.code,
                    "severity": f.severity,
                    "message": f.message,
                    "params": json.dumps(f.params),
                    "first_step": f.first_step,
                    "figure": None if f.figure is None else json.dumps(f.figure, allow_nan=False),
                    "updated_at": now,
                }
                for f in found
            ],
        )
    if mark is not None:
        conn.execute(delete(diagnoses).where(diagnoses.c.run_id == run_id))
        conn.execute(
            insert(diagnoses).values(
                run_id=run_id, steps=mark.steps, last_step=mark.last_step, version=mark.version, updated_at=now
            )
        )


def get_findings(conn: Connection, run_id: str) -> list[StoredFinding]:
    """A run's stored findings, in the order they were first seen."""
    rows = conn.execute(select(findings).where(findings.c.run_id == run_id)).all()
    found = [
        StoredFinding(
            code=r.code,
            severity=r.severity,
            message=r.message,
            params=json.loads(r.params),
            first_step=r.first_step,
            figure=None if r.figure is None else json.loads(r.figure),
        )
        for r in rows
    ]
    return sorted(found, key=lambda f: (f.first_step is not None, f.first_step or 0, f.code))


def get_diagnosis(conn: Connection, run_id: str) -> DiagnosisMark | None:
    """How far the stored findings of a run go (None: never diagnosed)."""
    row = conn.execute(select(diagnoses).where(diagnoses.c.run_id == run_id)).one_or_none()
    return None if row is None else DiagnosisMark(steps=row.steps, last_step=row.last_step, version=row.version)

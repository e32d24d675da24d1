"""Diagnostic findings of runs, and how far each run's diagnosis goes."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, Table, delete, select
from sqlalchemy.dialects import postgresql, sqlite

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
    if found:
        _upsert(
            conn,
            findings,
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
        _upsert(
            conn,
            diagnoses,
            [
                {
                    "run_id": run_id,
                    "steps": mark.steps,
                    "last_step": mark.last_step,
                    "version": mark.version,
                    "updated_at": now,
                }
            ],
        )


def _upsert(conn: Connection, table: Table, rows: Sequence[Mapping[str, Any]]) -> None:
    """Insert `rows`, each replacing the row of its primary key. Not a delete and an insert: on
    PostgreSQL writers do not take turns, and two transactions diagnosing the same new run (the
    ranks of one job saying hello to two workers at once) would both find no row to delete and
    the second insert would fail on the key (tests/backend/test_store.py)."""
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    stmt = dialect.insert(table)
    keys = [c.name for c in table.primary_key.columns]
    conn.execute(
        stmt.on_conflict_do_update(index_elements=keys, set_={c: stmt.excluded[c] for c in rows[0] if c not in keys}),
        list(rows),
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

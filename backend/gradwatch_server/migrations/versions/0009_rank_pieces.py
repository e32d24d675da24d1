"""A rank's pieces of its job's parameters in one column (runs.pieces, JSON: `counted` one flag or
one per parameter, `local_numel` null or one count per parameter): a rank's run shares its job's
parameter list instead of keeping a copy of it (700 rows per rank at a job's start). Ranks stored
before keep their rows, which are read as before.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("pieces", sa.Text, nullable=True))


def downgrade() -> None:
    # A rank's run stored with pieces only gets its rows back: the job's rows with its pieces.
    conn = op.get_bind()
    rows = conn.execute(sa.text("SELECT id, parent_id, pieces FROM runs WHERE pieces IS NOT NULL")).all()
    for run_id, parent_id, pieces in rows:
        given = json.loads(pieces)
        job = conn.execute(
            sa.text(
                "SELECT idx, name, shape, numel, dtype, group_idx, optimizer_idx FROM params "
                "WHERE run_id = :job ORDER BY idx"
            ),
            {"job": parent_id},
        ).all()
        counted = given["counted"]
        local = given["local_numel"]
        for p in job:
            conn.execute(
                sa.text(
                    "INSERT INTO params (run_id, idx, name, shape, numel, dtype, group_idx, optimizer_idx, "
                    "local_numel, counted) VALUES (:run_id, :idx, :name, :shape, :numel, :dtype, :group_idx, "
                    ":optimizer_idx, :local_numel, :counted)"
                ),
                {
                    "run_id": run_id,
                    "idx": p.idx,
                    "name": p.name,
                    "shape": p.shape,
                    "numel": p.numel,
                    "dtype": p.dtype,
                    "group_idx": p.group_idx,
                    "optimizer_idx": p.optimizer_idx,
                    "local_numel": p.numel if local is None else local[p.idx],
                    "counted": bool(counted[p.idx] if isinstance(counted, list) else counted),
                },
            )
    op.drop_column("runs", "pieces")

"""A run's kind as a column (runs.kind: run, job or rank), filled from what 0006 left to guess it
from; and a rank's summary per step (rank_summaries: step time, time before backward, memory,
local total norm), what a job keeps of each rank's step once its per-parameter rows are pruned.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("kind", sa.String(8), nullable=False, server_default="run"))
    op.execute(sa.text("UPDATE runs SET kind = 'rank' WHERE parent_id IS NOT NULL"))
    op.execute(sa.text("UPDATE runs SET kind = 'job' WHERE parent_id IS NULL AND world_size IS NOT NULL"))
    op.create_table(
        "rank_summaries",
        sa.Column("run_id", sa.String(64), sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("step", sa.BigInteger, primary_key=True),
        sa.Column("time", sa.Double, nullable=False),
        sa.Column("step_s", sa.Double),
        sa.Column("before_backward_s", sa.Double),
        sa.Column("memory_bytes", sa.Double),
        sa.Column("local_norm", sa.Double),
        sqlite_with_rowid=False,
    )


def downgrade() -> None:
    op.drop_table("rank_summaries")
    # ALTER TABLE ... DROP COLUMN in place (SQLite >= 3.35): a batch rebuild of `runs` would drop
    # the old table, and with it, by cascade, every run's stored rows.
    op.drop_column("runs", "kind")

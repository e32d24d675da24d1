"""The spread across a job's ranks per step (rank_spread: the count and quantiles of each per-rank
figure over the ranks' summaries of the step), written by the assembly with the summaries, so
that the Ranks section of a big job reads a row per step. Steps of jobs assembled before this
revision have none: their spread is computed from the summaries when asked (store/spread.py).
A new table only: `runs` is not rebuilt (on SQLite that would cascade-delete every run's rows).

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "rank_spread",
        sa.Column("run_id", sa.String(64), sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("metric", sa.String(32), primary_key=True),
        sa.Column("step", sa.BigInteger, primary_key=True),
        sa.Column("count", sa.Integer, nullable=False),
        sa.Column("lo", sa.Double),
        sa.Column("p5", sa.Double),
        sa.Column("p50", sa.Double),
        sa.Column("p95", sa.Double),
        sa.Column("hi", sa.Double),
        sqlite_with_rowid=False,
    )


def downgrade() -> None:
    op.drop_table("rank_spread")

"""Step blocks: summaries of aligned blocks of a series' steps (blocks.py), computed for the
runs already stored.

Revision ID: 0004
Revises: 0003
Create Date: 2025-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "metric_blocks",
        sa.Column("run_id", sa.String(64), sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("kind", sa.String(8), primary_key=True),
        sa.Column("metric", sa.String(128), primary_key=True),
        sa.Column("size", sa.Integer, primary_key=True),
        sa.Column("block", sa.BigInteger, primary_key=True),
        sa.Column("part", sa.Integer, primary_key=True),
        sa.Column("first_step", sa.BigInteger, nullable=False),
        sa.Column("step_count", sa.Integer, nullable=False),
        sa.Column("data", sa.LargeBinary, nullable=False),
    )
    # Reads trust the blocks of every closed block: fill them for the runs stored before this
    # revision (in the migration's transaction; a run at a time, a range of steps at a time).
    from gradwatch_server.store import backfill_blocks

    backfill_blocks(op.get_bind())


def downgrade() -> None:
    op.drop_table("metric_blocks")

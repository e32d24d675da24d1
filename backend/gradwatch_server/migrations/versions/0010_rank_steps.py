"""A rank's step as one row (rank_steps: its summary in columns, its scalars packed and a DDP
replica's grad_digest for the recent window) and the key sets of the packed scalars (rank_keys),
replacing the ~20 rows a rank-step was stored as (`steps`, `scalars`, `rank_summaries`). New
tables only: `runs` is not rebuilt (on SQLite that would cascade-delete every run's rows), and
the rows of ranks stored before stay where they are and are read as before (store/rank_rows.py).

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def _run_id() -> sa.Column[str]:
    return sa.Column("run_id", sa.String(64), sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)


def upgrade() -> None:
    op.create_table(
        "rank_steps",
        _run_id(),
        sa.Column("step", sa.BigInteger, primary_key=True),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("time", sa.Double, nullable=False),
        sa.Column("step_s", sa.Double),
        sa.Column("before_backward_s", sa.Double),
        sa.Column("memory_bytes", sa.Double),
        sa.Column("local_norm", sa.Double),
        sa.Column("digest", sa.String(64)),
        sa.Column("key_set", sa.BigInteger),
        sa.Column("scalars", sa.LargeBinary),
        sqlite_with_rowid=False,
    )
    op.create_table(
        "rank_keys",
        _run_id(),
        sa.Column("id", sa.BigInteger, primary_key=True),
        sa.Column("keys", sa.Text, nullable=False),
        sqlite_with_rowid=False,
    )


def downgrade() -> None:
    op.drop_table("rank_keys")
    op.drop_table("rank_steps")

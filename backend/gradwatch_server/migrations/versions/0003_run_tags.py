"""Run tags: one row per (run, tag), indexed by tag for `GET /api/runs?tag=`.

Revision ID: 0003
Revises: 0002
Create Date: 2025-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def _run_id() -> sa.Column[str]:
    return sa.Column("run_id", sa.String(64), sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)


def upgrade() -> None:
    op.create_table(
        "run_tags",
        _run_id(),
        sa.Column("tag", sa.String(64), primary_key=True),
        sa.Column("position", sa.Integer, nullable=False),
        sqlite_with_rowid=False,
    )
    op.create_index("ix_run_tags_tag", "run_tags", ["tag"])


def downgrade() -> None:
    op.drop_index("ix_run_tags_tag", "run_tags")
    op.drop_table("run_tags")

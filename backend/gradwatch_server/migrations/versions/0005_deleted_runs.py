"""Deleted runs: the id and time of each run deleted, so that asking for one says it was
deleted rather than that it never existed.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "deleted_runs",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("deleted_at", sa.Double, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("deleted_runs")

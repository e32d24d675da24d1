"""Diagnostics: findings per run, and how far each run's findings go.

Revision ID: 0002
Revises: 0001
Create Date: 2025-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def _run_id() -> sa.Column[str]:
    return sa.Column("run_id", sa.String(64), sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)


def upgrade() -> None:
    op.create_table(
        "findings",
        _run_id(),
        sa.Column("code", sa.String(64), primary_key=True),
        sa.Column("severity", sa.String(16), nullable=False),
        sa.Column("message", sa.Text, nullable=False),
        sa.Column("params", sa.Text, nullable=False),
        sa.Column("first_step", sa.BigInteger),
        sa.Column("figure", sa.Text),
        sa.Column("updated_at", sa.Double, nullable=False),
        sqlite_with_rowid=False,
    )
    op.create_table(
        "diagnoses",
        _run_id(),
        sa.Column("steps", sa.Integer, nullable=False),
        sa.Column("last_step", sa.BigInteger),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("updated_at", sa.Double, nullable=False),
        sqlite_with_rowid=False,
    )


def downgrade() -> None:
    op.drop_table("diagnoses")
    op.drop_table("findings")

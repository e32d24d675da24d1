"""Initial schema: runs, params, groups, steps, scalars, param_metrics, series_names.

Revision ID: 0001
Revises:
Create Date: 2025-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _run_id() -> sa.Column[str]:
    return sa.Column("run_id", sa.String(64), sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("project", sa.Text, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("created_at", sa.Double, nullable=False),
        sa.Column("updated_at", sa.Double, nullable=False),
        sa.Column("finished_at", sa.Double),
        sa.Column("last_seq", sa.BigInteger, nullable=False),
        sa.Column("steps", sa.Integer, nullable=False),
        sa.Column("last_step", sa.BigInteger),
        sa.Column("param_count", sa.Integer, nullable=False),
        sa.Column("param_numel", sa.BigInteger, nullable=False),
        sa.Column("optimizer", sa.Text),
        sa.Column("config", sa.Text, nullable=False),
        sa.Column("hook_version", sa.String(64)),
    )
    op.create_index("ix_runs_project", "runs", ["project"])
    op.create_index("ix_runs_created_at", "runs", ["created_at"])
    op.create_table(
        "params",
        _run_id(),
        sa.Column("idx", sa.Integer, primary_key=True),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("shape", sa.Text, nullable=False),
        sa.Column("numel", sa.BigInteger, nullable=False),
        sa.Column("dtype", sa.String(32), nullable=False),
        sa.Column("group_idx", sa.Integer, nullable=False),
        sa.Column("optimizer_idx", sa.Integer, nullable=False),
        sqlite_with_rowid=False,
    )
    op.create_table(
        "groups",
        _run_id(),
        sa.Column("optimizer_idx", sa.Integer, primary_key=True),
        sa.Column("idx", sa.Integer, primary_key=True),
        sa.Column("name", sa.Text),
        sa.Column("hparams", sa.Text, nullable=False),
        sqlite_with_rowid=False,
    )
    op.create_table(
        "steps",
        _run_id(),
        sa.Column("step", sa.BigInteger, primary_key=True),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("time", sa.Double, nullable=False),
        sqlite_with_rowid=False,
    )
    op.create_table(
        "scalars",
        _run_id(),
        sa.Column("key", sa.String(128), primary_key=True),
        sa.Column("step", sa.BigInteger, primary_key=True),
        sa.Column("value", sa.Double),
        sa.Column("special", sa.SmallInteger),
        sqlite_with_rowid=False,
    )
    op.create_table(
        "param_metrics",
        _run_id(),
        sa.Column("metric", sa.String(128), primary_key=True),
        sa.Column("step", sa.BigInteger, primary_key=True),
        sa.Column("data", sa.LargeBinary, nullable=False),
        sa.Column("dtype", sa.String(4), nullable=False),
    )
    op.create_table(
        "series_names",
        _run_id(),
        sa.Column("kind", sa.String(8), primary_key=True),
        sa.Column("name", sa.String(128), primary_key=True),
        sqlite_with_rowid=False,
    )


def downgrade() -> None:
    for table in ("series_names", "param_metrics", "scalars", "steps", "groups", "params"):
        op.drop_table(table)
    op.drop_index("ix_runs_created_at", "runs")
    op.drop_index("ix_runs_project", "runs")
    op.drop_table("runs")

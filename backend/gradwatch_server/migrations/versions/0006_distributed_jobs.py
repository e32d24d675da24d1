"""Distributed jobs: a parent run per job and a child run per rank (runs.parent_id, rank,
world_size), each rank's piece of a parameter (params.local_numel, counted), and the steps
assembled without some rank (partial_steps).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    bind = op.get_bind()
    have = {c["name"] for c in sa.inspect(bind).get_columns("runs")}
    if "parent_id" not in have:  # see downgrade: on SQLite an earlier downgrade left them
        # The foreign key inline (REFERENCES in ADD COLUMN): SQLite cannot add a constraint to an
        # existing table, and rebuilding `runs` (batch mode) would cascade-delete every run's rows.
        op.add_column(
            "runs",
            sa.Column("parent_id", sa.String(64), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=True),
            inline_references=True,
        )
        op.add_column("runs", sa.Column("rank", sa.Integer, nullable=True))
        op.add_column("runs", sa.Column("world_size", sa.Integer, nullable=True))
    op.create_index("ix_runs_parent_id", "runs", ["parent_id"])
    op.add_column("params", sa.Column("local_numel", sa.BigInteger, nullable=True))
    op.add_column("params", sa.Column("counted", sa.Boolean, nullable=True))
    op.create_table(
        "partial_steps",
        sa.Column("run_id", sa.String(64), sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("step", sa.BigInteger, primary_key=True),
        sa.Column("missing", sa.Text, nullable=False),
        sqlite_with_rowid=False,
    )


def downgrade() -> None:
    op.drop_table("partial_steps")
    op.drop_column("params", "counted")
    op.drop_column("params", "local_numel")
    op.execute(sa.text("DELETE FROM runs WHERE parent_id IS NOT NULL"))  # ranks' runs mean nothing before 0006
    op.drop_index("ix_runs_parent_id", "runs")
    if op.get_bind().dialect.name == "sqlite":
        # SQLite drops a foreign-key column only by rebuilding `runs`, and dropping the old table
        # would cascade-delete every run's rows: the three (nullable, now unused) columns stay,
        # and upgrading again finds them.
        op.execute(sa.text("UPDATE runs SET world_size = NULL, rank = NULL"))
        return
    op.drop_column("runs", "world_size")
    op.drop_column("runs", "rank")
    op.drop_column("runs", "parent_id")

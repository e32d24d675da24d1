"""Alembic environment: runs on the connection that `migrations.upgrade` hands over.

For `alembic revision --autogenerate` during development, set ``sqlalchemy.url`` in
backend/alembic.ini (or pass ``-x url=...``) instead.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine

from gradwatch_server.schema import metadata


def _run(connection: Connection) -> None:
    # render_as_batch: SQLite cannot ALTER most things; batch mode rebuilds the table instead.
    context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


config = context.config
connection = config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option("sqlalchemy.url")
    if not url:
        raise SystemExit("no database: pass -x url=sqlite:///gradwatch.db or set sqlalchemy.url")
    engine = create_engine(url)
    with engine.begin() as conn:
        _run(conn)
    engine.dispose()

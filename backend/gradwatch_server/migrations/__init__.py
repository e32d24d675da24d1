"""Alembic migrations of the schema in `gradwatch_server.schema`, applied at every start."""

from __future__ import annotations

from importlib import resources

from alembic import command
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import Connection, text
from sqlalchemy.engine import Engine

#: Key of the PostgreSQL advisory lock that processes migrating one database take turns on.
_LOCK_KEY = 0x6772_6164_7761_7463  # "gradwatc"


class SchemaError(RuntimeError):
    """The database's schema cannot be brought to this version's."""


def upgrade(engine: Engine) -> None:
    """Bring the database to the newest schema revision (a no-op when it is there already)."""
    config = Config()
    config.set_main_option("script_location", str(resources.files(__package__)))
    with engine.begin() as connection:
        heads = set(ScriptDirectory.from_config(config).get_heads())
        if set(MigrationContext.configure(connection).get_current_heads()) != heads:
            _take_turns(connection)
        config.attributes["connection"] = connection
        try:
            command.upgrade(config, "head")
        except CommandError as exc:
            raise SchemaError(
                f"cannot upgrade the database schema ({exc}); if the database was written by a "
                "newer gradwatch-server, upgrade gradwatch-server (pip install -U gradwatch-server)"
            ) from exc


def _take_turns(connection: Connection) -> None:
    """Processes that start together on a new database (two servers, a server and `gradwatch
    import`) must not both create the schema: the first migrates, the others wait for its commit,
    then Alembic finds the schema current. Taken only when an upgrade is due, so a database at
    the newest revision is never locked (nor needs to be writable) to be opened."""
    if connection.dialect.name == "postgresql":
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _LOCK_KEY})
    elif connection.dialect.name == "sqlite":
        # pysqlite runs DDL outside a transaction unless one is open: open one that holds the
        # write lock from the start (others wait for it, up to the busy_timeout pragma).
        connection.exec_driver_sql("BEGIN IMMEDIATE")

"""Alembic migrations of the schema in `gradwatch_server.schema`, applied at every start."""
from __future__ import annotations

from importlib import resources

from alembic import command
from alembic.config import Config
from alembic.util import CommandError
from sqlalchemy.engine import Engine


class SchemaError(RuntimeError):
    """The database's schema cannot be brought to this version's."""


def upgrade(engine: Engine) -> None:
    """Bring the database to the newest schema revision (a no-op when it is there already)."""
    config = Config()
    config.set_main_option("script_location", str(resources.files(__package__)))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        try:
            command.upgrade(config, "head")
        except CommandError as exc:
            raise SchemaError(
                f"cannot upgrade the database schema ({exc}); if the database was written by a "
                "newer gradwatch-server, upgrade gradwatch-server (pip install -U gradwatch-server)"
            ) from exc

"""An empty database of each kind the server supports, for the `db_url` fixtures of conftest.py."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from support import pg

#: The databases the server supports; `db_url` and `module_db_url` are parametrized over them.
DATABASES = ("sqlite", "postgresql")


@contextlib.contextmanager
def new_database(request: pytest.FixtureRequest, kind: str, folder: Path) -> Iterator[str]:
    """The URL of an empty database of `kind`: an SQLite file in `folder`, or a PostgreSQL
    database of its own, dropped afterwards (the cluster starts only when a test needs it)."""
    if kind == "sqlite":
        yield f"sqlite:///{folder / 'gradwatch.db'}"
        return
    server: pg.Server = request.getfixturevalue("postgres")
    url = server.create_database()
    try:
        yield url
    finally:
        server.drop_database(url)


class Clock:
    """A store's clock (`open_store(..., clock=)`) that moves only when a test sets `now`."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

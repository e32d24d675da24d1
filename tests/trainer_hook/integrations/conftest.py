"""The framework tests stream to `sqlite_server`, a real `gradwatch serve` on SQLite: they check
what the hook measures inside each framework, which the database does not change (tests/backend
covers both databases), so one database keeps these real trainings few."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from support.server import ServerProcess, start_server


@pytest.fixture(scope="module")
def sqlite_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server per module (a start is 1-4 s on a loaded machine): each test reads back only
    the runs it made, by their ids."""
    proc = start_server(tmp_path_factory.mktemp("integrations"))
    try:
        yield proc
    finally:
        proc.stop()

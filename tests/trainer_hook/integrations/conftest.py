"""The framework tests stream to `sqlite_server`, a real `gradwatch serve` on SQLite: they check
what the hook measures inside each framework, which the database does not change (tests/backend
covers both databases), so one database keeps these real trainings few."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from support.server import ServerProcess, start_server


@pytest.fixture
def sqlite_server(tmp_path: Path) -> Iterator[ServerProcess]:
    proc = start_server(tmp_path)
    try:
        yield proc
    finally:
        proc.stop()

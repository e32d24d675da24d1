"""Shared fixtures: a free port, real databases, and a real `gradwatch serve` process.

The helpers live in tests/support/ (a package; tests import them as ``from support.server import
start_server``); this file keeps the fixtures.

The storage-facing tests run on both databases the server supports. `db_url` (per test) and
`module_db_url` (per module, for a server shared by a module's tests) are parametrized over
`DATABASES`: an SQLite file under the test's temporary folder, or a fresh, empty database on a
real PostgreSQL server. That server is the `postgres` session fixture: a throwaway cluster that
tests/support/pg.py starts in a temporary directory (Debian's `postgresql`, which `make test` installs),
or the server at GRADWATCH_TEST_POSTGRES_URL when that is set. Without PostgreSQL these tests
skip and say how to install it, except in CI (CI=true), where they fail; `-m "not postgres"`
leaves them out. The `server` fixture is a `gradwatch serve` on `db_url`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from support import pg, schedule, tiers
from support.databases import DATABASES, new_database
from support.server import ServerProcess, find_free_port, start_server

# -- tiers ------------------------------------------------------------------------------------
# Each test module declares its tier (tests/support/tiers.py says which there are and how); here
# a test on PostgreSQL gets the `postgres` marker, and a test that may not start a server is
# refused one. `make test-fast` leaves out the tests marked browser, postgres, server, corpus or
# integration.


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The `postgres` marker for each test on PostgreSQL: the `postgresql` variant of `db_url` or
    `module_db_url`, or a test that asks for the `postgres` server itself. A `timed` test whose
    module does not say so in its text fails the collection (tiers.timed_outside_their_tier; on
    an xdist worker that is an INTERNALERROR: `pytest --collect-only` without -n says why). On
    an xdist worker, the modules longest first (tests/support/schedule.py): each worker collects,
    all in that order."""
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        on_postgres = "postgresql" in (params.get("db_url"), params.get("module_db_url"))
        if on_postgres or "postgres" in getattr(item, "fixturenames", ()):
            item.add_marker("postgres")
    if missing := tiers.timed_outside_their_tier(items):
        raise pytest.UsageError(
            f"marked `timed` where the module does not say `{tiers.TIMED_TEXT}` (`make test` finds its timed "
            f"tier's modules by that text: Makefile, TIMED_MODULES): {', '.join(missing)}"
        )
    if hasattr(config, "workerinput"):
        schedule.longest_first(items, schedule.load())


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--record-durations",
        metavar="PATH",
        help="write the seconds each test module took to PATH (JSON; tests/support/schedule.py)",
    )


def pytest_configure(config: pytest.Config) -> None:
    if path := config.getoption("--record-durations"):
        config.pluginmanager.register(schedule.Recorder(Path(path)), "record-durations")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before the test's fixtures are set up: whether it (or a fixture of its) may start a server."""
    marked = {mark.name for mark in item.iter_markers()}
    tiers.refuse_servers = (
        ""
        if marked & tiers.SERVERS
        else f"{item.nodeid} starts a `gradwatch serve` but is of none of the tiers that may "
        f"({', '.join(sorted(tiers.SERVERS))}): mark the test `@pytest.mark.server`, or its module "
        "(tests/support/tiers.py)"
    )


@pytest.fixture
def free_port() -> int:
    return find_free_port()


@pytest.fixture(scope="session")
def postgres() -> Iterator[pg.Server]:
    """A real PostgreSQL server for the session (its `url` names the `gradwatch_test` database).

    Where none can be started, its tests skip and say why; with CI=true they fail instead
    (`pg.required`)."""
    try:
        server = pg.start_server(os.environ.get("GRADWATCH_TEST_POSTGRES_URL"))
    except pg.PostgresUnavailable as exc:
        problem = str(exc)  # failed outside the except block: the message alone, no traceback chain
    else:
        problem = ""
    if problem and pg.required(os.environ):
        pytest.fail(f"PostgreSQL is required in CI (CI=true): {problem}", pytrace=False)
    if problem:
        pytest.skip(f"no PostgreSQL: {problem}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=DATABASES)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database for one test, on SQLite and on PostgreSQL."""
    with new_database(request, request.param, tmp_path) as url:
        yield url


@pytest.fixture(scope="module", params=DATABASES)
def module_db_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An empty database for one module's tests, on SQLite and on PostgreSQL."""
    with new_database(request, request.param, tmp_path_factory.mktemp(request.param)) as url:
        yield url


@pytest.fixture
def server(tmp_path: Path, db_url: str) -> Iterator[ServerProcess]:
    """`gradwatch serve` on an empty database (each test runs on SQLite and on PostgreSQL)."""
    proc = start_server(tmp_path, db_url=db_url)
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="session", autouse=True)
def session_spool_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Module- and session-scoped fixtures are set up before `spool_dir` below: their hooks spool
    into a folder of this session's, never into ~/.gradwatch, whose leftovers every `watch()`
    would replay into the test's server."""
    directory = tmp_path_factory.mktemp("session-spool")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GRADWATCH_SPOOL", str(directory))
        yield directory


@pytest.fixture(autouse=True)
def spool_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test's hook spools into its own folder, never into ~/.gradwatch or another test's."""
    directory = tmp_path / "spool"
    monkeypatch.setenv("GRADWATCH_SPOOL", str(directory))
    return directory

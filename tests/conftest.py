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
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from support import pg
from support.databases import DATABASES, new_database
from support.server import ServerProcess, find_free_port, start_server

# -- tiers ------------------------------------------------------------------------------------
# `make test-fast` runs what needs none of the slow parts: `-m "not (browser or postgres or server
# or corpus or integration)"`. Each test gets those markers here, from what it uses and where it
# lives, so that no test has to remember to declare them (and a new test that starts a server is
# never taken for a fast one).

TESTS = Path(__file__).resolve().parent
#: The tier markers (declared in pytest.ini) that keep a test out of `make test-fast`.
SLOW_TIERS = ("browser", "postgres", "server", "corpus", "integration")
#: Folders whose every test is of a tier: real Chromium; the corpus (real training scripts, one
#: process each); whole runs against servers that fail on purpose, timed (seconds each, and their
#: timing bounds need a machine that is not loaded).
FOLDER_TIERS = {"browser": "browser", "diagnostics": "corpus", "integration": "integration"}


def _ours(obj: object) -> bool:
    """Whether `obj` (a function or class) is defined in a file under tests/."""
    code = getattr(obj, "__code__", None)
    if code is not None:
        return code.co_filename.startswith(str(TESTS))
    module = sys.modules.get(getattr(obj, "__module__", "") or "")
    return str(getattr(module, "__file__", "") or "").startswith(str(TESTS))


def _code_names(func: Callable[..., object], seen: set[object]) -> set[str]:
    """The global names `func` reads, with those of the functions and classes of tests/ it calls,
    transitively: enough to see a `start_server` behind a helper."""
    func = getattr(func, "__wrapped__", func)
    code = getattr(func, "__code__", None)
    if code is None or func in seen:
        return set()
    seen.add(func)
    names: set[str] = set()
    stack = [code]
    while stack:
        current = stack.pop()
        names.update(current.co_names)
        stack.extend(c for c in current.co_consts if isinstance(c, types.CodeType))
    module_globals = getattr(func, "__globals__", {})
    for name in list(names):
        target = module_globals.get(name)
        target = getattr(target, "__wrapped__", target)  # a decorated helper (@contextmanager): its own code
        if target is None or not callable(target) or not _ours(target):
            continue
        if isinstance(target, type):
            for member in vars(target).values():
                if callable(member) and _ours(member):
                    names |= _code_names(member, seen)
        else:
            names |= _code_names(target, seen)
    return names


def _tiers(item: pytest.Function) -> set[str]:
    """The slow tiers `item` belongs to: what it runs in, the fixtures it uses, what it calls."""
    path = Path(str(item.path)).resolve()
    tiers = {tier for folder, tier in FOLDER_TIERS.items() if TESTS / folder in path.parents}
    fixtures = item._fixtureinfo.name2fixturedefs
    params = getattr(getattr(item, "callspec", None), "params", {})
    if "postgres" in item.fixturenames or "postgresql" in (params.get("db_url"), params.get("module_db_url")):
        tiers.add("postgres")
    funcs = [item.function] + [d.func for defs in fixtures.values() for d in defs]
    seen: set[object] = set()
    if any("start_server" in _code_names(f, seen) for f in funcs):
        tiers.add("server")
    return tiers


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if isinstance(item, pytest.Function):
            for tier in sorted(_tiers(item)):
                item.add_marker(tier)


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

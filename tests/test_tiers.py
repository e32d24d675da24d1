"""The tiers of tests/conftest.py: each test gets the markers of what it uses, so that the fast
tier (`make test-fast`) never holds a test that starts a server, needs PostgreSQL or a browser.

Run for real: pytest collects a few modules in a child process, which prints each test's tier
markers, and the tests known to use each part carry its marker.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from support.server import REPO

TIERS = {"browser", "postgres", "server", "corpus", "integration"}
MODULES = [
    "tests/backend/test_api.py",
    "tests/backend/test_live.py",
    "tests/integration/test_workers.py",
    "tests/browser/test_dashboard.py",
    "tests/distributed/test_ddp_runs.py",
]
COLLECT = """
import json, sys, pytest
class Markers:
    def pytest_collection_finish(self, session):
        print("MARKERS " + json.dumps({i.nodeid.split("::", 1)[1]: sorted({m.name for m in i.iter_markers()})
                                       for i in session.items}))
sys.exit(pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *sys.argv[1:]], plugins=[Markers()]))
"""


@pytest.fixture(scope="module")
def tiers() -> dict[str, set[str]]:
    """Each collected test's tier markers."""
    result = subprocess.run(
        [sys.executable, "-c", COLLECT, *MODULES], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert result.returncode == 0, result.stdout + result.stderr
    line = next(line for line in result.stdout.splitlines() if line.startswith("MARKERS "))
    return {test: set(markers) & TIERS for test, markers in json.loads(line.removeprefix("MARKERS ")).items()}


def test_the_in_process_tests_are_fast(tiers: dict[str, set[str]]) -> None:
    assert tiers["test_health[sqlite]"] == set()  # the REST app in process, on SQLite
    assert tiers["test_a_browser_that_falls_behind_is_dropped"] == set()  # no server, no database


def test_what_starts_a_server_needs_postgres_or_a_browser_is_not(tiers: dict[str, set[str]]) -> None:
    assert tiers["test_health[postgresql]"] == {"postgres"}
    assert tiers["test_pages_and_static_files"] == {"server"}  # start_server in the test
    assert tiers["test_browsers_follow_runs_and_steps[sqlite]"] == {"server"}  # the `server` fixture
    assert tiers["test_browsers_follow_runs_and_steps[postgresql]"] == {"server", "postgres"}
    # start_server and the postgres fixture in fixtures of the module, in a folder of its own
    assert tiers["test_postgresql_workers_keep_a_moving_runs_findings_whole"] == {"server", "postgres", "integration"}
    assert tiers["test_compare_page"] == {"browser", "server"}
    # start_server behind a @contextmanager helper of tests/support, in a module fixture
    assert tiers["test_global_norms_equal_one_process_on_the_full_batch"] == {"server"}

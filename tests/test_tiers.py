"""The tiers (tests/support/tiers.py): every test module declares exactly one, where a reader sees
it; the markers that `make test-fast` and `make test` select on follow from those declarations;
and a test that may not start a server cannot.

Run for real: pytest collects a few modules in a child process, which prints each test's tier
markers.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from support import tiers
from support.server import REPO, start_server

TESTS = REPO / "tests"
MARKERS = {*tiers.TIERS, "postgres", "timed"}
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

pytestmark = pytest.mark.unit


def test_every_test_module_declares_exactly_one_tier() -> None:
    modules = sorted(TESTS.rglob("test_*.py"))
    assert len(modules) > 100
    wrong = {str(m.relative_to(REPO)): found for m in modules if len(found := tiers.declared_tiers(m, TESTS)) != 1}
    assert not wrong, f"each test module declares one tier of {tiers.TIERS} (tests/support/tiers.py): {wrong}"


def test_a_declaration_is_read_from_the_module_and_from_its_folders_conftest(tmp_path: Path) -> None:
    (tmp_path / "tests" / "slow").mkdir(parents=True)
    (tmp_path / "tests" / "slow" / "conftest.py").write_text('pytest_itemcollected = folder_tier("corpus")\n')
    module = tmp_path / "tests" / "slow" / "test_x.py"
    module.write_text("import pytest\npytestmark = [pytest.mark.server, pytest.mark.timeout(9)]\n")
    assert tiers.declared_tiers(module, tmp_path / "tests") == ["server", "corpus"]  # two tiers: refused
    module.write_text("import pytest\npytestmark = pytest.mark.slow\n")
    assert tiers.declared_tiers(module, tmp_path / "tests") == ["corpus"]


def test_a_test_of_a_tier_that_may_not_start_a_server_is_refused_one(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"test_tiers\.py::.* starts a `gradwatch serve`.*@pytest\.mark\.server"):
        start_server(tmp_path)
    assert not list(tmp_path.iterdir())  # refused before anything started


class Collected:
    """What `tiers.timed_outside_their_tier` reads of a collected test: its path, id and markers."""

    def __init__(self, path: Path, marks: set[str]) -> None:
        self.path, self.nodeid, self.marks = path, f"{path.name}::test_x", marks

    def get_closest_marker(self, name: str) -> object | None:
        return name if name in self.marks else None


def test_a_timed_test_must_be_found_by_its_modules_text(tmp_path: Path) -> None:
    """`make test`'s timed tier collects the modules whose text says `mark.timed` (the Makefile's
    grep); a test marked `timed` otherwise (a folder's conftest, a helper) would run in neither
    tier: tests/conftest.py refuses the collection."""
    says, silent = tmp_path / "test_says.py", tmp_path / "test_silent.py"
    says.write_text("import pytest\n\n\n@pytest.mark.timed\ndef test_x() -> None: ...\n")
    silent.write_text("def test_x() -> None: ...\n")
    items = [Collected(says, {"timed"}), Collected(silent, {"timed"}), Collected(silent, {"unit"})]
    assert tiers.timed_outside_their_tier(items) == ["test_silent.py::test_x"]  # type: ignore[arg-type]
    assert f"'{re.escape(tiers.TIMED_TEXT)}'" in (REPO / "Makefile").read_text()  # what the grep looks for


@pytest.fixture(scope="module")
def markers() -> dict[str, set[str]]:
    """Each collected test's tier markers."""
    result = subprocess.run(
        [sys.executable, "-c", COLLECT, *MODULES], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert result.returncode == 0, result.stdout + result.stderr
    line = next(line for line in result.stdout.splitlines() if line.startswith("MARKERS "))
    return {test: set(names) & MARKERS for test, names in json.loads(line.removeprefix("MARKERS ")).items()}


def test_in_process_tests_are_unit_tests_and_a_postgres_variant_says_so(markers: dict[str, set[str]]) -> None:
    assert markers["test_health[sqlite]"] == {"unit"}  # the REST app in process, on SQLite
    assert markers["test_health[postgresql]"] == {"unit", "postgres"}
    assert markers["test_a_browser_that_falls_behind_is_dropped"] == {"unit"}  # no server, no database


def test_what_starts_a_server_or_a_browser_carries_its_tier(markers: dict[str, set[str]]) -> None:
    assert markers["test_pages_and_static_files"] == {"unit", "server"}  # one test of a unit module
    assert markers["test_browsers_follow_runs_and_steps[sqlite]"] == {"unit", "server"}  # the `server` fixture
    assert markers["test_browsers_follow_runs_and_steps[postgresql]"] == {"unit", "server", "postgres"}
    # the folder's tier (its conftest.py), and the postgres fixture of a fixture of the module
    assert markers["test_postgresql_workers_keep_a_moving_runs_findings_whole"] == {"postgres", "integration", "timed"}
    assert markers["test_compare_page"] == {"browser"}
    assert markers["test_global_norms_equal_one_process_on_the_full_batch"] == {"server"}

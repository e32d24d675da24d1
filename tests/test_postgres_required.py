"""The PostgreSQL tests skip, saying why, where no PostgreSQL can be had, and fail instead in CI.

Run for real: pytest in a child process on one PostgreSQL test of the suite, pointed at a port
where nothing listens (GRADWATCH_TEST_POSTGRES_URL), with and without CI=true.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from support import pg
from support.server import REPO, find_free_port

pytestmark = pytest.mark.unit

#: One PostgreSQL test of the suite, quick to import.
A_POSTGRES_TEST = "tests/backend/test_tails.py"


@pytest.mark.parametrize(
    ("value", "needed"),
    [
        ("true", True),
        ("TRUE", True),
        ("1", True),
        ("yes", True),
        ("false", False),
        ("0", False),
        ("", False),
        (None, False),
    ],
)
def test_ci_requires_postgres(value: str | None, needed: bool) -> None:
    environ = {} if value is None else {"CI": value}
    assert pg.required(environ) is needed


def run_postgres_tests(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["GRADWATCH_TEST_POSTGRES_URL"] = f"postgresql://postgres@127.0.0.1:{find_free_port()}/postgres"
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            "-rsE",
            "-m",
            "postgres",
            "--basetemp",
            str(tmp_path / "run"),
            A_POSTGRES_TEST,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env=env,
    )


def test_without_postgres_its_tests_skip_and_say_why(tmp_path: Path) -> None:
    result = run_postgres_tests(tmp_path, ci=None)
    assert result.returncode == 0, result.stdout + result.stderr
    assert " skipped" in result.stdout and " passed" not in result.stdout and " error" not in result.stdout
    assert "no PostgreSQL: GRADWATCH_TEST_POSTGRES_URL cannot be reached" in result.stdout


def test_in_ci_without_postgres_its_tests_fail(tmp_path: Path) -> None:
    result = run_postgres_tests(tmp_path, ci="true")
    assert result.returncode == 1, result.stdout + result.stderr
    assert " error" in result.stdout and " skipped" not in result.stdout
    assert "PostgreSQL is required in CI (CI=true)" in result.stdout

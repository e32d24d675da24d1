"""The parallel tier's order (tests/support/schedule.py): modules longest first by their recorded
seconds, a module the record does not know ahead of the short ones, each module's tests in their
own order; and `--record-durations` writes what a run took, per module."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import pytest

from support import schedule
from support.server import REPO

pytestmark = pytest.mark.unit


@dataclass
class Node:
    nodeid: str


def test_modules_go_longest_first_and_keep_their_tests_order() -> None:
    ids = ["a.py::t1", "b.py::t1", "a.py::t2", "c.py::t1", "new.py::t1", "b.py::t2"]
    items = [Node(i) for i in ids]
    durations = {"a.py": 3.0, "b.py": 90.0, "c.py": 30.0}
    schedule.longest_first(cast("list[pytest.Item]", items), durations)
    assert schedule.UNKNOWN_S < 30.0
    assert [i.nodeid for i in items] == ["b.py::t1", "b.py::t2", "c.py::t1", "new.py::t1", "a.py::t1", "a.py::t2"]


def test_the_record_holds_each_modules_seconds(tmp_path: Path) -> None:
    out = tmp_path / "durations.json"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--record-durations={out}"]
        + ["tests/test_schedule.py::test_modules_go_longest_first_and_keep_their_tests_order"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    recorded = json.loads(out.read_text())
    assert list(recorded) == ["tests/test_schedule.py"] and 0 <= recorded["tests/test_schedule.py"] < 60


def test_the_committed_record_names_modules_that_exist() -> None:
    recorded = schedule.load()
    assert len(recorded) > 50
    assert all((REPO / module).is_file() for module in recorded), [m for m in recorded if not (REPO / m).is_file()]

"""benchmarks/server_store.py refuses bad flags, and times a few paces of the server's own work
on unmeasured steps (the timing itself is a benchmark, docs/benchmarks.md)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from support.scripts import load, run_main

pytestmark = pytest.mark.unit

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "server_store.py"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--paces", "0"], "--paces must be at least 1"),
        (["--steps-each", "0"], "--steps-each must be at least 1"),
        (["--gap", "-1"], "--gap must be 0 or more seconds"),
        (["--gap", "nan"], "--gap must be 0 or more seconds"),
        (["--params", "x"], "invalid int value"),
    ],
)
def test_bad_flags_are_refused_with_what_to_do(args: list[str], message: str) -> None:
    done = run_main(load(SCRIPT).main, SCRIPT, args)
    assert done.returncode == 2
    assert message in done.stderr


def test_it_times_paces_of_the_hooks_own_frames() -> None:
    """Every step of every pace is stored (the script stops otherwise), and the line says how
    many steps a pace held: the messages times the steps of each."""
    done = run_main(
        load(SCRIPT).main, SCRIPT, ["--paces", "3", "--messages", "2", "--steps-each", "5", "--params", "4"]
    )
    assert done.returncode == 0, done.stderr
    assert "3 paces of 10 unmeasured steps (2 messages), 4 parameters, hot" in done.stdout
    assert re.search(r"a pace [0-9.]+ ms \| a step [0-9.]+ us", done.stdout), done.stdout


def test_it_times_measured_steps_too() -> None:
    done = run_main(
        load(SCRIPT).main,
        SCRIPT,
        ["--paces", "2", "--messages", "1", "--steps-each", "4", "--params", "6", "--measured"],
    )
    assert done.returncode == 0, done.stderr
    assert "2 paces of 4 measured steps (1 messages), 6 parameters, hot" in done.stdout

"""The distributed unmeasured-step benchmark: a short 2-rank run prints its rows, and bad flags are
refused (its figures come from runs by hand: docs/benchmarks.md)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "unmeasured_step_fsdp.py"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--steps", "1"], "--steps must be 2 or more"),
        (["--tensors", "3"], "each tensor count even"),
        (["--tensors", "many"], "--tensors is a comma-separated list of whole numbers"),
        (["--server", "remote"], "invalid choice"),
        (["--wrapper", "zero"], "invalid choice"),
        (["--every", "1"], "--every must be from 2 to 20"),
        (["--every", "21"], "--every must be from 2 to 20"),
    ],
)
def test_bad_flags_are_refused_with_what_to_do(args: list[str], message: str) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "usage:" in done.stderr and message in done.stderr, done.stderr


@pytest.mark.parametrize("wrapper, label", [("ddp", "DDP"), ("fsdp2", "FSDP2")])
def test_a_short_run_of_two_ranks_prints_a_row_per_tensor_count(wrapper: str, label: str) -> None:
    """With `--every 5` the warm-up's step 5 is measured, and so are timed steps of the watched
    copy (the script checks the count, or exits 1); the rows are of the others."""
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--wrapper", wrapper, "--every", "5", "--tensors", "4,6", "--steps", "12"]
        + ["--server", "none"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert f"{label} on 2 ranks" in done.stdout and "every=5, a step of the warm-up measured" in done.stdout
    for count, target in ((4, 22), (6, 23)):
        assert re.search(rf"^\s+{count} \| watched \|.*\|\s+{target} \| (yes|no)$", done.stdout, re.M), done.stdout
    assert re.search(r"^target (met at every count|NOT met at some count)", done.stdout, re.M), done.stdout


def test_the_timed_steps_a_job_measures_are_left_out() -> None:
    """A job's ranks measure the multiples of N: after the 20 warm-up steps, the watched copy's
    5th timed step is its 25th (place 9 among twin, watched, twin, ...), with every=5."""
    from support.scripts import load

    script = load(SCRIPT)
    assert script.measured_index(5, 12) == {9, 19}
    assert script.measured_index(script.NEVER, 12) == set()

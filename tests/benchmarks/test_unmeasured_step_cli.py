"""The unmeasured-step benchmark runs and refuses bad flags (its figures come from `make bench`)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "unmeasured_step.py"


def test_a_short_run_prints_its_figure_and_measures_one_step_only(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--steps", "3", "--layers", "2"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "4 tensors; 1 of 13 watched steps measured" in done.stdout  # every=10**6: the first step only
    assert re.search(r"^unmeasured step: [+-]\d+ us \([+-]\d+\.\d\d% of a \d+\.\d ms step\)$", done.stdout, re.M)


@pytest.mark.parametrize("args", [["--steps", "0"], ["--layers", "-1"], ["--steps", "many"]])
def test_bad_flags_are_refused(args: list[str]) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "usage:" in done.stderr, done.stderr

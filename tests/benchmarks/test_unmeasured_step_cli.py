"""The unmeasured-step benchmark runs and refuses bad flags (its figures come from `make bench`)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from support.scripts import load, run_main

pytestmark = pytest.mark.unit

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "unmeasured_step.py"


def test_a_short_run_prints_a_row_per_tensor_count_against_its_target(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--tensors", "4,6", "--steps", "4", "--blocks", "2", "--flight-recorder"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "4 watched steps each" in done.stdout and "in 2 blocks of fresh copies" in done.stdout
    assert "the flight recorder on" in done.stdout
    assert "malloc held steady" in done.stdout, done.stdout  # glibc here: mallopt says yes
    for count, target in ((4, 22), (6, 23)):  # 20 us + 0.5 us per tensor
        row = rf"^\s+{count} \| watched \|\s+\d+\.\d\d \|\s+[+-]\d+\.\d \([+-]\d+\.\d to [+-]\d+\.\d\) \|"
        faults = r"\s+\d+\.\d / \d+\.\d\s+"  # the copy's and the twin's page faults per step
        spread = r"\s+\d+ "  # the blocks' CPU medians' range: 0 with one block
        assert re.search(row + rf".*\|\s+-?\d+ \|{faults}\|{spread}\|\s+{target} \| (yes|no)$", done.stdout, re.M), (
            done.stdout
        )
    assert re.search(r"^target (met at every count|NOT met at some count)", done.stdout, re.M), done.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["--steps", "0"],
        ["--tensors", "3"],
        ["--steps", "many"],
        ["--server", "remote"],
        ["--malloc", "jemalloc"],
        ["--steps", "3", "--blocks", "2"],
    ],
)
def test_bad_flags_are_refused(args: list[str]) -> None:
    done = run_main(load(SCRIPT).main, SCRIPT, args)  # argparse's refusal: the short run above is the process
    assert done.returncode == 2 and "usage:" in done.stderr, done.stderr

"""The FSDP unmeasured-step benchmark's refusal of bad flags (its timing spawns a 2-rank job and
runs by hand, not here: docs/benchmarks.md)."""

from __future__ import annotations

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
    ],
)
def test_bad_flags_are_refused_with_what_to_do(args: list[str], message: str) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "usage:" in done.stderr and message in done.stderr, done.stderr

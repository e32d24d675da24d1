"""The distributed benchmark's refusal of bad flags (the timing itself runs by hand, not here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "distributed.py"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--cycles", "1"], "--cycles must be 2 or more"),
        (["--jobs", "deepspeed"], "--jobs must name some of: ddp,fsdp2"),
    ],
)
def test_bad_flags_are_refused_with_what_to_do(args: list[str], message: str) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert message in done.stderr

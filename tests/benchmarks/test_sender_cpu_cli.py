"""benchmarks/sender_cpu.py refuses bad flags before it imports torch or starts a server (the
timing itself is a benchmark, docs/benchmarks.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.scripts import load, run_main

pytestmark = pytest.mark.unit

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "sender_cpu.py"


@pytest.mark.parametrize(
    "args, message", [(["--steps", "3"], "--steps must be 10 or more"), (["--steps", "x"], "invalid int value")]
)
def test_bad_flags_are_refused_with_what_to_do(args: list[str], message: str) -> None:
    done = run_main(load(SCRIPT).main, SCRIPT, args)
    assert done.returncode == 2
    assert message in done.stderr

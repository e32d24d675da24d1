"""benchmarks/server_cpu.py refuses bad flags before it starts a server (the timing itself is a
benchmark, docs/benchmarks.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.scripts import load, run_main

pytestmark = pytest.mark.unit

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "server_cpu.py"


@pytest.mark.parametrize(
    "args, message", [(["--every", "0"], "--every must be at least 1"), (["--steps", "x"], "invalid int value")]
)
def test_bad_flags_are_refused_with_what_to_do(args: list[str], message: str) -> None:
    done = run_main(load(SCRIPT).main, SCRIPT, args)
    assert done.returncode == 2
    assert message in done.stderr

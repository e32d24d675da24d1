"""The GPU benchmark and the GPU check refuse bad flags and say why they measure nothing without a
CUDA device (their figures come from a GPU machine: docs/benchmarks.md, On a GPU)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu.py"

pytestmark = [
    pytest.mark.unit,
    pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: scripts/gpu-check.sh runs it"),
]


def test_without_a_gpu_it_says_so_and_exits_3() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--rounds", "3"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr
    assert "no CUDA device" in done.stdout


@pytest.mark.parametrize("args", [["--models", "resnet"], ["--rounds", "1"], ["--rounds", "some"]])
def test_bad_flags_are_refused(args: list[str]) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "usage:" in done.stderr, done.stderr


def test_the_gpu_check_dry_run_skips_the_cuda_tests_with_their_reason(tmp_path: Path) -> None:
    env = {**os.environ, "GPU_WHEELS": "none", "PYTHON": sys.executable, "OUT": str(tmp_path)}
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu-check.sh"), "--quick"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    summary = (tmp_path / "cuda-tests.txt").read_text()
    assert "needs a CUDA device" in summary and " skipped" in summary and "passed" not in summary
    assert "the benchmark did not run (no CUDA device)" in done.stdout

"""The GPU benchmark and the GPU check refuse bad flags and say why they measure nothing without a
CUDA device (their figures come from a GPU machine: docs/benchmarks.md, On a GPU)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from support.scripts import load, run_main

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu.py"

pytestmark = [
    pytest.mark.unit,
    pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: scripts/gpu-check.sh runs it"),
]


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    """One dry run of the GPU check (its CUDA tests, then the benchmark as a process), whose parts
    the tests below each read."""
    out = tmp_path_factory.mktemp("gpu-out")
    env = {**os.environ, "GPU_WHEELS": "none", "PYTHON": sys.executable, "OUT": str(out)}
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu-check.sh"), "--quick"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    return done, out


def test_without_a_gpu_it_says_so_and_exits_3(dry_run: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    """gpu.py's own process, run by the check: its line, and the check's reading of its exit 3."""
    done, out = dry_run
    assert "gpu.py: no CUDA device on this machine" in done.stdout, done.stdout + done.stderr
    assert "no CUDA device" in (out / "gpu-bench.log").read_text()
    assert "the benchmark did not run (no CUDA device)" in done.stdout  # printed for exit 3 only
    assert "benchmark exit 3" in done.stdout


@pytest.mark.parametrize("args", [["--models", "resnet"], ["--rounds", "1"], ["--rounds", "some"]])
def test_bad_flags_are_refused(args: list[str]) -> None:
    done = run_main(load(SCRIPT).main, SCRIPT, args)  # argparse's refusal, in this process: no torch import
    assert done.returncode == 2 and "usage:" in done.stderr, done.stderr


def test_the_gpu_check_dry_run_skips_the_cuda_tests_with_their_reason(
    dry_run: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    done, out = dry_run
    assert done.returncode == 0, done.stdout + done.stderr
    summary = (out / "cuda-tests.txt").read_text()
    assert "needs a CUDA device" in summary and " skipped" in summary and "passed" not in summary


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--rounds", "2"], "--rounds must be at least 3"),
        (["--models", "gpt,huge"], "unknown model(s) huge"),
        (["--variants", "aa,gradwatch every=0"], "unknown gradwatch variant 'gradwatch every=0'"),
        (["--variants", "gradwatch sometimes"], "unknown gradwatch variant 'gradwatch sometimes'"),
        (["--variants", "aa,tensorboard"], "unknown variant 'tensorboard'"),
    ],
)
def test_bad_flags_are_refused_before_anything_runs(args: list[str], says: str) -> None:
    done = run_main(load(SCRIPT).main, SCRIPT, args)
    assert done.returncode == 2 and says in done.stderr, (done.returncode, done.stderr)


@pytest.mark.parametrize(
    ("kind", "every"),
    [("gradwatch auto", "auto"), ("gradwatch every=1", 1), ("gradwatch every=8", 8), ("gradwatch unmeasured", 10**9)],
)
def test_a_gradwatch_variant_names_its_every(kind: str, every: int | str) -> None:
    assert load(SCRIPT).gradwatch_every(kind) == every

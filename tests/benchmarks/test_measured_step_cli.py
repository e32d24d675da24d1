"""The measured-step benchmark's floor comparison runs and refuses bad flags (its figures: docs/benchmarks.md)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from support.scripts import load, run_main

pytestmark = pytest.mark.unit

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "measured_step.py"
INTERVAL = r"([+-]\d+) \(([+-]\d+) to ([+-]\d+)\)"
RATIO = r"(-?\d+\.\d\d)x \((-?\d+\.\d\d)x to (-?\d+\.\d\d)x\)"
ROW = re.compile(
    rf"^\s+(\d+) \|\s+(\d+) \|\s+{INTERVAL} \|\s+{INTERVAL} \| {RATIO} \|\s+(-?\d+) \|\s+(\d+) \| {RATIO} "
    r"\| 1\.2x \| (yes|no)$",
    re.M,
)


@pytest.mark.parametrize(("model", "server"), [("tiny", "local"), ("mlp", "none")])
def test_every_1_is_set_against_the_floor_step_by_step(tmp_path: Path, model: str, server: str) -> None:
    args = ["--floor", "--steps", "3", "--model", model, "--server", server]
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args, *(["--tensors", "4"] if model == "tiny" else [])],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert ("overhead.py's MLP" if model == "mlp" else "Linear(8, 8) layers") in done.stdout, done.stdout
    assert "this machine charges a 0.2 s sleep" in done.stdout, done.stdout
    rows = ROW.findall(done.stdout)
    assert len(rows) == 1, done.stdout
    tensors, _, watched, w_lo, w_hi, floor, f_lo, f_hi, ratio, _, _, other, serving, told, _, t_hi, met = rows[0]
    assert int(tensors) == (80 if model == "mlp" else 4)
    assert int(w_lo) <= int(watched) <= int(w_hi) and int(f_lo) <= int(floor) <= int(f_hi), rows
    assert int(other) > 0  # the sender thread's work: spooling or sending
    assert (int(serving) > 0) == (server == "local"), rows
    if abs(int(floor)) >= 5:  # the printed ratios are the printed figures' (to their rounding)
        assert float(ratio) == pytest.approx(int(watched) / int(floor), rel=0.2, abs=0.02), rows
        told_from_parts = (int(watched) + int(other) + int(serving)) / int(floor)
        assert float(told) == pytest.approx(told_from_parts, rel=0.2, abs=0.02), rows
    assert met == ("yes" if float(t_hi) <= 1.2 else "no")
    assert re.search(r"^target (met|NOT met)", done.stdout, re.M), done.stdout


def test_the_copies_rotating_cancel_where_each_lies() -> None:
    """Each copy lies so as to add its own constant to its steps; in a rotation every copy is
    watched once, the floor once and the twin once, so each role's averaged extra is its cost."""
    script = load(SCRIPT)
    lies = [300e-6, -120e-6, 40e-6]  # copy k's steps take this much longer for its whole life
    hook, floor, noise = 5e-3, 4e-3, [1e-5, -2e-5, 3e-5, 0.0]
    watched, floored = [], []
    for k in range(3):  # third k: copy k watched, k + 1 the floor, k + 2 the twin
        w, f, t = lies[k], lies[(k + 1) % 3], lies[(k + 2) % 3]
        watched.append([hook + w - t + e for e in noise])
        floored.append([floor + f - t + e for e in noise])
    assert script.rotated(watched) == pytest.approx([hook + e for e in noise])
    assert script.rotated(floored) == pytest.approx([floor + e for e in noise])
    assert script.rotated(watched[:1]) != pytest.approx([hook + e for e in noise])  # one copy alone: off


@pytest.mark.parametrize(
    "args",
    [
        ["--model", "mlp"],
        ["--floor", "--profile"],
        ["--floor", "--steps", "1"],
        ["--model", "resnet", "--floor"],
        ["--tensors", "3", "--floor"],
        ["--server", "local"],
        ["--floor", "--server", "remote"],
        ["--ballast"],
        ["--ddp"],
    ],
)
def test_bad_flags_are_refused(args: list[str]) -> None:
    done = run_main(load(SCRIPT).main, SCRIPT, args)
    assert done.returncode == 2 and "usage:" in done.stderr, done.stderr


def test_the_profile_of_a_ddp_model_names_the_rounds_pre_hooks() -> None:
    """`--profile --ddp`: a one-rank DDP (every measured round hooks every parameter) profiled
    step by step, its rows gradwatch's functions, among them the pre-hook that counts the passes."""
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--profile", "--ddp", "--tensors", "4", "--steps", "5", "--top", "40"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "DistributedDataParallel, one rank (gloo)" in done.stdout, done.stdout
    assert "4 tensors: gradwatch's own Python" in done.stdout and "on_pass" in done.stdout, done.stdout

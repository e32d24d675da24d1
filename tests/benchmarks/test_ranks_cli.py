"""The large-job benchmark (benchmarks/ranks.py) runs a small job end to end and refuses bad flags
(its figures come from `make bench-ranks`)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from support.scripts import load, run_main

pytestmark = pytest.mark.unit  # a test that starts a server says so (@pytest.mark.server)

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "ranks.py"


@pytest.mark.server
@pytest.mark.parametrize(
    "kind, every, rows, frames",
    [("ddp", 1, ["ddp, replicas digest", "ddp, replicas arrays"], "binary"), ("fsdp", 2, ["fsdp"], "json")],
)
def test_a_small_job_is_stored_whole_and_its_row_printed(kind: str, every: int, rows: list[str], frames: str) -> None:
    """A row per job, named by its kind and, for DDP, by what its replicas send (`--replicas`:
    their grad_digest or their arrays), in the table and in its met/missed line; its step frames
    binary (protocol v3) or JSON (`--frames`)."""
    replicas = ["--replicas", "digest,arrays"] if kind == "ddp" else []
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--ranks", "3", "--tensors", "5", "--period", "0.2", "--steps", "4"]
        + ["--kind", kind, "--every", str(every), "--frames", frames, *replicas],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr
    sent_binary = 3 * len(rows) if frames == "binary" else 0  # this server reads them: every rank sends them
    assert f"--frames {frames}: {sent_binary // len(rows)} ranks sent binary" in done.stdout
    for name in rows:
        row = next(line for line in done.stdout.splitlines() if line.startswith(f"| 3 x 5 @ 0.2 s ({name}) |"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[1] == str(every)
        assert cells[2] == "4/4"  # every global step reached the browser watching the job
        assert cells[12:16] == ["0", "0", "0", "0"]  # no connect error, no drop, no partial step, no lost rank
        lag_p50, lag_p95 = float(cells[4]), float(cells[5])
        assert 0 <= lag_p50 <= lag_p95
        assert re.search(rf"^3 x 5 @ 0\.2 s \({name}\): met: .*every step stored", done.stdout, re.M)


@pytest.mark.server
def test_a_jobs_start_alone_is_timed_with_either_hello() -> None:
    """--admit-only: every rank welcomed, none failed, by digest (v2) and by list (v1)."""
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--ranks", "3", "--tensors", "5", "--steps", "2", "--admit-only"]
        + ["--hello", "v2,v1"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr
    for hello in ("v2", "v1"):
        row = next(line for line in done.stdout.splitlines() if line.startswith(f"| 3 x 5 | {hello} |"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[2] == "3/3" and cells[4:7] == ["0", "0", "0"]  # welcomed; no failed connect, drop or ask
        assert re.search(rf"^3 x 5 \({hello}\): met:", done.stdout, re.M)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--ranks", "0"], "--ranks must be between 1 and 65536"),
        (["--ranks", "a,b"], "comma-separated numbers"),
        (["--period", "0"], "--period must be above 0"),
        (["--steps", "1"], "--steps must be 2 or more"),
        (["--workers", "2"], "--workers above 1 needs --db postgresql://"),
        (["--hello", "v3"], "--hello takes v1 and/or v2"),
        (["--replicas", "all"], "--replicas takes digest and/or arrays"),
    ],
)
def test_bad_flags_are_refused(args: list[str], message: str) -> None:
    done = run_main(load(SCRIPT).main, SCRIPT, args)  # argparse's refusal: the small jobs above are the process
    assert done.returncode == 2 and message in done.stderr, done.stderr

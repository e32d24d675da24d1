"""The two-commit comparison, end to end in a tiny configuration (the timing itself runs in
`make bench-compare`), its spooled run against the hook's own spool reader, and its refusals."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gradwatch import spool

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "compare.py"
sys.path.insert(0, str(SCRIPT.parent))
import compare  # noqa: E402
from compare import ratio_cells, write_spool  # noqa: E402

from support.scripts import run_main  # noqa: E402

pytestmark = pytest.mark.unit  # a test that starts a server says so (@pytest.mark.server)


def test_the_spooled_run_reads_back_as_the_hook_wrote_it(tmp_path: Path) -> None:
    """The file compare.py writes is what the hook's spool reader takes: a hello, then the steps
    in order, every one of them, with a value per parameter and step."""
    path = tmp_path / "run.spool"
    write_spool(path, "r1", params=5, steps=23, batch=7)
    records, report = spool.read_records(path)
    messages = [json.loads(r) for r in records]
    assert report.torn is None
    assert messages[0]["type"] == "hello" and len(messages[0]["params"]) == 5
    assert [m["seq"] for m in messages[1:]] == [1, 2, 3, 4]
    assert [s for m in messages[1:] for s in m["step"]] == list(range(1, 24))
    grad = [np.frombuffer(base64.b64decode(m["params"]["grad_norm"]), "<f4") for m in messages[1:]]
    assert sum(g.size for g in grad) == 23 * 5


# Its servers are started by compare.py's processes, where tests/conftest.py's tiering cannot look.
@pytest.mark.server
@pytest.mark.server
def test_two_commits_compare_in_a_tiny_configuration() -> None:
    """HEAD against the working tree: every figure printed for both, with its ratio."""
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "HEAD", "--rounds", "1", "--params", "4", "--steps", "12", "--batch", "5"]
        + ["--reads", "1", "--models", "mlp", "--mlp-cycles", "2"],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ")][1:]
    names = [row.split("|")[1].strip() for row in rows]
    for figure in ("ingest rows/s", "export csv s", "series ms", "heatmap ms", "hook every=1 mlp overhead %"):
        assert any(name.startswith(figure) for name in names), (figure, done.stdout)
    for row in rows:
        base, ratio = row.split("|")[2].strip(), row.split("|")[4].split()[0]
        if float(base.replace(",", "")) == 0:
            assert ratio == "n/a", row
        elif "server CPU" in row:  # read in the kernel's 10 ms ticks: this tiny run's may be 0
            assert float(ratio) >= 0, row
        else:
            assert float(ratio) > 0, row


def test_a_base_round_that_measured_zero_gives_no_ratio_instead_of_failing() -> None:
    """A CPU time under its clock's tick reads 0: the figure has no ratio, and the others keep theirs."""
    assert ratio_cells("hook mlp server CPU ms/step", [0.0, 5.0], [5.0, 5.0]) is None
    assert ratio_cells("series ms", [2.0, 4.0, 8.0], [3.0, 4.0, 4.0]) == (1.0, 0.5, 1.5)
    assert ratio_cells("hook every=1 mlp overhead %", [0.0], [10.0]) == pytest.approx((1.1, 1.1, 1.1))


@pytest.mark.parametrize(
    "args, message",
    [
        (["no-such-commit"], "'no-such-commit' is not a commit"),
        (["HEAD", "--parts", "disk"], "--parts must name some of: storage,hook"),
        (["HEAD", "--models", "cnn"], "--models must name some of: mlp,gpt"),
        (["HEAD", "--rounds", "0"], "--rounds must be 1 or more"),
        (["HEAD", "--steps", "0"], "must be 1 or more"),
    ],
)
def test_bad_arguments_are_refused_with_what_to_do(args: list[str], message: str) -> None:
    done = run_main(compare.main, SCRIPT, args)  # refused before anything is built: the tiny run is the process
    assert done.returncode != 0
    assert message in done.stderr

"""The overhead benchmark's own logic: its estimator and its refusal of bad flags (the timing
itself runs in `make bench`, not here)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import overhead  # noqa: E402
from overhead import Figure  # noqa: E402

from support.scripts import run_main  # noqa: E402

pytestmark = pytest.mark.unit

SCRIPT = BENCHMARKS / "overhead.py"


def test_a_figure_is_the_median_plus_the_charge() -> None:
    f = Figure()
    f.ratios, f.measured = [0.01, 0.03, 0.02, 0.50, 0.02], [True] * 5
    f.charge = 0.005
    assert f.estimate() == pytest.approx(0.025)  # the outlier does not move it
    low, high = f.interval()
    assert low <= f.estimate() <= high


def test_auto_weighs_measured_and_unmeasured_steps_by_its_share() -> None:
    """The cycles hold measured steps far more often than a run alone: their share comes from
    the run alone, not from how many the cycles happen to hold."""
    f = Figure()
    f.ratios = [0.10, 0.12, 0.11, 0.01, 0.00, 0.02, 0.01]
    f.measured = [True, True, True, False, False, False, False]
    f.share = 0.1
    assert f.estimate() == pytest.approx(0.1 * 0.11 + 0.9 * 0.01)
    f.share = None  # every=1: a plain median
    assert f.estimate() == pytest.approx(0.02)


def test_beyond_the_aa_subtracts_the_designs_bias_cycle_by_cycle() -> None:
    """A bias every copy shares (the A/A reads it) cancels; the interval resamples the same
    cycles for both, so a shared cycle-to-cycle swing does not widen it."""
    swing = [0.00, 0.02, -0.01, 0.03, 0.01, -0.02, 0.00, 0.02, 0.04]
    aa, f = Figure(), Figure()
    aa.ratios, aa.measured = [0.007 + s for s in swing], [False] * len(swing)
    f.ratios, f.measured = [0.010 + s for s in swing], [True] * len(swing)
    f.charge = 0.002
    diff, low, high = overhead.beyond(f, aa)
    assert diff == pytest.approx(0.003 + 0.002)
    assert low == pytest.approx(diff) and high == pytest.approx(diff)  # the swing is in both: it cancels
    f.ratios[3] += 0.05  # one cycle of the variant's own, above the median: the interval widens
    diff, low, high = overhead.beyond(f, aa)
    assert diff == pytest.approx(0.005) and low <= diff < high


@pytest.mark.parametrize(
    "args, message",
    [
        (["--cycles", "1"], "--cycles must be 2 or more"),
        (["--models", "cnn"], "--models must name some of: mlp,gpt"),
        (["--variants", "gradwatch"], "--variants must include baseline and another"),
        (["--variants", "baseline,nope"], "--variants must include baseline and another"),
        (["--clock", "sundial"], "argument --clock: invalid choice"),
        (["--malloc", "jemalloc"], "argument --malloc: invalid choice"),
        (["--blocks", "0"], "--blocks must be at least 1 and at most the cycles"),
        (["--cycles", "4", "--blocks", "5"], "--blocks must be at least 1 and at most the cycles"),
    ],
)
def test_bad_flags_are_refused_with_what_to_do(args: list[str], message: str) -> None:
    done = run_main(overhead.main, SCRIPT, args)  # argparse's refusal, in this process: no torch import
    assert done.returncode == 2
    assert message in done.stderr


def test_the_script_run_as_a_process_exits_2_on_a_bad_flag() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--cycles", "1"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "--cycles must be 2 or more" in done.stderr


FAULTS = """
import resource, sys
sys.path.insert(0, sys.argv[2])
import torch
from overhead import mlp_task, steady_malloc
if sys.argv[1] == "steady":
    assert steady_malloc()
torch.set_num_threads(1)
model, loss_fn = mlp_task()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
def step():
    opt.zero_grad(set_to_none=True)
    loss_fn(model).backward()
    opt.step()
for _ in range(10):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    step()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10)
"""


def test_steady_malloc_stops_the_mlp_faulting_its_tensors_back_in() -> None:
    """The rule `--malloc steady` rests on: with glibc as it is, the MLP's steps give freed
    tensors' pages back and fault them in again; held steady, a warm step faults a few times
    fewer (none but what new memory needs). How many pages a default step faults depends on the
    machine, so the bound on it is loose."""
    faults = {}
    for mode in ("default", "steady"):
        done = subprocess.run(
            [sys.executable, "-c", FAULTS, mode, str(SCRIPT.parent)], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        faults[mode] = float(done.stdout)
    assert faults["default"] > 50, faults
    assert faults["steady"] * 3 < faults["default"], faults


def test_a_copy_placed_anew_keeps_its_values_and_objects_in_fresh_memory() -> None:
    """`Lane.replace` (each block of `--blocks`): every parameter and state tensor moves, the
    parameters stay the objects the optimizer and a watcher hold, and the next step is the one an
    untouched copy takes."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    x = torch.randn(4, 8)
    moved, kept = (
        overhead.Lane("a", model, lambda m: m(x).square().mean()),
        overhead.Lane("b", model, lambda m: m(x).square().mean()),
    )
    moved.step(), kept.step()
    params = list(moved.model.parameters())
    where = [p.data_ptr() for p in params] + [
        t.data_ptr() for st in moved.opt.state.values() for t in st.values() if t.dim()
    ]
    moved.replace()
    assert list(moved.model.parameters()) == params and list(moved.opt.param_groups[0]["params"]) == params
    now = [p.data_ptr() for p in params] + [
        t.data_ptr() for st in moved.opt.state.values() for t in st.values() if t.dim()
    ]
    assert len(now) == len(where) == 12 and all(map(int.__ne__, now, where))  # each its own old place left
    moved.step(), kept.step()
    for a, b in zip(moved.model.parameters(), kept.model.parameters()):
        assert torch.equal(a, b)


def test_the_ballast_runs_at_the_lowest_priority_and_only_while_on() -> None:
    """`--ballast`'s processes: SCHED_IDLE from their start (they take a core only where it would
    idle), stopped until `on()`, stopped again by `off()` (no CPU meanwhile), gone after `close()`.
    On a machine whose cores are all busy a SCHED_IDLE process runs only now and then, and takes
    its stop only when it runs: each state is waited for (30 s at most)."""

    def state(pid: int) -> str:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]

    def until(what: str, done: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 30
        while not done():
            assert time.monotonic() < deadline, what
            time.sleep(0.05)

    ballast = overhead.Ballast(2)
    try:
        pids = [p.pid for p in ballast.procs]
        assert all(os.sched_getscheduler(pid) == os.SCHED_IDLE for pid in pids)
        until("stopped before they ran", lambda: [state(pid) for pid in pids] == ["T", "T"])
        used = [overhead.process_cpu(pid) for pid in pids]
        ballast.on()
        until("each ran once on", lambda: all(overhead.process_cpu(pid) > u for pid, u in zip(pids, used)))
        ballast.off()
        until("stopped by off()", lambda: [state(pid) for pid in pids] == ["T", "T"])
        ran = [overhead.process_cpu(pid) for pid in pids]
        time.sleep(0.3)
        assert [overhead.process_cpu(pid) for pid in pids] == ran  # stopped: nothing more
    finally:
        ballast.close()
    assert all(p.poll() is not None for p in ballast.procs)


def test_the_machines_charges_for_sleeping_and_waking_are_read_as_cpu_time() -> None:
    """`wake_cost`: a sleep's CPU clock cannot pass the sleep, and a wake's cost is the waker's
    own clock, far under a round; each round's waiter did wake (it is joined: a lost wake hangs)."""
    asleep, waking = overhead.wake_cost(rounds=3, gap=0.05)
    assert 0 <= asleep < 0.05
    assert 0 <= waking < 0.05
    line = overhead.wake_line()
    assert re.fullmatch(
        r"this machine charges a 0\.2 s sleep \d+ us of CPU and a wake of a sleeping thread \d+ us to the waker "
        r"\(bare metal: 0 and a few\)",
        line,
    ), line

"""The unmeasured-step benchmark runs and refuses bad flags (its figures come from `make bench`)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from support.scripts import load, run_main

pytestmark = pytest.mark.unit

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "unmeasured_step.py"


def run_script(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The script run in its own process, as a user runs it; it must succeed."""
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300, cwd=cwd)
    assert done.returncode == 0, done.stderr
    return done


def test_a_short_run_prints_a_row_per_tensor_count_against_its_target(tmp_path: Path) -> None:
    done = run_script(
        tmp_path, "--tensors", "4,6", "--steps", "4", "--blocks", "2", "--flight-recorder", "--ballast", "--keep-loss"
    )
    assert "4 watched steps each" in done.stdout and "in 2 blocks of fresh copies" in done.stdout
    assert "each loss kept until the next forward" in done.stdout, done.stdout
    assert "every core kept busy (--ballast)" in done.stdout, done.stdout
    assert "the flight recorder on" in done.stdout
    assert "malloc held steady" in done.stdout, done.stdout  # glibc here: mallopt says yes
    assert re.search(r"^this machine charges a 0\.2 s sleep \d+ us", done.stdout, re.M), done.stdout
    for count, target in ((4, 22), (6, 23)):  # 20 us + 0.5 us per tensor
        row = rf"^\s+{count} \| watched \|\s+\d+\.\d\d \|\s+[+-]\d+\.\d \([+-]\d+\.\d to [+-]\d+\.\d\) \|"
        faults = r"\s+\d+\.\d / \d+\.\d\s+"  # the copy's and the twin's page faults per step
        spread = r"\s+\d+ "  # the blocks' CPU medians' range: 0 with one block
        placement = r"\s+[+-]\d+ "  # half the crossover halves' difference, the largest block's
        background = r"\s+-?\d+ \|\s+\d+ "  # other threads, the server: CPU µs per step
        assert re.search(
            row + rf".*\|{background}\|{faults}\|{spread}\|{placement}\|\s+{target} \| (yes|no)$", done.stdout, re.M
        ), done.stdout
    assert re.search(r"^target (met at every count|NOT met at some count)", done.stdout, re.M), done.stdout


def test_the_mlp_is_held_to_half_a_percent_of_its_step_all_told(tmp_path: Path) -> None:
    done = run_script(tmp_path, "--model", "mlp", "--steps", "2", "--server", "none", "--aa")
    assert "overhead.py's mlp, AdamW" in done.stdout and "no server (spooling)" in done.stdout, done.stdout
    rows = {}
    for line in done.stdout.splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) == 13 and cells[0] == "80":
            rows[cells[1]] = cells
    assert set(rows) == {"watched", "A/A"}, done.stdout
    for name, cells in rows.items():
        cpu_hi = float(re.search(r"to ([+-]\d+\.\d)\)", cells[4]).group(1))  # type: ignore[union-attr]
        other, server = float(cells[5]), float(cells[6])
        assert server == 0  # no server process to charge
        assert (other > 0) == (name == "watched")  # the sender thread's CPU, the watched copy's only
        told, step_ms = (float(v) for v in re.fullmatch(r"([+-]\d+\.\d\d) of\s+(\d+\.\d\d) ms", cells[10]).groups())  # type: ignore[union-attr]
        # the printed share: the CPU interval's top and the background over the twin's CPU step
        assert told == pytest.approx(100 * (cpu_hi + other + server) / (step_ms * 1e3), abs=0.01), cells
        assert cells[11] == "0.5" and cells[12] == ("yes" if told <= 0.5 else "no"), cells
    assert re.search(r"^target (met \(all told|NOT met)", done.stdout, re.M), done.stdout


@pytest.mark.parametrize("keep", [True, False])
def test_keep_loss_holds_each_copys_graph_so_autograd_reuses_its_accumulator_nodes(keep: bool) -> None:
    """`--keep-loss`: a parameter's gradient accumulator node (a mark left in its metadata) is
    the one the next step's backward runs, as in a loop that assigns `loss = ...`; without it
    the graph dies with the step and the next forward makes a fresh node."""
    script = load(SCRIPT)
    script.KEPT = {} if keep else None
    net = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    x = torch.randn(4, 3)

    def loss(m: torch.nn.Module) -> torch.Tensor:
        return m(x).square().mean()

    script.train_step(net, opt, loss)
    node = net.weight.view_as(net.weight).grad_fn.next_functions[0][0]
    node.metadata["mark"] = True
    del node
    seen = []
    net.weight.register_post_accumulate_grad_hook(lambda p: seen.append(0))
    script.train_step(net, opt, loss)
    assert len(seen) == 1  # the step ran its backward into the weight
    now = net.weight.view_as(net.weight).grad_fn.next_functions[0][0]
    assert ("mark" in now.metadata) == keep


def test_a_crossover_cancels_where_the_copies_lie() -> None:
    script = load(SCRIPT)
    # step times twin, copy, twin, ...: in the first half the watched copy lies 100 us slower than
    # its twin, in the second the copies have swapped roles; the watch costs 7 us on each
    hook, lies = 7e-6, 100e-6
    twin = [1e-3, 1.2e-3, 0.9e-3, 1.1e-3, 1e-3]  # the same machine's conditions in both halves
    first = [t + (hook + lies if k % 2 else 0) for k, t in enumerate(twin)]
    second = [t + (hook if k % 2 else lies) for k, t in enumerate(twin)]
    pairs, placement = script.crossed(first, second)
    assert len(pairs) == 4  # two copy steps, each against the twin step on either side
    assert pairs == pytest.approx([hook + twin[k] - twin[j] for k in (1, 3) for j in (k - 1, k + 1)])
    assert placement == pytest.approx(lies)


@pytest.mark.parametrize(
    "args",
    [
        ["--steps", "0"],
        ["--tensors", "3"],
        ["--steps", "many"],
        ["--server", "remote"],
        ["--malloc", "jemalloc"],
        ["--model", "resnet"],
        ["--steps", "3", "--blocks", "2"],
    ],
)
def test_bad_flags_are_refused(args: list[str]) -> None:
    done = run_main(load(SCRIPT).main, SCRIPT, args)  # argparse's refusal: the short run above is the process
    assert done.returncode == 2 and "usage:" in done.stderr, done.stderr

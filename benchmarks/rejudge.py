"""What judging the flight recorder's late norms costs the server, once per batch that resends
steps, on a stored run of N steps of 100 parameters (SQLite in a temporary folder):

- `judge_late` (live): the run's diagnosis rewinds to its snapshot before the window and judges
  the stored steps from there again; its cost should not grow with N;
- `rejudge`: the run diagnosed again whole from its stored steps (before 2026-11-27 the live path
  up to step 2,000; now the fallback for a window older than every snapshot).

The run's steps are measured (every=1: the most a replay can cost a step) but for its last 16,
sent with their cheap facts only; the late batch resends 8 of them with their norms (a 50x spike
at the last) and brings 8 new ones, as the recorder does. Each size is timed side by side: per
round, `judge_late` then `rejudge`, the median over rounds. Also: what keeping snapshots adds to
judging a step (`RunDiagnosis` fed the same steps with and without them, interleaved) and a
snapshot's size.

    python benchmarks/rejudge.py [--steps 1000,5000,50000] [--params 100] [--rounds 3] [--worst]

`--worst`: each size rounded up so that the window's first step is one a snapshot was taken
after, which `judge_late` cannot start from: it replays from the snapshot before (the longest
replay a window of the recorder's makes: SNAPSHOT_EVERY + the window + the new steps).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import tempfile
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from gradwatch_server.diagnostics import Diagnostics, RunContext, RunDiagnosis  # noqa: E402
from gradwatch_server.protocol import parse_message  # noqa: E402
from gradwatch_server.store import StepData, Store, open_store  # noqa: E402
from support.wiremsg import hello  # noqa: E402

#: Steps at the run's end sent with their cheap facts only, and how many of them the recorder resends.
UNMEASURED, RESENT = 16, 8


def write_run(store: Store, n_steps: int, n_params: int) -> tuple[int, list[StepData]]:
    """A run of `n_steps` steps; the window's first step and the recorder's late batch (not stored yet)."""
    rng = np.random.default_rng(0)
    store.open_run(parse_message(json.dumps(hello("r", params=[f"p{i}" for i in range(n_params)]))))  # type: ignore[arg-type]

    def norms(spike: float = 1.0) -> bytes:
        values = 1 + 0.1 * rng.random(n_params)
        values[0] *= spike
        return values.astype("<f4").tobytes()

    def step(n: int) -> StepData:
        if n > n_steps - UNMEASURED:
            return StepData(seq=n, step=n, time=float(n), scalars={"loss": 1.0}, arrays={})
        arrays = {"grad_norm": norms(), "grad_status": bytes([2] * n_params)}
        return StepData(seq=n, step=n, time=float(n), scalars={"loss": 1.0}, arrays=arrays)

    for start in range(1, n_steps + 1, 500):
        store.write_steps("r", [step(n) for n in range(start, min(start + 500, n_steps + 1))])
    first = n_steps - RESENT + 1
    late = [
        StepData(
            seq=n_steps + 1 + i,
            step=n,
            time=float(n),
            scalars={"loss": 1.0, "flight/resent": 1.0},
            arrays={"grad_norm": norms(50.0 if n == n_steps else 1.0)},
            resent=True,
        )
        for i, n in enumerate(range(first, n_steps + 1))
    ]
    new = [
        StepData(seq=n + RESENT + 1, step=n, time=float(n), scalars={"loss": 1.0}, arrays={})
        for n in range(n_steps + 1, n_steps + 1 + RESENT)
    ]
    return first, late + new


def measure(n_steps: int, n_params: int, rounds: int) -> tuple[float, float, list[str]]:
    """Median seconds of (`judge_late`, `rejudge`) of the late batch on a run of `n_steps`, and the
    findings of the last `judge_late` (codes and first steps)."""
    with tempfile.TemporaryDirectory() as folder:
        store = open_store(f"sqlite:///{folder}/g.db")
        try:
            first, batch = write_run(store, n_steps, n_params)
            engine = Diagnostics(store)
            engine.open_run("r")  # the live state as the stream left it, before the late batch
            store.write_steps("r", batch)
            late, whole = [], []
            found: list[str] = []
            for _ in range(rounds):
                t0 = time.perf_counter()
                judged = engine.judge_late("r", first)
                late.append(time.perf_counter() - t0)
                assert judged is not None, "the window is within the kept snapshots"
                found = [f"{f.code}@{f.first_step}" for f in judged]
                t0 = time.perf_counter()
                engine.rejudge("r")
                whole.append(time.perf_counter() - t0)
            return statistics.median(late), statistics.median(whole), found
        finally:
            store.close()


def _records(n_params: int, n_steps: int) -> Iterator[tuple[int, dict[str, float], dict[str, np.ndarray]]]:
    rng = np.random.default_rng(1)
    for n in range(1, n_steps + 1):
        arrays = {
            "grad_norm": (1 + 0.1 * rng.random(n_params)).astype("<f4"),
            "grad_status": np.full(n_params, 2, "u1"),
        }
        yield n, {"loss": 1.0}, arrays


def snapshot_cost(n_params: int, n_steps: int = 640, rounds: int = 5) -> tuple[float, float, int]:
    """Median ms a step of judging `n_steps` measured steps with and without snapshots (rounds
    interleaved), and the bytes of the arrays one snapshot holds."""
    records = list(_records(n_params, n_steps))
    context = RunContext.of([(f"p{i}", 1000, "float32") for i in range(n_params)])
    times: dict[bool, list[float]] = {True: [], False: []}
    diag = None
    for _ in range(rounds):
        for snapshots in (True, False):
            diag = RunDiagnosis(context, snapshots=snapshots)
            t0 = time.perf_counter()
            for step, scalars, arrays in records:
                diag.observe_record(step, scalars, arrays)
            times[snapshots].append((time.perf_counter() - t0) / n_steps * 1e3)
    assert diag is not None
    return statistics.median(times[True]), statistics.median(times[False]), _array_bytes(copy.deepcopy(diag.checks))


def _array_bytes(value: object) -> int:
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if isinstance(value, dict):
        return sum(_array_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple, deque)):
        return sum(_array_bytes(v) for v in value)
    if hasattr(value, "__dict__"):
        return _array_bytes(vars(value))
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", default="1000,5000,50000")
    parser.add_argument("--params", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--worst", action="store_true", help="place the window where the replay is longest")
    args = parser.parse_args()
    print(
        f"snapshots: every {RunDiagnosis.SNAPSHOT_EVERY} judged steps, the last {RunDiagnosis.SNAPSHOTS} kept",
        flush=True,
    )
    with_snaps, without, size = snapshot_cost(args.params)
    print(
        f"judging a measured step of {args.params} params: {with_snaps:.3f} ms with snapshots, {without:.3f} ms "
        f"without ({with_snaps / without - 1:+.1%}); one snapshot holds {size / 1024:.0f} KiB of arrays",
        flush=True,
    )
    every = RunDiagnosis.SNAPSHOT_EVERY
    for n in (int(x) for x in args.steps.split(",")):
        if args.worst:  # the window's first step, n - RESENT + 1, a multiple of SNAPSHOT_EVERY
            n += (-(n - RESENT + 1)) % every
        late, whole, found = measure(n, args.params, args.rounds)
        print(
            f"late batch at step {n} x {args.params} params: judge_late {late * 1e3:.0f} ms, "
            f"rejudge {whole * 1e3:.0f} ms ({whole / n * 1e3:.2f} ms per stored step; {whole / late:.0f}x); "
            f"found {', '.join(found) or 'nothing'}",
            flush=True,
        )


if __name__ == "__main__":
    main()

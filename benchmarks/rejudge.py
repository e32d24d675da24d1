"""What judging the flight recorder's late norms costs the server: `Diagnostics.rejudge` (a run
diagnosed again from its stored steps, once per batch that resends steps) on a run of N every=1
steps of 100 parameters on SQLite in a temporary folder; the median of 3 per size, per stored step.

    python benchmarks/rejudge.py [--steps 1000,5000] [--params 100]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from gradwatch_server.diagnostics import Diagnostics  # noqa: E402
from gradwatch_server.protocol import parse_message  # noqa: E402
from gradwatch_server.store import StepData, open_store  # noqa: E402
from support.wiremsg import hello  # noqa: E402


def measure(n_steps: int, n_params: int) -> float:
    """Seconds of one rejudge of a stored run of `n_steps` steps (median of 3)."""
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as folder:
        store = open_store(f"sqlite:///{folder}/g.db")
        try:
            store.open_run(parse_message(json.dumps(hello("r", params=[f"p{i}" for i in range(n_params)]))))  # type: ignore[arg-type]
            for start in range(1, n_steps + 1, 500):
                store.write_steps(
                    "r",
                    [
                        StepData(
                            seq=n,
                            step=n,
                            time=float(n),
                            scalars={"loss": 1.0},
                            arrays={
                                "grad_norm": (1 + 0.1 * rng.random(n_params)).astype("<f4").tobytes(),
                                "grad_status": bytes([2] * n_params),
                            },
                        )
                        for n in range(start, min(start + 500, n_steps + 1))
                    ],
                )
            engine = Diagnostics(store)
            engine.open_run("r")
            times = []
            for _ in range(3):
                t0 = time.perf_counter()
                engine.rejudge("r")
                times.append(time.perf_counter() - t0)
            return statistics.median(times)
        finally:
            store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", default="1000,5000")
    parser.add_argument("--params", type=int, default=100)
    args = parser.parse_args()
    for n in (int(x) for x in args.steps.split(",")):
        seconds = measure(n, args.params)
        print(f"{n} steps x {args.params} params: rejudge {seconds * 1e3:.0f} ms ({seconds / n * 1e3:.2f} ms per step)")


if __name__ == "__main__":
    main()

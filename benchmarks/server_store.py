"""The server's own work on a pace of unmeasured steps, in one process: no sleep, no socket.

What `gradwatch serve` does with the frames of one pace of an `every="auto"` run between its
measured steps, timed by this thread's CPU clock: parse and expand the binary `steps` frames
(`protocol.parse_binary`), make their `StepData`, store them on SQLite as the event loop does
(`Store.try_write_steps`) and judge them (`Diagnostics.observe`). The frames are the hook's own
(`gradwatch.wire.binary_steps`) for `--params` parameters: `--messages` messages of
`--steps-each` steps a pace (the hook writes one a second, and sends at the idle pace of 5 s),
each step with the four scalars an unmeasured step of overhead.py's MLP carries (the user's
loss, `backward_passes`, `lr/0`, `mem/params_bytes`). `--measured` sends measured steps instead,
as `every=1` on AdamW does (six per-parameter metrics and the gradients' status besides).

`server_cpu.py` reads the whole server at a training's pace, where this machine's charge for a
thread's sleep (docs/benchmarks.md) is a large part of what it reads. This reads the work alone,
hot (`--gap 0`) or with `--gap S` seconds of sleep before each pace (the work run cold, as after
the 5 s a server waits between paces):

    PYTHONPATH=$PWD/backend:$PWD/trainer_hook python benchmarks/server_store.py [--paces 200] [--gap 0] [--measured] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import resource
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from gradwatch import wire
from gradwatch.wire import UnsentStep
from gradwatch_server.diagnostics import Diagnostics
from gradwatch_server.ingest import step_data
from gradwatch_server.protocol import parse_binary, parse_message
from gradwatch_server.store import open_store


def hello(run_id: str, params: int) -> str:
    names = [f"{k // 2}.{'weight' if k % 2 == 0 else 'bias'}" for k in range(params)]
    return wire.dumps(
        {
            "v": 1,
            "type": "hello",
            "run": {
                "id": run_id,
                "name": run_id,
                "project": "bench",
                "started_at": time.time(),
                "hook_version": "0.1.0",
                "optimizer": "AdamW",
                "config": {"every": "auto"},
            },
            "params": [
                {"name": n, "shape": [256], "numel": 256, "dtype": "float32", "group": 0, "optimizer": 0} for n in names
            ],
            "groups": [{"optimizer": 0, "index": 0, "name": None, "hparams": {"lr": 1e-4}}],
        }
    )


#: A measured step's per-parameter metrics on AdamW (`every=1`): what the hook sends for each.
MEASURED = ("grad_norm", "param_norm", "exp_avg_norm", "exp_avg_sq_norm", "backward_passes", "grad_clear")


class Hook:
    """The frames a hook sends for its steps (unmeasured, or with `params` measured norms each),
    numbered on from the last."""

    def __init__(self, params: int | None = None) -> None:
        self.seq = self.step = 0
        self.params = params
        self.rng = np.random.default_rng(0)

    def frame(self, steps: int) -> bytes:
        records = []
        for _ in range(steps):
            self.step += 1
            scalars = {
                "loss": 1.0 / self.step,
                "backward_passes": 1.0,
                "lr/0": 1e-4,
                "mem/params_bytes": 168960.0,
            }
            metrics: dict[str, np.ndarray] = {}
            status = None
            if self.params is not None:
                scalars["grad_norm_total"] = 1.0
                noise = np.exp(0.1 * self.rng.standard_normal((len(MEASURED), self.params))).astype(np.float32)
                metrics = {name: noise[i] for i, name in enumerate(MEASURED)}
                metrics["backward_passes"] = np.ones(self.params, dtype=np.float32)
                metrics["grad_clear"] = np.full(self.params, np.nan, dtype=np.float32)
                status = np.full(self.params, 2, dtype=np.uint8)  # non-zero
            records.append(UnsentStep(self.step, 1.7e9 + self.step * 0.05, scalars, metrics, status))
        self.seq += 1
        return wire.binary_steps(self.seq, records)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--paces", type=int, default=200, help="paces timed (after 20 untimed)")
    ap.add_argument("--messages", type=int, default=3, help="messages a pace")
    ap.add_argument("--steps-each", type=int, default=37, help="steps a message")
    ap.add_argument("--params", type=int, default=80, help="the run's parameter tensors")
    ap.add_argument("--gap", type=float, default=0.0, help="seconds of sleep before each pace")
    ap.add_argument("--measured", action="store_true", help="measured steps (every=1, AdamW's norms) instead")
    ap.add_argument("--profile", action="store_true", help="cProfile the timed paces, by own time")
    args = ap.parse_args()
    for flag in ("paces", "messages", "steps_each", "params"):
        if getattr(args, flag) < 1:
            ap.error(f"--{flag.replace('_', '-')} must be at least 1")
    if not args.gap >= 0:
        ap.error("--gap must be 0 or more seconds")

    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(f"sqlite:///{Path(tmp) / 'bench.db'}")
        diagnostics = Diagnostics(store)
        opened = parse_message(hello("bench", args.params), None)
        store.open_run(opened)  # type: ignore[arg-type]
        hook = Hook(args.params if args.measured else None)

        def pace() -> tuple[float, float, float, int, int, int]:
            frames = [hook.frame(args.steps_each) for _ in range(args.messages)]
            if args.gap:
                time.sleep(args.gap)
            before = resource.getrusage(resource.RUSAGE_THREAD)
            t0 = time.thread_time()
            steps = [s for f in frames for s in parse_binary(f, args.params).expand()]  # type: ignore[union-attr]
            batch = [step_data(s) for s in steps]
            t1 = time.thread_time()
            stored = store.try_write_steps("bench", batch)
            t2 = time.thread_time()
            if stored is None or not all(stored):
                raise SystemExit(f"the store did not take the pace at once: {stored}")
            diagnostics.observe("bench", batch)
            t3, after = time.thread_time(), resource.getrusage(resource.RUSAGE_THREAD)
            return (
                t1 - t0,
                t2 - t1,
                t3 - t2,
                len(batch),
                after.ru_minflt - before.ru_minflt,
                after.ru_majflt - before.ru_majflt,
            )

        for _ in range(20):
            pace()
        profile = cProfile.Profile() if args.profile else None
        if profile is not None:
            profile.enable()
        got = [pace() for _ in range(args.paces)]
        if profile is not None:
            profile.disable()
        store.close()

    n = got[0][3]
    parse, write, judge = (statistics.median(g[i] for g in got) for i in range(3))
    whole = statistics.median(g[0] + g[1] + g[2] for g in got)
    print(
        f"{args.paces} paces of {n} {'measured' if args.measured else 'unmeasured'} steps ({args.messages} messages), {args.params} parameters, "
        f"{'hot' if not args.gap else f'{args.gap:g} s asleep before each'}; medians, this thread's CPU:"
    )
    print(
        f"  parse and expand {parse * 1e3:.3f} ms | store {write * 1e3:.3f} ms | judge {judge * 1e3:.3f} ms "
        f"| a pace {whole * 1e3:.3f} ms | a step {whole / n * 1e6:.1f} us | page faults a pace, minor / major "
        f"{statistics.median(g[4] for g in got):.0f} / {statistics.median(g[5] for g in got):.0f}"
    )
    if profile is not None:
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()

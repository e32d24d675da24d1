"""The step records a set of training loops spools, one JSON line per step, for comparing two
checkouts' hooks byte for byte (a change to the training thread's hot path must not change what
the user sees).

Each scenario trains a small seeded model (one torch thread) watched with no server listening,
so that the sender spools every message; the spool is read back and each step message split
into its steps. What differs from one run to the next by nature is left out: the run's id, default
name and start time, the git commit of the working folder, each message's `seq` (how steps are batched depends on the sender's pace), a step's
`time`, and the scalars that time the hook or the process (`hook/*`, `time/*`, `mem/rss_bytes`).
`every="auto"` decides from measured costs: its scenario feeds the sampler fixed figures
(`AutoInterval.observe*` patched here, in both checkouts alike), so that the same steps are
measured in both.

    OMP_NUM_THREADS=1 PYTHONPATH=<checkout>/trainer_hook python benchmarks/step_records.py > <checkout>.jsonl
    diff main.jsonl branch.jsonl && echo same
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

import gradwatch
from gradwatch import sampling, spool

NOWHERE = "http://127.0.0.1:9"  # nothing listens: the hook spools
STEPS = 40  # more than two of the rounds the scan checks with hooks (VERIFY_EVERY = 16)
#: scalars that time the hook or the process: they differ from run to run
VARYING = ("hook/", "time/", "mem/rss_bytes")


def mlp(width: int = 8, layers: int = 6) -> torch.nn.Sequential:
    return torch.nn.Sequential(
        *[torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Tanh()) for _ in range(layers)]
    )


def plain(every: Any = 1, set_to_none: bool = True, micro: int = 1, clip: bool = False) -> Callable[[], None]:
    def run() -> None:
        model = mlp()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        w = gradwatch.watch(opt, model=model, server=NOWHERE, every=every, warn=False)
        for _ in range(STEPS):
            opt.zero_grad(set_to_none=set_to_none)
            for _ in range(micro):
                x = torch.randn(4, 8)
                loss = model(x).square().mean() / micro
                loss.backward()
            if clip:
                w.log(loss=loss.detach())
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            opt.step()
        w.close(timeout=0.2)

    return run


def mixed() -> None:
    """Tensors of many sizes: some read by the fused norm, others stacked (norm_plan)."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 80), torch.nn.Tanh(), torch.nn.Linear(80, 80), torch.nn.Tanh())
    model.append(torch.nn.Linear(80, 8))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    w = gradwatch.watch(opt, model=model, server=NOWHERE, every=1, warn=False)
    for _ in range(STEPS):
        opt.zero_grad()
        model(torch.randn(4, 8)).square().mean().backward()
        opt.step()
    w.close(timeout=0.2)


def forgotten() -> None:
    """zero_grad() forgotten at some steps, a `.grad` set to None by hand at others."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    w = gradwatch.watch(opt, model=model, server=NOWHERE, every=1, warn=False)
    params = list(model.parameters())
    for s in range(STEPS):
        if s % 5:
            opt.zero_grad()
        if s % 7 == 3:
            params[2].grad = None
        model(torch.randn(4, 8)).square().mean().backward()
        opt.step()
    w.close(timeout=0.2)


def gan() -> None:
    """Two optimizers: D steps on real and fake, G's loss backpropagates through D."""
    d, g = mlp(layers=3), mlp(layers=3)
    opt_d = torch.optim.Adam(d.parameters(), lr=1e-3)
    opt_g = torch.optim.Adam(g.parameters(), lr=1e-3)
    w = gradwatch.watch(
        [opt_d, opt_g], model=torch.nn.ModuleDict({"d": d, "g": g}), server=NOWHERE, every=1, warn=False
    )
    for _ in range(STEPS):
        fake = g(torch.randn(4, 8))
        opt_d.zero_grad()
        (d(torch.randn(4, 8)).mean() - d(fake.detach()).mean()).backward()
        opt_d.step()
        opt_g.zero_grad()
        d(fake).mean().backward()
        opt_g.step()
    w.close(timeout=0.2)


def frozen() -> None:
    """A frozen layer in the optimizer (requires_grad False) and one outside it."""
    model = mlp()
    model[1][0].requires_grad_(False)
    opt = torch.optim.AdamW([p for n, p in model.named_parameters() if not n.startswith("5.")], lr=1e-2)
    w = gradwatch.watch(opt, model=model, server=NOWHERE, every=1, warn=False)
    for _ in range(STEPS):
        opt.zero_grad()
        model(torch.randn(4, 8)).square().mean().backward()
        opt.step()
    w.close(timeout=0.2)


def added_mid_run() -> None:
    """A parameter group added to the optimizer after watch() (its parameters are not watched)."""
    model, extra = mlp(), torch.nn.Linear(8, 8)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    w = gradwatch.watch(opt, model=model, server=NOWHERE, every=1, warn=False)
    for s in range(STEPS):
        if s == STEPS // 2:
            opt.add_param_group({"params": extra.parameters(), "lr": 1e-3})
        opt.zero_grad()
        (model(torch.randn(4, 8)) + extra(torch.randn(4, 8))).square().mean().backward()
        opt.step()
    w.close(timeout=0.2)


def auto() -> None:
    """every="auto" with the sampler fed fixed costs: every few steps measured, the same in both."""
    sampling.AutoInterval.observe = lambda self, cost_s, step_time_s, every_step_s=0.0: _fixed(self)  # type: ignore[method-assign]
    sampling.AutoInterval.observe_step = lambda self, measured_s, step_time_s: None  # type: ignore[method-assign]
    sampling.AutoInterval.observe_every_step = lambda self, every_step_s: None  # type: ignore[method-assign]
    plain(every="auto")()


def _fixed(sampler: sampling.AutoInterval) -> None:
    sampler.interval = 1 + (sampler.interval % 4)  # 2, 3, 4, 1, 2, ...


SCENARIOS: dict[str, Callable[[], None]] = {
    "every=1": plain(),
    "every=3": plain(every=3),
    "auto": auto,
    "accumulation": plain(micro=3),
    "set_to_none=False": plain(set_to_none=False),
    "clip+log": plain(clip=True),
    "forgotten": forgotten,
    "mixed sizes": mixed,
    "gan": gan,
    "frozen": frozen,
    "added mid-run": added_mid_run,
}


def records(path: Path) -> Iterator[dict[str, Any]]:
    """The spool's messages, step messages split into one record per step, normalized."""
    texts, _ = spool.read_records(path)
    for text in texts:
        message = json.loads(text)
        message.pop("seq", None)
        if message.get("type") == "hello":
            message["run"].pop("id", None)
            message["run"].pop("started_at", None)
            message["run"].pop("name", None)  # a default name is the time it started
            message["run"].get("config", {}).get("context", {}).pop("git", None)  # the checkout's commit
            yield message
            continue
        if message.get("type") not in ("step", "steps"):
            yield message
            continue
        many = message["type"] == "steps"
        steps = message["step"] if many else [message["step"]]
        n = len(steps)
        params = {
            k: np.frombuffer(base64.b64decode(v), dtype=np.float32).reshape(n, -1)
            for k, v in message.get("params", {}).items()
        }
        status = message.get("grad_status")
        status_rows = None if status is None else np.frombuffer(base64.b64decode(status), dtype=np.uint8).reshape(n, -1)
        for k, step in enumerate(steps):
            scalars = {
                name: (values[k] if many else values)
                for name, values in message.get("scalars", {}).items()
                if not name.startswith(VARYING)
            }
            yield {
                "step": step,
                "scalars": scalars,
                "params": {name: rows[k].tobytes().hex() for name, rows in params.items()},
                "grad_status": None if status_rows is None else status_rows[k].tobytes().hex(),
                **{key: message[key] for key in ("v", "grad_digest") if key in message},
            }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated (default: all)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    logging.getLogger("gradwatch").setLevel(logging.ERROR)  # "kept in the spool": it is read here
    for name in args.scenarios.split(","):
        with tempfile.TemporaryDirectory(prefix="gradwatch-records-") as tmp:
            os.environ["GRADWATCH_SPOOL"] = tmp
            torch.manual_seed(0)
            SCENARIOS[name]()
            (path,) = Path(tmp).glob("*" + spool.SUFFIX)
            for record in records(path):
                print(json.dumps({"scenario": name, **record}, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())

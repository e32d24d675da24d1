"""What the hook's background costs per measured step, on the training's machine: the sender
thread's CPU, all the hook's threads' (the sender's and its websocket's), and its server's.

overhead.py's MLP (40 Linear(256), 80 tensors), AdamW, one torch thread, `every=1`, streaming to
a real local `gradwatch serve` (SQLite in a temporary folder): after 10 untimed steps and the
server's acks of them, `--steps` steps at the training's own pace, then until the server has
acknowledged them; each figure is CPU seconds over those steps, read on the kernel's CPU clocks
(overhead.py's `hook_threads_cpu`, `process_cpu`). The hook is whichever `gradwatch` imports:
compare two checkouts by running this once with each on PYTHONPATH, in turn, a few times
(docs/benchmarks.md).

    PYTHONPATH=<checkout>/trainer_hook:<checkout>/backend python benchmarks/sender_cpu.py [--steps 400]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def sender_cpu() -> float:
    """CPU seconds so far of this process's gradwatch sender thread(s)."""
    return sum(
        time.clock_gettime(time.pthread_getcpuclockid(t.ident))
        for t in threading.enumerate()
        if t.name == "gradwatch-sender" and t.ident is not None
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=400, help="timed steps (default 400)")
    args = ap.parse_args()
    if args.steps < 10:
        ap.error("--steps must be 10 or more")

    import torch
    from overhead import acked, hook_threads_cpu, mlp_task, process_cpu, start_server, stop_server  # a sibling script

    import gradwatch

    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["GRADWATCH_SPOOL"] = str(Path(tmp) / "spool")
        server, url = start_server(Path(tmp))
        try:
            model, loss_fn = mlp_task()
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
            w = gradwatch.watch(opt, model=model, run="sender-cpu", project="bench", server=url, every=1, warn=False)

            def step() -> None:
                opt.zero_grad(set_to_none=True)
                loss_fn(model).backward()
                opt.step()

            for _ in range(10):
                step()
            acked(w)
            load = os.getloadavg()[0]
            sender, hook, served, trained = (
                sender_cpu(),
                hook_threads_cpu(),
                process_cpu(server.pid),
                time.thread_time(),
            )
            for _ in range(args.steps):
                step()
            trained = time.thread_time() - trained
            acked(w)
            per = 1e3 / args.steps
            print(
                f"gradwatch from {Path(gradwatch.__file__).parent}: {args.steps} steps, load {load:.1f} -> "
                f"{os.getloadavg()[0]:.1f}; ms a step: training thread {trained * per:.1f}, sender thread "
                f"{(sender_cpu() - sender) * per:.3f}, hook threads {(hook_threads_cpu() - hook) * per:.3f}, "
                f"server {(process_cpu(server.pid) - served) * per:.3f}",
                flush=True,
            )
            w.close()
        finally:
            stop_server(server)


if __name__ == "__main__":
    main()

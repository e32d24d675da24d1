"""What the hook costs a training step, measured side by side in one run (`make bench`).

Variants, interleaved round by round on the same model and optimizer:
  baseline            the plain training step
  naive .item()       per-tensor torch.linalg.vector_norm(...).item() of grads (what most loggers do)
  tb scalar           TensorBoard: add_scalar of each grad's norm (.item() per tensor), every step
  tb histogram        TensorBoard: add_histogram of each grad, every step
  wandb.watch         wandb (offline) watch(log="all", log_freq=1) and a wandb.log per step
  gradwatch every=1   the hook, streaming every step to a real local `gradwatch serve`
  gradwatch auto      the same with every="auto" (1% budget; unmeasured steps send cheap facts)
  gradwatch no server every=1 with no server listening: everything goes to the spool on disk
  floor               one 2-thread .sum() over the bytes the hook reads (grad, param, Adam moments)

The peers (tensorboard, wandb) are installed for the benchmark only (tests/bench/requirements-peers.txt,
`make bench`); a peer that is not installed is reported as "n/a".

Per round, the variants in a shuffled order, each timed between two baseline runs: its median
step time (for every="auto", which measures only some steps, the mean over a run 4x as long,
each step capped at twice the median) against the mean of theirs; the figure is the median over
rounds of that paired ratio variant/baseline - 1. Each timed run starts after WARMUP untimed steps of its
own (a fresh watch() allocates its buffers at its first measured step: a one-time cost, not the
steady state a long run pays); every="auto" after AUTO_WARMUP, once it has learnt its interval.
The server's CPU per step is printed beside the table: it runs on the same 2 cores, so it is
in the step times already, as much as it competes with the training threads. The CPU of the hook's own threads (gradwatch-sender, ...), read
per thread, is charged: "charged" adds it to the step time, as if it ran on the training core.
(Not the process's CPU beyond the training thread: torch's intra-op worker spins for as long as
the training thread works, measured equal to it per step with and without the hook, so that
figure would count the hook's training-thread time twice.)

    python tests/bench/overhead.py [--rounds 7] [--steps 15] [--models gpt,mlp] [--variants ...]

On the MLP prefer --steps 25 (a timed run of about a second): the hook sends once per second
while no browser watches, and a shorter run holds the server's work on that batch or not.
"""
from __future__ import annotations

import argparse
import atexit
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Callable, NamedTuple

import torch
from torch import nn

import gradwatch


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(nn.functional.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    """GPT-style: 6 blocks, d=384, vocab 8192, tied head: 13.8M parameters in 76 tensors."""

    def __init__(self, vocab: int = 8192, d: int = 384, layers: int = 6, context: int = 256) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(context, d)
        self.blocks = nn.ModuleList(Block(d, 6) for _ in range(layers))
        self.ln = nn.LayerNorm(d)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.ln(x) @ self.tok.weight.T


def gpt_task() -> tuple[nn.Module, Callable[[nn.Module], torch.Tensor]]:
    model = GPT()
    data = torch.randint(0, 8192, (8, 129))
    return model, lambda m: nn.functional.cross_entropy(m(data[:, :-1]).flatten(0, 1), data[:, 1:].flatten())


def mlp_task() -> tuple[nn.Module, Callable[[nn.Module], torch.Tensor]]:
    model = nn.Sequential(*[nn.Sequential(nn.Linear(256, 256), nn.ReLU()) for _ in range(40)])
    x = torch.randn(256, 256)
    return model, lambda m: m(x).pow(2).mean()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(tmp: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    exe = Path(sys.executable).with_name("gradwatch")
    proc = subprocess.Popen([str(exe), "serve", "--db", f"sqlite:///{tmp / 'bench.db'}", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            urllib.request.urlopen(url + "/api/health", timeout=1)
            return proc, url
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("the gradwatch server did not start")


WARMUP = 3  # untimed steps before each timed run
#: every="auto" is timed after this many steps of its own: while it learns its interval it
#: measures steps 1, 2 and about 14 (a one-time cost of about two measured steps), and a long
#: run pays its steady state, not that
AUTO_WARMUP = 40


class Timing(NamedTuple):
    median: float  # wall seconds per step
    mean: float  # capped at twice the median per step (see time_steps)
    background: float  # CPU seconds per step of the hook's own threads (hook_threads_cpu)
    server: float = 0.0  # CPU seconds per step of the gradwatch server process (process_cpu)


def hook_threads_cpu() -> float:
    """CPU seconds so far of this process's gradwatch threads (sender, replay), each read on its own clock."""
    total = 0.0
    for t in threading.enumerate():
        if t.name.startswith("gradwatch") and t.ident is not None:
            try:
                total += time.clock_gettime(time.pthread_getcpuclockid(t.ident))
            except (OSError, ProcessLookupError):  # it ended meanwhile
                pass
    return total


def process_cpu(pid: int) -> float:
    """CPU seconds so far (user + system) of process `pid`, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def acked(w: gradwatch.Watcher, timeout: float = 10.0) -> None:
    """Wait until the server has acknowledged everything `w` sent (at most `timeout` s)."""
    deadline = time.monotonic() + timeout
    while w.pending and time.monotonic() < deadline:
        time.sleep(0.01)


def time_steps(model: nn.Module, opt: torch.optim.Optimizer, loss_fn, steps: int,
               after_backward: Callable[[], None] | None = None,
               settle: Callable[[], None] | None = None, warmup: int = WARMUP,
               server_pid: int | None = None) -> Timing:
    """Step times after `warmup` untimed steps, and the hook's threads' CPU seconds per step
    (and the server's, given its pid).

    `settle` (untimed) waits until the hook has sent what it has: called after the warm-up and
    after the timed steps, so that its threads' CPU in between is the timed steps' own work
    (the sender works once per `linger`, up to a second after the steps it sends).
    """
    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss_fn(model).backward()
        if after_backward is not None:
            after_backward()
        opt.step()

    for _ in range(warmup):
        step()
    if settle is not None:
        settle()
    times = []
    cpu0 = hook_threads_cpu()
    server0 = process_cpu(server_pid) if server_pid is not None else 0.0
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    if settle is not None:
        settle()
    background = hook_threads_cpu() - cpu0
    server = process_cpu(server_pid) - server0 if server_pid is not None else 0.0
    median = statistics.median(times)
    # The mean with each step capped at twice the median: a step the hook measures costs ~10-30%
    # more and counts whole; a step this shared machine stalled for 10x does not swamp the mean.
    capped = statistics.fmean(min(t, 2 * median) for t in times)
    return Timing(median, capped, max(background, 0.0) / steps, server / steps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--models", default="gpt,mlp")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of: " + ",".join(VARIANTS))
    args = ap.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    if "baseline" not in variants or set(variants) - set(VARIANTS):
        ap.error(f"--variants must include baseline and name only: {','.join(VARIANTS)}")
    torch.set_flush_denormal(True)  # decayed Adam state turns denormal and slows every variant alike
    torch.manual_seed(0)

    with tempfile.TemporaryDirectory() as tmp:
        os.environ["GRADWATCH_SPOOL"] = str(Path(tmp) / "spool")
        server, url = start_server(Path(tmp))
        try:
            rows = [bench(name, url, server.pid, args.rounds, args.steps, variants, Path(tmp))
                    for name in args.models.split(",")]
        finally:
            server.send_signal(signal.SIGINT)
            server.wait(timeout=10)
    print()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} cores; "
          f"{args.rounds} interleaved rounds x {args.steps} steps; paired median overhead vs baseline")
    shown = [v for v in variants if v != "baseline"]
    cols = [LABELS[v] for v in shown] + ["gradwatch every=1, background CPU charged"] * ("gradwatch" in shown)
    print("| model | baseline step | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 2) + "|")
    for r in rows:
        cells = [_pct(r.get(v)) for v in shown] + [_pct(r.get("gradwatch_charged"))] * ("gradwatch" in shown)
        print(f"| {r['model']} | {r['baseline'] * 1e3:.1f} ms | " + " | ".join(cells) + " |")
    if "gradwatch_spool" in shown and "gradwatch" in shown:
        for r in rows:
            print(f"{r['model']}: step time with the server down vs up: "
                  f"{(1 + r['gradwatch_spool']) / (1 + r['gradwatch']) - 1:+.1%}")
    for r in rows:
        cpu = {k.removeprefix("server_cpu/"): v for k, v in r.items() if k.startswith("server_cpu/")}
        if cpu:
            print(f"{r['model']}: the server's CPU per step (same machine, not in the figures above): "
                  + ", ".join(f"{LABELS[k]} {v * 1e3:.2f} ms ({v / r['baseline']:.1%} of the step)" for k, v in cpu.items()))
    if "wandb" in shown and "gradwatch" in shown:
        for r in rows:
            if r.get("wandb") is not None and r["gradwatch_charged"] > 0:
                print(f"{r['model']}: wandb.watch costs {r['wandb'] / r['gradwatch_charged']:.0f}x what gradwatch every=1 "
                      "costs (charged)")


VARIANTS = ("baseline", "naive", "tb_scalar", "tb_hist", "wandb", "gradwatch", "gradwatch_auto", "gradwatch_spool",
            "floor")
LABELS = {"naive": "naive `.item()`", "tb_scalar": "TensorBoard `add_scalar`", "tb_hist": "TensorBoard `add_histogram`",
          "wandb": '`wandb.watch(log="all", log_freq=1)`', "gradwatch": "gradwatch every=1",
          "gradwatch_auto": 'gradwatch every="auto"', "gradwatch_spool": "gradwatch every=1, server down (spooling)",
          "floor": "floor"}


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.1%}"


def bench(name: str, url: str, server_pid: int, rounds: int, steps: int, wanted: list[str],
          tmp: Path) -> dict[str, float | None]:
    model, loss_fn = {"gpt": gpt_task, "mlp": mlp_task}[name]()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    named = list(model.named_parameters())
    params = [p for _, p in named]
    time_steps(model, opt, loss_fn, 3)  # warm up: allocate Adam state

    def naive() -> None:
        for p in params:
            torch.linalg.vector_norm(p.grad).item()

    def floor() -> None:  # one multi-threaded pass over what the hook reads
        for p in params:
            st = opt.state[p]
            for t in (p.grad, p, st["exp_avg"], st["exp_avg_sq"]):
                t.sum()

    def with_hook(every: int | str, server: str = url, count: int = steps, warmup: int = WARMUP) -> Callable[[], Timing]:
        def run() -> Timing:
            w = gradwatch.watch(opt, model=model, run=f"bench-{name}-{every}", project="bench", server=server,
                                every=every, warn=False)
            try:
                up = server == url
                return time_steps(model, opt, loss_fn, count, settle=(lambda: acked(w)) if up else None, warmup=warmup,
                                  server_pid=server_pid if up else None)
            finally:
                w.close(timeout=30 if server == url else 0.5)
                if server != url:  # else the next watch() would replay it while others are timed
                    shutil.rmtree(os.environ["GRADWATCH_SPOOL"], ignore_errors=True)
        return run

    variants: dict[str, Callable[[], Timing]] = {
        "baseline": lambda: time_steps(model, opt, loss_fn, steps),
        "naive": lambda: time_steps(model, opt, loss_fn, steps, naive),
        "gradwatch": with_hook(1),
        # every="auto" measures some steps and not others: its figure is the mean over a run long
        # enough for several measured steps (the first step, always measured, included), not a median
        "gradwatch_auto": with_hook("auto", count=4 * steps, warmup=AUTO_WARMUP),
        "gradwatch_spool": with_hook(1, server=f"http://127.0.0.1:{free_port()}"),
        "floor": lambda: time_steps(model, opt, loss_fn, steps, floor),
    }
    if any(k in wanted for k in ("tb_scalar", "tb_hist", "wandb")):
        variants.update(peers(name, model, opt, loss_fn, named, steps, tmp))
    variants = {k: v for k, v in variants.items() if k in wanted}
    measured = [k for k in variants if k != "baseline"]
    ratios: dict[str, list[float]] = {k: [] for k in measured + ["gradwatch_charged"] * ("gradwatch" in variants)}
    base_times = []
    server_cpu: dict[str, list[float]] = {k: [] for k in ("gradwatch", "gradwatch_auto") if k in variants}
    for r in range(rounds):
        # Each variant is timed between two baseline runs and set against their mean: this shared
        # machine's load drifts over seconds, and a baseline timed next to the variant cancels it
        # better than one baseline per round.
        order = list(measured)
        random.Random(r).shuffle(order)
        before = variants["baseline"]()
        for k in order:
            got = variants[k]()
            after = variants["baseline"]()
            base = (before.median + after.median) / 2
            base_times.append(base)
            if k == "gradwatch_auto":
                ratios[k].append(got.mean / ((before.mean + after.mean) / 2) - 1)
            else:
                ratios[k].append(got.median / base - 1)
            if k == "gradwatch":
                ratios["gradwatch_charged"].append((got.median + got.background) / base - 1)
            if k in server_cpu:
                server_cpu[k].append(got.server)
            before = after
        print(f"{name} round {r + 1}/{rounds}: baseline {statistics.median(base_times[-len(order):]) * 1e3:.1f} ms, "
              + ", ".join(f"{k} {v[-1]:+.1%}" for k, v in ratios.items()), flush=True)
    out: dict[str, float | None] = {"model": name, "baseline": statistics.median(base_times)}  # type: ignore[dict-item]
    out.update({k: statistics.median(v) for k, v in ratios.items()})
    # the mean over rounds, not the median: /proc counts CPU in 10 ms ticks, about one per timed run
    out.update({f"server_cpu/{k}": statistics.fmean(v) for k, v in server_cpu.items()})
    return out


def peers(name: str, model: nn.Module, opt: torch.optim.Optimizer, loss_fn, named: list[tuple[str, nn.Parameter]],
          steps: int, tmp: Path) -> dict[str, Callable[[], Timing]]:
    """TensorBoard and wandb variants, for those installed."""
    out: dict[str, Callable[[], Timing]] = {}
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        print("tensorboard is not installed: its variants are n/a (pip install -r tests/bench/requirements-peers.txt)")
    else:
        writer = SummaryWriter(log_dir=str(tmp / f"tb-{name}"))
        count = [0]

        def tb_scalar() -> None:
            count[0] += 1
            for n, p in named:
                writer.add_scalar(f"grad_norm/{n}", torch.linalg.vector_norm(p.grad).item(), count[0])

        def tb_hist() -> None:
            count[0] += 1
            for n, p in named:
                writer.add_histogram(f"grad/{n}", p.grad, count[0])

        out["tb_scalar"] = lambda: time_steps(model, opt, loss_fn, steps, tb_scalar)
        out["tb_hist"] = lambda: time_steps(model, opt, loss_fn, steps, tb_hist)
    try:
        import wandb
    except ImportError:
        print("wandb is not installed: its variant is n/a (pip install -r tests/bench/requirements-peers.txt)")
    else:
        if wandb.run is not None:
            wandb.run.finish()
        run = wandb.init(project="gradwatch-bench", name=name, mode="offline", dir=str(tmp),
                         settings=wandb.Settings(silent=True, console="off"))

        def with_wandb() -> Timing:
            run.watch(model, log="all", log_freq=1)
            last = [0.0]

            def log_step() -> None:  # wandb commits the hooks' histograms with the step's log
                run.log({"step_time": last[0]})
            try:
                return time_steps(model, opt, loss_fn, steps, log_step)
            finally:
                run.unwatch(model)

        out["wandb"] = with_wandb
        atexit.register(run.finish)
    return out


if __name__ == "__main__":
    main()

"""What the hook costs a training step, measured side by side in one run (`make bench`).

Variants, each training its own copy of the model (same weights, same batch, its own AdamW) in a
process of its own, as a training script would, beside a baseline twin (see Remote):
  baseline            the plain training step (each variant's process has its own)
  aa                  a plain copy too, against its twin: the design's own bias, which should read 0
  naive .item()       per-tensor torch.linalg.vector_norm(...).item() of grads (what most loggers do)
  tb scalar           TensorBoard: add_scalar of each grad's norm (.item() per tensor), every step
  tb histogram        TensorBoard: add_histogram of each grad, every step
  wandb.watch         wandb (offline) watch(log="all", log_freq=1) and a wandb.log per step
  gradwatch every=1   the hook, streaming every step to a real local `gradwatch serve`
  gradwatch auto      the same with every="auto" (0.4% budget, all told; unmeasured steps send cheap facts)
  gradwatch unmeasured every=10**9: only its first step is measured, what every other step of
                      every="auto" costs (a sentinel, the cheap facts), alone
  gradwatch no server every=1 with no server listening: everything goes to the spool on disk
  floor               one .sum() (on torch's threads) over the bytes the hook reads, where it reads them:
                      the grads before optimizer.step(), the params and Adam's moments after it
  floor before        the same .sum()s, all before optimizer.step() (the floor until 2026-11-26): its
                      reads of the params and moments warm the caches that the step then reads

The peers (tensorboard, wandb) are installed for the benchmark only (benchmarks/requirements-peers.txt,
`make bench`); a peer that is not installed is reported as "n/a".

The steps are interleaved one by one. A cycle visits every variant's process once, in a
shuffled order; there a third copy of the model steps once untimed (the first step after the
switch to a process is slower), then the twin, the variant and the twin again, so each variant
step lies between two baseline steps of the same process taken within a second of it; its ratio
to their mean, minus 1, is that cycle's overhead. Every timed step follows another copy's step,
so each finds its own tensors equally cold in the CPU caches (a timed step right after its own
copy's finds them warm, which biases its pair: docs/benchmarks.md, "The A/A bias of a twin's warm
step"). What the order of a cycle's steps
still does to every copy alike, the A/A reads: with `aa` among the variants, each gradwatch
figure is printed again beyond it (less the A/A's median, cycle by cycle). This shared machine's speed changes from one second to the
next (whole runs of 12 steps timed round by round spread by +-15% on the GPT), and a step's
neighbours share its conditions.
Where a copy's tensors lie moves its steps for the copy's whole life (tens to hundreds of µs at
width 256), and each run places them once: with `--blocks K` the cycles are taken in K blocks,
every process's copies moved to fresh memory before each (the same values and objects), so that
a figure pools K placements (docs/benchmarks.md).
A variant's figure is the median over cycles, with a 90% bootstrap interval. Before the cycles
each variant takes WARMUP untimed steps (a fresh watch() allocates its buffers at its first
measured step), every="auto" AUTO_WARMUP: while it learns its interval it measures steps 1, 2
and about 14, a one-time cost of about two measured steps; a long run pays its steady state.

What interleaving cannot see is measured on each gradwatch variant alone, in a run of SEGMENT
consecutive steps at the training's own pace (4x as many for every="auto") after its warm-up:
- Background work: the hook's threads (its sender, its websocket's) and its server (one per
  variant, so that each one's CPU is its own). It runs while every variant steps, so the paired
  ratio does not see it; and its cost per step depends on the pace (the sender batches what a
  `linger`, 5 s while no browser watches, brings: a segment holds a few of the server's batches,
  whose fixed costs the longer MLP segment spreads). Its own variant's steps see a part of it
  (its hooks may wait for the GIL while its sender serializes).
  A gradwatch figure is charged the CPU seconds of its hook's threads and of its server per
  step of that run, as if they ran on the training's cores one after the other (an upper bound:
  on 2 cores they also run beside it), and prints the two apart. Both are read on the kernel's
  CPU clocks, to the nanosecond: the hook's threads as the training process's CPU less its
  training thread's and torch's own threads' (threads that ended, such as a connection
  attempt's, stay counted), the server as its process's (/proc's 10 ms ticks, the fallback, read
  0.1 ms a step over 100 steps). The peers' background (wandb's service process) is not
  charged, which favours them.
- How often every="auto" measures: it budgets 0.4% of the time between its steps, which the
  cycles stretch. Its figure is the median of its measured steps and that of its unmeasured
  steps in the cycles, weighted by how often it measured in that run (Watcher.measured_steps).

    python benchmarks/overhead.py [--models gpt,mlp,wide] [--cycles N] [--variants baseline,...] [--clock cpu]

Models: `gpt` (13.8M parameters), `mlp` (40 Linear(256), 80 tensors), `wide` (800 Linear(64),
1,600 tensors: where per-tensor costs show; not run by default).
"""

from __future__ import annotations

import argparse
import atexit
import copy
import ctypes
import multiprocessing
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def wide_task() -> tuple[nn.Module, Callable[[nn.Module], torch.Tensor]]:
    """1,600 parameter tensors (800 Linear(64) layers): where per-tensor costs show."""
    model = nn.Sequential(*[nn.Sequential(nn.Linear(64, 64), nn.ReLU()) for _ in range(800)])
    x = torch.randn(256, 64)
    return model, lambda m: m(x).pow(2).mean()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(tmp: Path) -> tuple[subprocess.Popen, str]:
    """A `gradwatch serve` of its own, on SQLite in `tmp`, on a free port."""
    port = free_port()
    exe = Path(sys.executable).with_name("gradwatch")
    proc = subprocess.Popen(
        [str(exe), "serve", "--db", f"sqlite:///{tmp / 'bench.db'}", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60  # a loaded machine (load average 15) took more than 10 s
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url + "/api/health", timeout=1)
            return proc, url
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("the gradwatch server did not start")


def stop_server(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


#: what a step's time is: wall time, or the training thread's CPU time (`--clock cpu`: with
#: OMP_NUM_THREADS=1 all of a step's work is on that thread; on a loaded shared machine the wall
#: time of a step also counts the seconds it waited for a core, which varies step to step by more
#: than the hook costs). The background's CPU is charged the same way with either clock.
CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}
CLOCK = ["wall"]
MALLOC = ["default"]  # "steady": each lane's process holds glibc's malloc steady (`steady_malloc`)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)


def steady_malloc() -> bool:
    """Stop glibc's malloc from giving the heap's top back to the kernel and from mmapping
    tensors below 32 MiB (its largest threshold), so that a steady training loop faults no page
    in (`zero_grad(set_to_none=True)` frees a model's gradients each step: where they lay at the
    heap's top, the next backward faults them all back in); False where there is no glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1)) and bool(libc.mallopt(M_MMAP_THRESHOLD, 32 << 20))
    except (OSError, AttributeError):
        return False


WARMUP = 3  # untimed steps of each variant before the timed cycles
#: every="auto" takes this many untimed steps: while it learns its interval it measures steps
#: 1, 2 and about 14 (a one-time cost of about two measured steps), and a long run pays its
#: steady state, not that
AUTO_WARMUP = 40
CYCLES = {"mlp": 200, "gpt": 30, "wide": 60}  # default timed cycles per model: a few minutes each
#: consecutive steps of a gradwatch variant alone: about 20 s (the MLP: four of the server's 5 s
#: batches, so that one more or less moves its figure by a quarter of a batch's fixed cost), 7 s
SEGMENT = {"mlp": 300, "gpt": 12, "wide": 30}


def _cpu_clock(clock: int) -> float | None:
    try:
        return time.clock_gettime(clock)
    except (OSError, OverflowError):  # gone, or not Linux
        return None


def process_cpu(pid: int) -> float:
    """CPU seconds so far (user + system, its ended threads included) of process `pid`: Linux's
    CPU clock of that process (clock id `~pid << 3 | 2`, what clock_getcpuclockid gives), to
    the nanosecond; else /proc's ticks (10 ms)."""
    seconds = _cpu_clock((~pid << 3) | 2)
    if seconds is not None:
        return seconds
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Ballast:
    """One busy process per core at SCHED_IDLE (it runs only where a core would otherwise idle),
    stopped until `on()`. On a VM that charges a thread waking on an idle vCPU for the time the
    vCPU slept (this project's machine does: docs/benchmarks.md), the hook's and the server's CPU
    read while the ballast runs is their work, the charge falling on the ballast."""

    CODE = "while True:\n    pass"

    def __init__(self, processes: int | None = None) -> None:
        def idle() -> None:  # in the child, before exec: it never runs at a normal priority
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))

        self.procs = [
            subprocess.Popen([sys.executable, "-c", self.CODE], preexec_fn=idle)
            for _ in range(processes or os.cpu_count() or 1)
        ]
        self.off()

    def on(self) -> None:
        for p in self.procs:
            p.send_signal(signal.SIGCONT)

    def off(self) -> None:
        for p in self.procs:
            p.send_signal(signal.SIGSTOP)

    def close(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait()


def wake_cost(rounds: int = 8, gap: float = 0.2) -> tuple[float, float]:
    """What this machine charges for sleeping and waking, in CPU seconds (medians of `rounds`):
    a thread's CPU clock across a `gap` s sleep (nothing, on bare metal), and what a thread pays
    to wake another that sleeps (`threading.Event.set`, after a 2 ms spin that takes its own
    wake's charge first: a few µs on bare metal). On a VM that charges them (this project's:
    docs/benchmarks.md), the background's figures move with them: benchmarks print them beside
    their figures."""
    asleep, waking = [], []
    for _ in range(rounds):
        event, ready = threading.Event(), threading.Event()

        def wait(event: threading.Event = event, ready: threading.Event = ready) -> None:
            ready.set()
            event.wait()

        waiter = threading.Thread(target=wait, daemon=True)
        waiter.start()
        ready.wait()
        before = time.thread_time()
        time.sleep(gap)  # the waiter is asleep in its wait by now
        asleep.append(time.thread_time() - before)
        spin = time.perf_counter()
        while time.perf_counter() - spin < 0.002:
            pass
        before = time.thread_time()
        event.set()
        waking.append(time.thread_time() - before)
        waiter.join()
    return statistics.median(asleep), statistics.median(waking)


def wake_line() -> str:
    """`wake_cost` as a line for a benchmark's header."""
    asleep, waking = wake_cost()
    return (
        f"this machine charges a 0.2 s sleep {asleep * 1e6:.0f} us of CPU and a wake of a sleeping "
        f"thread {waking * 1e6:.0f} us to the waker (bare metal: 0 and a few)"
    )


def hook_threads_cpu() -> float:
    """CPU seconds so far of this process's threads but the calling (training) thread and those
    that Python did not start (torch's own): the hook's (its sender, its websocket's threads,
    and those that ended: a connection attempt's). Linux's per-thread CPU clocks
    (`~tid << 3 | 6`) for torch's threads."""
    python = {t.native_id for t in threading.enumerate()}
    others = 0.0
    for task in os.listdir("/proc/self/task"):
        tid = int(task)
        if tid not in python:
            others += _cpu_clock((~tid << 3) | 6) or 0.0
    return time.process_time() - time.thread_time() - others


def acked(w: gradwatch.Watcher, timeout: float = 30.0) -> None:
    """Wait until the server has acknowledged everything `w` sent (at most `timeout` s)."""
    deadline = time.monotonic() + timeout
    while w.pending and time.monotonic() < deadline:
        time.sleep(0.01)


class Lane:
    """One variant: its own copy of the model and optimizer, and what it adds to a step."""

    def __init__(self, name: str, model: nn.Module, loss_fn: Callable[[nn.Module], torch.Tensor]) -> None:
        self.name = name
        self.model = copy.deepcopy(model)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.loss_fn = loss_fn
        self.after_backward: Callable[[], None] | None = None
        self.after_step: Callable[[], None] | None = None
        self.watcher: gradwatch.Watcher | None = None
        self.server: subprocess.Popen | None = None
        self.warmup = WARMUP

    def step(self) -> tuple[float, bool]:
        """Seconds of one training step, and whether the hook measured it in full."""
        measured = self.watcher.measured_steps if self.watcher is not None else 0
        t0 = CLOCKS[CLOCK[0]]()
        self.opt.zero_grad(set_to_none=True)
        self.loss_fn(self.model).backward()
        if self.after_backward is not None:
            self.after_backward()
        self.opt.step()
        if self.after_step is not None:
            self.after_step()
        took = CLOCKS[CLOCK[0]]() - t0
        return took, self.watcher is not None and self.watcher.measured_steps > measured

    def watch(self, every: int | str, server: str, spool: Path) -> None:
        """Attach gradwatch, spooling to `spool`."""
        os.environ["GRADWATCH_SPOOL"] = str(spool)
        self.watcher = gradwatch.watch(
            self.opt,
            model=self.model,
            run=f"bench-{self.name}",
            project="bench",
            server=server,
            every=every,
            warn=False,
        )
        # the replay of earlier spools reads GRADWATCH_SPOOL on its own thread: let it finish
        while any(t.name == "gradwatch-replay" and t.is_alive() for t in threading.enumerate()):
            time.sleep(0.01)

    def alone(self, steps: int) -> tuple[float, float, float]:
        """CPU seconds a step of this variant's hook threads and of its server, and the share of
        steps its hook measured, over `steps` consecutive steps at the training's own pace (a
        gradwatch variant; on the training thread)."""
        assert self.watcher is not None
        self.settle()
        hook, server, measured = self.background_cpu(), self.server_cpu(), self.watcher.measured_steps
        for _ in range(steps):
            self.step()
        self.settle()
        return (
            (self.background_cpu() - hook) / steps,
            (self.server_cpu() - server) / steps,
            (self.watcher.measured_steps - measured) / steps,
        )

    def replace(self) -> None:
        """Move this copy's parameters and optimizer state to fresh memory, the same values and
        the same objects: where a copy's tensors lie moves its steps at width 256 by tens to
        hundreds of µs for the copy's whole life (`unmeasured_step.py --blocks`), so a run's
        cycles are taken in blocks, each with its copies placed anew (`--blocks`)."""
        with torch.no_grad():
            for p in self.model.parameters():
                p.data = p.data.clone()
            for state in self.opt.state.values():
                for key, value in list(state.items()):
                    if isinstance(value, torch.Tensor) and value.dim() > 0:
                        state[key] = value.clone()

    def settle(self) -> None:
        """Wait until the watcher's threads have done their work on the steps so far: the server
        has them, or (no server) the spool, which the sender writes every `linger` (0.25 s)."""
        if self.watcher is not None and self.server is not None:
            acked(self.watcher)
        elif self.watcher is not None:
            time.sleep(1.0)

    def background_cpu(self) -> float:
        """CPU seconds so far of this variant's hook threads (0 for a peer), read on the training thread."""
        return hook_threads_cpu() if self.watcher is not None else 0.0

    def server_cpu(self) -> float:
        """CPU seconds so far of this variant's server (0 without one)."""
        return process_cpu(self.server.pid) if self.server is not None else 0.0

    def close(self) -> None:
        if self.watcher is not None:
            self.watcher.close(timeout=30 if self.server is not None else 0.5)
        if self.server is not None:
            stop_server(self.server)


VARIANTS = (
    "baseline",
    "aa",
    "naive",
    "tb_scalar",
    "tb_hist",
    "wandb",
    "gradwatch",
    "gradwatch_auto",
    "gradwatch_unmeasured",
    "gradwatch_spool",
    "floor",
    "floor_before",
)
LABELS = {
    "aa": "A/A (a plain copy)",
    "naive": "naive `.item()`",
    "tb_scalar": "TensorBoard `add_scalar`",
    "tb_hist": "TensorBoard `add_histogram`",
    "wandb": '`wandb.watch(log="all", log_freq=1)`',
    "gradwatch": "gradwatch every=1",
    "gradwatch_auto": 'gradwatch every="auto"',
    "gradwatch_unmeasured": "gradwatch unmeasured",
    "gradwatch_spool": "gradwatch every=1, server down (spooling)",
    "floor": "floor",
    "floor_before": "floor, all read before the step",
}
GRADWATCH = ("gradwatch", "gradwatch_auto", "gradwatch_unmeasured", "gradwatch_spool")


def floor_passes(lane: Lane) -> tuple[Callable[[], None], Callable[[], None]]:
    """The floor variant's two passes over `lane`'s copy: one `.sum()` of every gradient (after
    the backward), and of every parameter and AdamW state tensor (after the step). One pass over
    the bytes the hook reads. The hook reads the grads before the step (as the step uses them)
    and the params and state after it (as the step left them); read before the step instead,
    they are the step's inputs, and reading them warms the caches that the step then reads,
    which refunds part of their reading (docs/benchmarks.md)."""
    named = list(lane.model.named_parameters())

    def grads() -> None:
        for _, p in named:
            if p.grad is not None:
                p.grad.sum()

    def state() -> None:
        for _, p in named:
            st = lane.opt.state[p]
            for t in (p, st.get("exp_avg"), st.get("exp_avg_sq")):
                if t is not None:
                    t.sum()

    return grads, state


def make_lane(kind: str, model: nn.Module, loss_fn: Callable[[nn.Module], torch.Tensor], tmp: Path) -> Lane | None:
    """The variant `kind` on its own copy of `model`; None for a peer that is not installed."""
    lane = Lane(kind, model, loss_fn)
    named = list(lane.model.named_parameters())
    if kind == "naive":

        def naive() -> None:
            for _, p in named:
                torch.linalg.vector_norm(p.grad).item()

        lane.after_backward = naive
    elif kind in ("floor", "floor_before"):
        grads, state = floor_passes(lane)

        def both() -> None:  # each parameter's four tensors in turn, all before the step (floor_before)
            for _, p in named:
                st = lane.opt.state[p]
                for t in (p.grad, p, st.get("exp_avg"), st.get("exp_avg_sq")):
                    if t is not None:
                        t.sum()

        if kind == "floor":
            lane.after_backward, lane.after_step = grads, state
        else:
            lane.after_backward = both
    elif kind in ("tb_scalar", "tb_hist"):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            print(
                "tensorboard is not installed: its variants are n/a (pip install -r benchmarks/requirements-peers.txt)"
            )
            return None
        writer = SummaryWriter(log_dir=str(tmp / kind))
        count = [0]

        def tensorboard() -> None:
            count[0] += 1
            for n, p in named:
                if kind == "tb_scalar":
                    writer.add_scalar(f"grad_norm/{n}", torch.linalg.vector_norm(p.grad).item(), count[0])
                else:
                    writer.add_histogram(f"grad/{n}", p.grad, count[0])

        lane.after_backward = tensorboard
        atexit.register(writer.close)
    elif kind == "wandb":
        try:
            import wandb
        except ImportError:
            print("wandb is not installed: its variant is n/a (pip install -r benchmarks/requirements-peers.txt)")
            return None
        if wandb.run is not None:
            wandb.run.finish()
        run = wandb.init(
            project="gradwatch-bench", mode="offline", dir=str(tmp), settings=wandb.Settings(silent=True, console="off")
        )
        run.watch(lane.model, log="all", log_freq=1)
        lane.after_backward = lambda: run.log({"step": 0})  # wandb commits the hooks' histograms with a log
        atexit.register(run.finish)
    elif kind in GRADWATCH:
        if kind == "gradwatch_spool":
            url = f"http://127.0.0.1:{free_port()}"  # nobody listens
        else:
            (tmp / kind).mkdir()
            lane.server, url = start_server(tmp / kind)
        every = {"gradwatch_auto": "auto", "gradwatch_unmeasured": 10**9}.get(kind, 1)
        lane.watch(every, url, tmp / f"spool-{kind}")
        if kind == "gradwatch_auto":
            lane.warmup = AUTO_WARMUP
    return lane


class Figure:
    """A variant's per-cycle overheads, and which of its steps were measured."""

    def __init__(self) -> None:
        self.ratios: list[float] = []
        self.measured: list[bool] = []
        self.share: float | None = None  # every="auto": the share of steps it measures alone
        self.charge = 0.0  # background CPU a step, as a fraction of the baseline step
        self.background: tuple[float, float] | None = None  # its CPU seconds a step: the hook's threads, the server

    def estimate(self, ratios: list[float] | None = None, measured: list[bool] | None = None) -> float:
        """The median overhead plus the charge; with a share, the medians of measured and
        unmeasured steps weighted by it (when the cycles hold steps of both kinds)."""
        ratios = self.ratios if ratios is None else ratios
        measured = self.measured if measured is None else measured
        kinds = [[r for r, m in zip(ratios, measured) if m is flag] for flag in (True, False)]
        if self.share is None or not all(kinds):
            return statistics.median(ratios) + self.charge
        return self.share * statistics.median(kinds[0]) + (1 - self.share) * statistics.median(kinds[1]) + self.charge

    def interval(self, resamples: int = 1000, seed: int = 0) -> tuple[float, float]:
        """90% bootstrap interval of `estimate` (the cycles resampled with replacement)."""
        rng = random.Random(seed)
        n = len(self.ratios)
        got = []
        for _ in range(resamples):
            picks = [rng.randrange(n) for _ in range(n)]
            got.append(self.estimate([self.ratios[i] for i in picks], [self.measured[i] for i in picks]))
        got.sort()
        return got[int(0.05 * resamples)], got[int(0.95 * resamples) - 1]


def beyond(f: Figure, aa: Figure, resamples: int = 1000, seed: int = 0) -> tuple[float, float, float]:
    """`f`'s estimate less the A/A's median, and its 90% bootstrap interval: the cycles resampled
    with replacement, the same cycles for both (a cycle visits every variant's process), so that
    what the design does to every copy alike (the order of a cycle's steps) cancels."""
    n = min(len(f.ratios), len(aa.ratios))
    rng = random.Random(seed)
    got = []
    for _ in range(resamples):
        picks = [rng.randrange(n) for _ in range(n)]
        got.append(
            f.estimate([f.ratios[i] for i in picks], [f.measured[i] for i in picks])
            - statistics.median(aa.ratios[i] for i in picks)
        )
    got.sort()
    return f.estimate() - statistics.median(aa.ratios), got[int(0.05 * resamples)], got[int(0.95 * resamples) - 1]


TASKS = {"gpt": gpt_task, "mlp": mlp_task, "wide": wide_task}


class Remote:
    """A variant in a process of its own, as a training script has it, with a baseline twin
    (the same model, untouched) beside it: a cycle there steps the twin, the variant, the twin.

    Why a process: in one process for all variants, their threads met at the GIL. A hook's
    Python (gradwatch's post-accumulate-grad hooks, the peers' hooks) waited on the other
    variants' sender, writer and logging threads, which a training with one watcher does not
    have, while the baseline's C++ backward did not wait: gradwatch every="auto" measured
    +2.5% (+1.6% to +3.4%) among all the variants, and +1.2% (+1.0% to +1.7%) with only every=1
    beside it, the same day with the same code. Why a twin in that process: with one baseline
    process for all, a variant step came right after a switch from another process, and its
    neighbouring baseline steps after another: every=1 read +12.6% on the training thread
    against +9.9% in one process; the twin's steps and the variant's now come back to back.
    """

    def __init__(self, kind: str, name: str, tmp: Path) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._proc = context.Process(
            target=_serve_lane, args=(child, kind, name, str(tmp), CLOCK[0], MALLOC[0]), name=f"bench-{kind}"
        )
        self._proc.start()
        child.close()
        self.available: bool = self._conn.recv()  # False: a peer that is not installed

    def _call(self, *command: Any) -> Any:
        self._conn.send(command)
        return self._conn.recv()

    def cycle(self) -> tuple[float, bool, float]:
        """The variant's step against its twin's steps on either side: its overhead, whether the
        hook measured it in full, and the twin's second step (seconds)."""
        return self._call("cycle")

    def warm_up(self) -> None:
        self._call("warm_up")

    def alone(self, steps: int) -> tuple[float, float, float]:
        """See `Lane.alone`."""
        return self._call("alone", steps)

    def replace(self, seed: int) -> None:
        """Place the process's copies anew (`Lane.replace`), in an order `seed` shuffles."""
        self._call("replace", seed)

    def close(self) -> None:
        try:
            if self.available:
                self._call("close")
        except (EOFError, OSError):  # it died: nothing more to close
            pass
        self._proc.join(timeout=60)
        if self._proc.is_alive():
            self._proc.kill()


def _serve_lane(conn: Any, kind: str, name: str, tmp: str, clock: str = "wall", malloc: str = "default") -> None:
    """A variant's process: make its lane and its baseline twin (the model from the same seed as
    every other process's), then answer `Remote`'s commands until "close"."""
    CLOCK[0] = clock
    if malloc == "steady":
        steady_malloc()
    torch.set_flush_denormal(True)  # decayed Adam state turns denormal and slows every variant alike
    torch.manual_seed(0)
    model, loss_fn = TASKS[name]()
    lane = make_lane(kind, model, loss_fn, Path(tmp))
    conn.send(lane is not None)
    if lane is None:
        return
    twin = Lane("baseline", model, loss_fn)
    other = Lane("baseline", model, loss_fn)  # steps first, untimed: every timed step follows another copy's
    try:
        while True:
            command, *args = conn.recv()
            if command == "cycle":
                other.step()  # the first step after the switch to this process is slower: untimed
                before = twin.step()[0]
                took, measured = lane.step()
                after = twin.step()[0]
                conn.send((took / ((before + after) / 2) - 1, measured, after))
            elif command == "warm_up":
                for _ in range(lane.warmup):
                    lane.step()
                for _ in range(twin.warmup):
                    twin.step()
                    other.step()
                conn.send(None)
            elif command == "alone":
                conn.send(lane.alone(*args))
            elif command == "replace":
                copies = [lane, twin, other]
                random.Random(args[0]).shuffle(copies)
                for each in copies:
                    each.replace()
                for _ in range(2):  # the first steps after a move fault its pages in: untimed
                    for each in copies:
                        each.step()
                conn.send(None)
            else:
                break
    finally:
        lane.close()
        conn.send(None)


def bench(name: str, cycles: int, wanted: list[str], tmp: Path, blocks: int = 1) -> dict[str, Any]:
    """Model `name` with the variants `wanted` (each in its process, with its twin): the
    baseline step (median seconds of the twins') and a Figure per variant. The cycles are taken
    in `blocks` blocks, every process's copies placed anew before each block but the first."""
    lanes: dict[str, Remote] = {}
    try:
        for kind in wanted:
            if kind == "baseline":  # each variant's process has its own
                continue
            lane = Remote(kind, name, tmp / name)
            if lane.available:
                lanes[kind] = lane
            else:
                lane.close()
        for lane in lanes.values():
            lane.warm_up()
        figures = {k: Figure() for k in lanes}
        alone = {
            k: lanes[k].alone(SEGMENT[name] * (4 if k == "gradwatch_auto" else 1)) for k in lanes if k in GRADWATCH
        }
        if "gradwatch_auto" in alone:
            figures["gradwatch_auto"].share = alone["gradwatch_auto"][2]
        base_times: list[float] = []
        report = max(1, cycles // 10)
        starts = {cycles * b // blocks for b in range(1, blocks)}
        for c in range(cycles):
            if c in starts:
                for lane in lanes.values():
                    lane.replace(c)
            order = list(lanes)
            random.Random(c).shuffle(order)
            for k in order:
                ratio, measured, base = lanes[k].cycle()
                figures[k].ratios.append(ratio)
                figures[k].measured.append(measured)
                base_times.append(base)
            if (c + 1) % report == 0 or c + 1 == cycles:
                print(
                    f"{name} cycle {c + 1}/{cycles} (background not charged yet): baseline "
                    f"{statistics.median(base_times) * 1e3:.1f} ms, "
                    + ", ".join(f"{k} {f.estimate():+.1%}" for k, f in figures.items()),
                    flush=True,
                )
    finally:
        for lane in lanes.values():
            lane.close()
    step = statistics.median(base_times)
    for k, (hook, server, _) in alone.items():
        figures[k].charge = (hook + server) / step
        figures[k].background = (hook, server)
    return {"model": name, "baseline": step, "figures": figures}


def _cell(figure: Figure | None) -> str:
    if figure is None:
        return "n/a"
    low, high = figure.interval()
    return f"{figure.estimate():+.1%} ({low:+.1%} to {high:+.1%})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--cycles",
        type=int,
        default=None,
        help="timed cycles per model (default: " + ", ".join(f"{k} {v}" for k, v in CYCLES.items()) + ")",
    )
    ap.add_argument("--models", default="gpt,mlp")
    ap.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="a step's time: wall, or the training thread's CPU (with OMP_NUM_THREADS=1, on a loaded machine)",
    )
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of: " + ",".join(VARIANTS))
    ap.add_argument(
        "--malloc",
        choices=("default", "steady"),
        default="default",
        help="glibc's malloc as it is (default), or held steady in each lane: no page faults from heap trimming",
    )
    ap.add_argument(
        "--blocks",
        type=int,
        default=1,
        help="take the cycles in this many blocks, every copy's tensors moved to fresh memory before "
        "each (where they lie moves a step for the copy's life; default 1: one placement)",
    )
    args = ap.parse_args()
    CLOCK[0] = args.clock
    MALLOC[0] = args.malloc
    variants = [v for v in args.variants.split(",") if v]
    models = [m for m in args.models.split(",") if m]
    if "baseline" not in variants or len(variants) < 2 or set(variants) - set(VARIANTS):
        ap.error(f"--variants must include baseline and another, and name only: {','.join(VARIANTS)}")
    if not models or set(models) - set(CYCLES):
        ap.error(f"--models must name some of: {','.join(CYCLES)}")
    if args.cycles is not None and args.cycles < 2:
        ap.error("--cycles must be 2 or more")
    if args.blocks < 1 or args.blocks > (args.cycles or min(CYCLES[m] for m in models)):
        ap.error("--blocks must be at least 1 and at most the cycles")
    with tempfile.TemporaryDirectory() as tmp:
        rows = []
        for name in models:
            (Path(tmp) / name).mkdir()
            rows.append(bench(name, args.cycles or CYCLES[name], variants, Path(tmp), args.blocks))
    print()
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} cores, {args.clock} clock, "
        f"malloc {'held steady' if args.malloc == 'steady' else 'as it is'}; "
        + (f"{args.blocks} blocks of cycles, the copies placed anew before each; " if args.blocks > 1 else "")
        + "steps interleaved "
        "one by one; median overhead vs the neighbouring baseline steps (90% bootstrap interval); gradwatch "
        "with its sender's and its server's CPU charged"
    )
    shown = [v for v in variants if v != "baseline" and any(v in r["figures"] for r in rows)]
    print("| model | baseline step | cycles | " + " | ".join(LABELS[v] for v in shown) + " |")
    print("|---" * (len(shown) + 3) + "|")
    for r in rows:
        figures = r["figures"]
        print(
            f"| {r['model']} | {r['baseline'] * 1e3:.1f} ms | {len(next(iter(figures.values())).ratios)} | "
            + " | ".join(_cell(figures.get(v)) for v in shown)
            + " |"
        )
    for r in rows:
        figures, step = r["figures"], r["baseline"]
        for v in (v for v in GRADWATCH if v in figures):
            f = figures[v]
            share = f"; it measured {f.share:.1%} of its steps alone" if f.share is not None else ""
            split = (
                ""
                if f.background is None
                else " (hook threads {:.3f} ms, server {:.3f} ms)".format(*(1e3 * s for s in f.background))
            )
            print(
                f"{r['model']} {LABELS[v]}: on the training thread {f.estimate() - f.charge:+.1%}, its threads and "
                f"server {f.charge * step * 1e3:.2f} ms a step (+{f.charge:.1%}){split}{share}"
            )
            if "aa" in figures:
                diff, lo, hi = beyond(f, figures["aa"])
                print(f"{r['model']} {LABELS[v]} beyond the A/A: {diff:+.1%} ({lo:+.1%} to {hi:+.1%})")
        total = {v: f.estimate() for v, f in figures.items()}
        if "wandb" in total and total.get("gradwatch", 0) > 0:
            print(
                f"{r['model']}: wandb.watch costs {total['wandb'] / total['gradwatch']:.0f}x what gradwatch every=1 costs"
            )
        for floor in ("floor", "floor_before"):
            if total.get(floor, 0) > 0 and "gradwatch" in total:
                # a floor has no background: its like is the training thread's share, shown beside the total
                thread = figures["gradwatch"].estimate() - figures["gradwatch"].charge
                print(
                    f"{r['model']}: gradwatch every=1 costs {total['gradwatch'] / total[floor]:.2f}x the "
                    f"{LABELS[floor]} ({thread / total[floor]:.2f}x on the training thread)"
                )


if __name__ == "__main__":
    main()

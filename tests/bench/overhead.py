"""What the hook costs a training step, measured side by side in one run (`make bench`).

Variants, interleaved round by round on the same model and optimizer:
  baseline            the plain training step
  naive .item()       per-tensor torch.linalg.vector_norm(...).item() of grads (what most loggers do)
  gradwatch every=1   the hook, streaming every step to a real local `gradwatch serve`
  floor               one 2-thread .sum() over the bytes the hook reads (grad, param, Adam moments)

Per round, each variant's median step time; the figure is the median over rounds of the paired
ratio variant/baseline - 1. The hook's background (sender thread) CPU per step is measured too
and charged: "charged" adds what it takes beyond the baseline's (torch's intra-op threads count
there too) to the variant's step time, as if it ran on the training core.

    python tests/bench/overhead.py [--rounds 7] [--steps 15] [--models gpt,mlp]
"""
from __future__ import annotations

import argparse
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Callable

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


def time_steps(model: nn.Module, opt: torch.optim.Optimizer, loss_fn, steps: int,
               after_backward: Callable[[], None] | None = None) -> tuple[float, float]:
    """Median wall time per step, and background-thread CPU seconds per step."""
    times = []
    cpu0, thread0 = time.process_time(), time.thread_time()
    for _ in range(steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss_fn(model).backward()
        if after_backward is not None:
            after_backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    background = (time.process_time() - cpu0) - (time.thread_time() - thread0)
    return statistics.median(times), max(background, 0.0) / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--models", default="gpt,mlp")
    args = ap.parse_args()
    torch.set_flush_denormal(True)  # decayed Adam state turns denormal and slows every variant alike
    torch.manual_seed(0)

    with tempfile.TemporaryDirectory() as tmp:
        server, url = start_server(Path(tmp))
        try:
            rows = [bench(name, url, args.rounds, args.steps) for name in args.models.split(",")]
        finally:
            server.send_signal(signal.SIGINT)
            server.wait(timeout=10)
    print()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} cores; "
          f"{args.rounds} interleaved rounds x {args.steps} steps; paired median overhead vs baseline")
    print("| model | baseline step | naive `.item()` | gradwatch every=1 | gradwatch, background CPU charged | floor |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['baseline'] * 1e3:.1f} ms | {r['naive']:+.1%} | {r['gradwatch']:+.1%} "
              f"| {r['gradwatch_charged']:+.1%} | {r['floor']:+.1%} |")


def bench(name: str, url: str, rounds: int, steps: int) -> dict[str, float]:
    model, loss_fn = {"gpt": gpt_task, "mlp": mlp_task}[name]()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    params = list(model.parameters())
    time_steps(model, opt, loss_fn, 3)  # warm up: allocate Adam state

    def naive() -> None:
        for p in params:
            torch.linalg.vector_norm(p.grad).item()

    def floor() -> None:  # one multi-threaded pass over what the hook reads
        for p in params:
            st = opt.state[p]
            for t in (p.grad, p, st["exp_avg"], st["exp_avg_sq"]):
                t.sum()

    def with_hook() -> tuple[float, float]:
        w = gradwatch.watch(opt, model=model, run=f"bench-{name}", project="bench", server=url)
        try:
            return time_steps(model, opt, loss_fn, steps)
        finally:
            w.close(timeout=30)

    variants: dict[str, Callable[[], tuple[float, float]]] = {
        "baseline": lambda: time_steps(model, opt, loss_fn, steps),
        "naive": lambda: time_steps(model, opt, loss_fn, steps, naive),
        "gradwatch": with_hook,
        "floor": lambda: time_steps(model, opt, loss_fn, steps, floor),
    }
    ratios: dict[str, list[float]] = {k: [] for k in ("naive", "gradwatch", "gradwatch_charged", "floor")}
    base_times = []
    for r in range(rounds):
        order = list(variants)
        random.Random(r).shuffle(order)
        got = {k: variants[k]() for k in order}
        base, base_bg = got["baseline"]
        base_times.append(base)
        for k in ("naive", "gradwatch", "floor"):
            ratios[k].append(got[k][0] / base - 1)
        hook_time, hook_bg = got["gradwatch"]
        # torch's own intra-op threads show up as "background" in every variant: charge the excess
        ratios["gradwatch_charged"].append((hook_time + max(hook_bg - base_bg, 0.0)) / base - 1)
        print(f"{name} round {r + 1}/{rounds}: baseline {base * 1e3:.1f} ms, "
              + ", ".join(f"{k} {ratios[k][-1]:+.1%}" for k in ratios), flush=True)
    return {"model": name, "baseline": statistics.median(base_times),
            **{k: statistics.median(v) for k, v in ratios.items()}}


if __name__ == "__main__":
    main()

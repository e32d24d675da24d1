"""A plausible training run built by hand as wire protocol v1 messages (docs/protocol.md).

The browser tests feed a real server through a real websocket with these messages, built with
numpy and base64 independently of the `gradwatch` hook, so the dashboard is checked against the
documented protocol. The run looks like a small transformer trained with AdamW: gradient norms
that shrink with noise, a parameter that never gets a gradient, one whose buffer is zero-filled,
a warmup-then-cosine learning rate, memory figures, and NaN/Inf where `nan_steps` says.

    python tests/support/synthetic.py ws://127.0.0.1:8765   # seed a running server by hand
"""

from __future__ import annotations

import base64
import json
import math
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from websockets.sync.client import ClientConnection, connect

ABSENT_BITS = 0x7FDEAD00
NONE, ZERO, NONZERO, NONFINITE = 0, 1, 2, 3


def _shapes(width: int = 128, vocab: int = 512, blocks: int = 2) -> list[tuple[str, list[int]]]:
    out: list[tuple[str, list[int]]] = [("tok_emb.weight", [vocab, width]), ("pos_emb.weight", [64, width])]
    for b in range(blocks):
        p = f"blocks.{b}."
        out += [
            (p + "ln1.weight", [width]),
            (p + "attn.qkv.weight", [3 * width, width]),
            (p + "attn.qkv.bias", [3 * width]),
            (p + "attn.proj.weight", [width, width]),
            (p + "ln2.weight", [width]),
            (p + "mlp.fc1.weight", [4 * width, width]),
            (p + "mlp.fc2.weight", [width, 4 * width]),
        ]
    out += [("ln_f.weight", [width]), ("head.weight", [vocab, width]), ("adapter.weight", [width, width])]
    return out


def b64(array: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(array).tobytes()).decode("ascii")


def f32_with_absent(values: Sequence[float | None]) -> np.ndarray:
    """float32 array; None becomes the ABSENT NaN (bit pattern 0x7FDEAD00)."""
    arr = np.array([0.0 if v is None else v for v in values], dtype="<f4")
    bits = arr.view("<u4")
    for i, v in enumerate(values):
        if v is None:
            bits[i] = ABSENT_BITS
    return arr


def wire_scalar(v: float) -> float | str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "Infinity" if v > 0 else "-Infinity"
    return v


@dataclass
class SyntheticRun:
    """One run: its hello, and its steps computed on demand (deterministic for a seed)."""

    run_id: str
    name: str
    project: str = "gpt-small"
    nan_steps: Iterable[int] = ()
    seed: int = 0
    started_at: float = field(default_factory=lambda: time.time() - 60.0)
    total_steps: int = 400
    params: list[tuple[str, list[int]]] = field(default_factory=_shapes)

    def __post_init__(self) -> None:
        self.nan_steps = set(self.nan_steps)
        rng = np.random.default_rng(self.seed)
        n = len(self.params)
        self.scale = rng.uniform(0.3, 2.5, n)  # each parameter's gradient size
        self.phase = rng.uniform(0, 2 * math.pi, n)
        self.noise = rng.standard_normal((self.total_steps + 200, n)) * 0.12
        self.loss_noise = rng.standard_normal(self.total_steps + 200) * 0.03
        self.index = {name: i for i, (name, _) in enumerate(self.params)}
        self.numel = [int(np.prod(s)) for _, s in self.params]
        self.m = np.zeros(n)
        self.v = np.zeros(n)

    def hello(self) -> dict[str, Any]:
        return {
            "v": 1,
            "type": "hello",
            "run": {
                "id": self.run_id,
                "name": self.name,
                "project": self.project,
                "started_at": self.started_at,
                "hook_version": "0.1.0",
                "optimizer": "AdamW",
                "config": {"every": 1},
            },
            "params": [
                {
                    "name": name,
                    "shape": shape,
                    "numel": self.numel[i],
                    "dtype": "float32",
                    "group": 1 if name.endswith((".bias", "ln1.weight", "ln2.weight", "ln_f.weight")) else 0,
                    "optimizer": 0,
                }
                for i, (name, shape) in enumerate(self.params)
            ],
            "groups": [
                {"optimizer": 0, "index": 0, "name": None, "hparams": {"lr": 3e-4, "weight_decay": 0.1}},
                {"optimizer": 0, "index": 1, "name": "no_decay", "hparams": {"lr": 3e-4, "weight_decay": 0.0}},
            ],
        }

    def lr(self, step: int) -> float:
        warmup = 40
        if step <= warmup:
            return 3e-4 * step / warmup
        t = (step - warmup) / max(1, self.total_steps - warmup)
        return 3e-5 + 0.5 * (3e-4 - 3e-5) * (1 + math.cos(math.pi * min(1.0, t)))

    def step(self, seq: int, step: int) -> dict[str, Any]:
        n = len(self.params)
        decay = 0.35 + 0.65 * math.exp(-step / 150)
        grad: list[float | None] = []
        status: list[int] = []
        for i, (name, _) in enumerate(self.params):
            if name == "adapter.weight":  # in the optimizer, never gets a gradient
                grad.append(None)
                status.append(NONE)
                continue
            if name == "pos_emb.weight":  # frozen, buffer kept zero-filled
                grad.append(0.0)
                status.append(ZERO)
                continue
            g = self.scale[i] * decay * (1 + 0.3 * math.sin(step / 9 + self.phase[i])) * math.exp(self.noise[step, i])
            if step == int(self.total_steps * 0.55) and "mlp" in name:
                g *= 6.0  # a spike
            if step in self.nan_steps and name == "blocks.1.attn.qkv.bias":
                g = math.nan
            if step in self.nan_steps and name == "blocks.1.mlp.fc1.weight":
                g = math.inf
            grad.append(g)
            status.append(NONFINITE if not math.isfinite(g) else NONZERO)
        finite = [g for g in grad if g is not None and math.isfinite(g)]
        total = math.sqrt(sum(g * g for g in finite))
        if any(g is not None and not math.isfinite(g) for g in grad):
            total = math.nan
        lr = self.lr(step)
        exp_avg: list[float | None] = []
        exp_avg_sq: list[float | None] = []
        ratio: list[float | None] = []
        for i, g in enumerate(grad):
            if g is None:
                exp_avg.append(None)
                exp_avg_sq.append(None)
                ratio.append(None)
                continue
            gv = g if math.isfinite(g) else self.m[i]
            self.m[i] = 0.9 * self.m[i] + 0.1 * gv
            self.v[i] = 0.999 * self.v[i] + 0.001 * gv * gv / max(1, self.numel[i]) ** 0.5
            exp_avg.append(float(self.m[i]) if math.isfinite(g) else g)
            exp_avg_sq.append(float(self.v[i]))
            ratio.append(lr * 4.0 * (1 + 0.2 * math.sin(step / 17 + i)) if g != 0 else 0.0)
        param_norm = [8.0 + 0.002 * step * (1 + i % 3) for i in range(n)]
        numel = sum(self.numel)
        loss = 4.2 * math.exp(-step / 120) + 1.35 + float(self.loss_noise[step]) * decay
        if step in self.nan_steps:
            loss = math.nan
        scalars = {
            "loss": wire_scalar(loss),
            "grad_norm_total": wire_scalar(total),
            "lr/0": lr,
            "lr/1": lr,
            "mem/params_bytes": 4 * numel,
            "mem/grads_bytes": 4 * (numel - self.numel[-1]),
            "mem/optimizer_bytes": 8 * numel,
            "mem/zero_grad_bytes": 4 * self.numel[1],
            "mem/cuda:0/allocated": 4 * numel * 4 + 2.0e7 + 3e5 * math.sin(step / 5),
            "mem/cuda:0/reserved": 6.4e7,
            "mem/cuda:0/peak": 5.2e7 + 1e4 * min(step, 100),
        }
        return {
            "v": 1,
            "type": "step",
            "seq": seq,
            "step": step,
            "time": self.started_at + step * 0.1,
            "scalars": scalars,
            "params": {
                "grad_norm": b64(f32_with_absent(grad)),
                "param_norm": b64(f32_with_absent(param_norm)),
                "exp_avg_norm": b64(f32_with_absent(exp_avg)),
                "exp_avg_sq_norm": b64(f32_with_absent(exp_avg_sq)),
                "update_ratio": b64(f32_with_absent(ratio)),
            },
            "grad_status": b64(np.array(status, dtype="u1")),
        }


class Ingest:
    """A hook speaking protocol v1 by hand over /ws/ingest; a context manager."""

    def __init__(self, ws_url: str, run: SyntheticRun) -> None:
        self.run = run
        self._connection = connect(f"{ws_url}/ws/ingest", open_timeout=10, close_timeout=5, max_size=None)
        self.ws: ClientConnection = self._connection.__enter__()
        self.seq = 0
        self.last_step = 0
        welcome = self._call(run.hello())
        assert welcome.get("type") == "welcome", welcome

    def __enter__(self) -> Ingest:
        return self

    def __exit__(self, *exc: object) -> None:
        self._connection.__exit__(None, None, None)

    def _send(self, message: dict[str, Any]) -> None:
        self.ws.send(json.dumps(message, allow_nan=False))

    def _call(self, message: dict[str, Any]) -> dict[str, Any]:
        self._send(message)
        return json.loads(self.ws.recv(10))

    def steps(self, count: int) -> None:
        """Send the next `count` steps and wait until the server has committed them all."""
        for _ in range(count):
            self.seq += 1
            self.last_step += 1
            self._send(self.run.step(self.seq, self.last_step))
        self._wait_ack(self.seq)

    def close(self, status: str = "finished") -> None:
        self.seq += 1
        self._send({"v": 1, "type": "close", "seq": self.seq, "status": status})
        self._wait_ack(self.seq)

    def _wait_ack(self, seq: int) -> None:
        while True:
            msg = json.loads(self.ws.recv(30))
            if msg.get("type") == "error":
                raise AssertionError(f"server refused a message: {msg}")
            if msg.get("type") == "ack" and msg["seq"] >= seq:
                return


if __name__ == "__main__":
    url = sys.argv[1] if len(sys.argv) > 1 else "ws://127.0.0.1:8765"
    spec = SyntheticRun("demo-gpt-small", "lr3e-4-cosine", nan_steps={221, 222}, total_steps=400)
    with Ingest(url, spec) as hook:
        hook.steps(400)
        hook.close()
    print(f"seeded run {spec.run_id} with 400 steps on {url}")

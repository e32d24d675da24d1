"""A small character-level transformer trained on CPU, streaming to gradwatch.

    python examples/train_transformer.py --server http://127.0.0.1:8765 --steps 300

The text is generated here (no downloads), so the example runs anywhere.
"""

from __future__ import annotations

import argparse
import math
import random
import time

import torch
from torch import nn

import gradwatch


def corpus(n_chars: int, seed: int = 0) -> str:
    """Sentences from a tiny grammar: enough structure for the loss to fall visibly."""
    rng = random.Random(seed)
    subjects = ["the cat", "a dog", "my optimizer", "the gradient", "adam", "the model"]
    verbs = ["sees", "chases", "updates", "scales", "clips", "remembers"]
    objects = ["the mouse", "a ball", "its state", "the loss", "every step", "the norm"]
    out = []
    while sum(map(len, out)) < n_chars:
        out.append(f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)}. ")
    return "".join(out)


class TinyGPT(nn.Module):
    def __init__(self, vocab: int, dim: int = 64, layers: int = 2, heads: int = 4, context: int = 64) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(context, dim)
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(context), persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        x = self.blocks(x, mask=self.mask[:t, :t], is_causal=True)
        return self.head(self.norm(x))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--server", default=None, help="gradwatch server URL (default: $GRADWATCH_SERVER or http://127.0.0.1:8765)"
    )
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--run", default="tiny-gpt")
    ap.add_argument("--project", default="demo")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--delay", type=float, default=0.0, help="seconds to sleep per step, to watch it live")
    args = ap.parse_args()

    torch.manual_seed(0)
    text = corpus(200_000)
    chars = sorted(set(text))
    data = torch.tensor([chars.index(c) for c in text])
    model = TinyGPT(len(chars))
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": 0.1, "name": "decay"},
            {"params": no_decay, "weight_decay": 0.0, "name": "no_decay"},
        ],
        lr=args.lr,
    )
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 50) * 0.5 * (1 + math.cos(math.pi * s / args.steps))
    )

    config = {"steps": args.steps, "lr": args.lr, "schedule": "warmup 50, cosine", "vocab": len(chars)}
    with gradwatch.watch(opt, model=model, run=args.run, project=args.project, server=args.server, config=config) as w:
        print(f"gradwatch run id: {w.run_id}", flush=True)
        for step in range(args.steps):
            ix = torch.randint(len(data) - 65, (16,))
            batch = torch.stack([data[i : i + 65] for i in ix])
            logits = model(batch[:, :-1])
            loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            w.log(loss=loss)
            opt.step()
            sched.step()
            if step % 50 == 0 or step == args.steps - 1:
                print(f"step {step + 1:4d}  loss {loss.item():.3f}", flush=True)
            if args.delay:
                time.sleep(args.delay)
        print(f"done; waiting for the server to acknowledge {w.pending} messages", flush=True)


if __name__ == "__main__":
    main()

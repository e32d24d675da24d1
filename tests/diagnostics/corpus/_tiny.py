"""What the instability scripts of the corpus share (not a script: test_corpus.py skips `_*.py`):
a tiny GPT, the token stream it learns, and (from _sampling.py) the sampling setting the test asks for.

The stream comes from a fixed random Markov chain over `VOCAB` tokens in which each token has a
few likely successors, so a small model learns it within a few hundred steps on a CPU and its
loss keeps the noise of a real language-model loss (a few bits per token, batch to batch).
"""

from __future__ import annotations

import math

import torch
from _sampling import every  # noqa: F401  (the instability scripts import it from here)

VOCAB, CONTEXT, WIDTH, HEADS, LAYERS = 32, 16, 32, 2, 2

torch.set_num_threads(1)


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln_1 = torch.nn.LayerNorm(WIDTH)
        self.attn = torch.nn.MultiheadAttention(WIDTH, HEADS, batch_first=True)
        self.ln_2 = torch.nn.LayerNorm(WIDTH)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(WIDTH, 4 * WIDTH), torch.nn.GELU(), torch.nn.Linear(4 * WIDTH, WIDTH)
        )
        self.register_buffer("mask", torch.triu(torch.ones(CONTEXT, CONTEXT, dtype=torch.bool), 1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln_1(x)
        n = x.shape[1]
        x = x + self.attn(h, h, h, attn_mask=self.mask[:n, :n], need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))


class TinyGPT(torch.nn.Module):
    """A decoder-only transformer: token and position embeddings, `LAYERS` pre-norm blocks, a head."""

    def __init__(self) -> None:
        super().__init__()
        self.wte = torch.nn.Embedding(VOCAB, WIDTH)
        self.wpe = torch.nn.Embedding(CONTEXT, WIDTH)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f = torch.nn.LayerNorm(WIDTH)
        self.head = torch.nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


class Stream:
    """Batches of (input, target) token sequences from a fixed random Markov chain."""

    def __init__(self, seed: int, branching: int = 3) -> None:
        self.gen = torch.Generator().manual_seed(seed)
        logits = torch.full((VOCAB, VOCAB), -math.inf)
        for t in range(VOCAB):
            nxt = torch.randperm(VOCAB, generator=self.gen)[:branching]
            logits[t, nxt] = torch.randn(branching, generator=self.gen)
        self.probs = torch.softmax(logits, 1)

    def batch(self, size: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
        seq = torch.empty(size, CONTEXT + 1, dtype=torch.long)
        seq[:, 0] = torch.randint(0, VOCAB, (size,), generator=self.gen)
        for i in range(CONTEXT):
            seq[:, i + 1] = torch.multinomial(self.probs[seq[:, i]], 1, generator=self.gen)[:, 0]
        return seq[:, :-1], seq[:, 1:]


def lm_loss(model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(model(inputs).reshape(-1, VOCAB), targets.reshape(-1))

"""A tiny GPT-2 trained by the Hugging Face Trainer, knowing nothing of gradwatch (run by
test_launch.py under `gradwatch-run`). Its own callback writes the oracle to `--oracle FILE`
(JSON lines): per step, the gradients as the optimizer uses them (after clipping), the parameters
and AdamW's state after the step, named as `model.named_parameters()` names them."""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments


class Oracle(TrainerCallback):
    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.records: list[dict[str, Any]] = []
        self.grads: dict[str, float] = {}

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.grads = {n: torch.linalg.vector_norm(p.grad).item() for n, p in self.model.named_parameters()}

    def on_optimizer_step(self, args: Any, state: Any, control: Any, optimizer: Any = None, **kwargs: Any) -> None:
        inner = optimizer.optimizer if hasattr(optimizer, "optimizer") else optimizer
        record: dict[str, Any] = {"step": len(self.records) + 1, "grad_norm": self.grads, "param_norm": {}}
        for n, p in self.model.named_parameters():
            record["param_norm"][n] = torch.linalg.vector_norm(p).item()
            for key in ("exp_avg", "exp_avg_sq"):
                record.setdefault(f"{key}_norm", {})[n] = torch.linalg.vector_norm(inner.state[p][key]).item()
        self.records.append(record)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--oracle", type=Path, required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, n_positions=8, vocab_size=16))
    g = torch.Generator().manual_seed(0)
    ids = (torch.randint(0, 16, (64, 1), generator=g) + torch.arange(8)) % 16
    data = [{"input_ids": row, "labels": row} for row in ids]
    oracle = Oracle(model)
    with tempfile.TemporaryDirectory() as tmp:
        training = TrainingArguments(
            output_dir=tmp,
            max_steps=args.steps,
            per_device_train_batch_size=8,
            max_grad_norm=1.0,
            learning_rate=3e-3,
            report_to=[],
            use_cpu=True,
            save_strategy="no",
            disable_tqdm=True,
        )
        Trainer(model=model, args=training, train_dataset=data, callbacks=[oracle]).train()
    args.oracle.write_text("".join(json.dumps(r) + "\n" for r in oracle.records))


if __name__ == "__main__":
    main()

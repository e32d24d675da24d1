"""A tiny GPT-2 trained by the Hugging Face Trainer on CPU, watched by gradwatch in one line.

    pip install gradwatch[transformers]
    gradwatch serve &
    python examples/hf_trainer.py --server http://127.0.0.1:8765

The model is built from a config and the data is made here: nothing is downloaded.
"""

from __future__ import annotations

import argparse
import tempfile

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from gradwatch.integrations.transformers import GradwatchCallback


def counting_data(n: int, length: int = 16, vocab: int = 32) -> list[dict[str, torch.Tensor]]:
    """Sequences that count up from a random start: easy enough for the loss to fall in seconds."""
    g = torch.Generator().manual_seed(0)
    starts = torch.randint(0, vocab, (n, 1), generator=g)
    ids = (starts + torch.arange(length)) % vocab
    return [{"input_ids": row, "labels": row} for row in ids]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--server", default=None, help="gradwatch server URL (default: $GRADWATCH_SERVER or http://127.0.0.1:8765)"
    )
    ap.add_argument("--project", default="demo")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--output-dir", default=None, help="the Trainer's output folder (default: a temporary one)")
    args = ap.parse_args()

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=16, vocab_size=32))
    with tempfile.TemporaryDirectory() as tmp:
        training = TrainingArguments(
            output_dir=args.output_dir or tmp,
            run_name="hf-tiny-gpt2",
            max_steps=args.steps,
            per_device_train_batch_size=8,
            gradient_accumulation_steps=2,
            max_grad_norm=1.0,
            learning_rate=3e-3,
            logging_steps=5,
            report_to=[],
            use_cpu=True,
            save_strategy="no",
            disable_tqdm=True,
        )
        watching = GradwatchCallback(project=args.project, server=args.server)  # the one line gradwatch needs
        Trainer(model=model, args=training, train_dataset=counting_data(512), callbacks=[watching]).train()
    assert watching.watcher is not None
    print(f"gradwatch run id: {watching.watcher.run_id}", flush=True)


if __name__ == "__main__":
    main()

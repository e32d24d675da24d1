"""A tiny GPT-2 trained by the Hugging Face Trainer with DDP on 2 CPU processes, watched by
GradwatchCallback on every rank. Run by test_torchrun.py as
`torchrun --nproc-per-node 2 hf_ddp.py OUT STEPS`; each rank prints its run id and stream id."""

from __future__ import annotations

import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from gradwatch.integrations.transformers import GradwatchCallback


def main(out: str, steps: int) -> None:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, n_positions=8, vocab_size=16))
    g = torch.Generator().manual_seed(0)
    ids = (torch.randint(0, 16, (64, 1), generator=g) + torch.arange(8)) % 16
    args = TrainingArguments(
        output_dir=out,
        run_name="hf-ddp",
        max_steps=steps,
        per_device_train_batch_size=4,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
        logging_steps=1,
    )
    watching = GradwatchCallback(project="torchrun", server="http://127.0.0.1:9", warn=False)
    trainer = Trainer(
        model=model, args=args, train_dataset=[{"input_ids": r, "labels": r} for r in ids], callbacks=[watching]
    )
    trainer.train()
    w = watching.watcher
    assert w is not None and w.dist is not None
    assert type(trainer.model_wrapped).__name__ == "DistributedDataParallel", type(trainer.model_wrapped)
    print(f"rank {args.process_index}: run {w.run_id} stream {w.dist.stream_id}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))

"""A tiny GPT-2 trained by the Hugging Face Trainer with DDP on 2 CPU processes, watched by
GradwatchCallback on every rank. Run by test_torchrun.py as
`torchrun --nproc-per-node 2 hf_ddp.py OUT STEPS`; each rank writes its run id and stream id to OUT/ids.rankR."""

from __future__ import annotations

import sys
from pathlib import Path

from transformers import Trainer

from gradwatch.integrations.transformers import GradwatchCallback

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from hf_training import tiny_gpt2, token_dataset, trainer_args  # noqa: E402


def main(out: str, steps: int) -> None:
    args = trainer_args(Path(out))
    args.run_name, args.max_steps = "hf-ddp", steps
    watching = GradwatchCallback(project="torchrun", server="http://127.0.0.1:9", warn=False)
    trainer = Trainer(model=tiny_gpt2(), args=args, train_dataset=token_dataset(), callbacks=[watching])
    trainer.train()
    w = watching.watcher
    assert w is not None and w.dist is not None
    assert type(trainer.model_wrapped).__name__ == "DistributedDataParallel", type(trainer.model_wrapped)
    # a file per rank: the ranks share torchrun's stdout, where their lines can interleave
    Path(out).mkdir(parents=True, exist_ok=True)
    Path(out, f"ids.rank{args.process_index}").write_text(f"{w.run_id} {w.dist.stream_id}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))

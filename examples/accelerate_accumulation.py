"""Gradient accumulation with Hugging Face accelerate, streaming to gradwatch (CPU, seconds).
(Not named accelerate.py: in this folder that name would shadow the package for every example.)

    python examples/accelerate_accumulation.py --server http://127.0.0.1:8765 --accumulate 4

`watch()` takes the optimizer `accelerator.prepare()` returns: it hooks the torch optimizer inside,
which steps once per `--accumulate` micro-batches (when gradients are synchronised), so each
stored step is one real optimizer step and the run reports intentional accumulation.
"""

from __future__ import annotations

import argparse

import torch
from accelerate import Accelerator
from torch import nn

import gradwatch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--server", default=None, help="gradwatch server URL (default: $GRADWATCH_SERVER or http://127.0.0.1:8765)"
    )
    ap.add_argument("--batches", type=int, default=160, help="micro-batches in all")
    ap.add_argument("--accumulate", type=int, default=4, help="micro-batches per optimizer step")
    ap.add_argument("--cpu", action="store_true", help="train on the CPU even where a GPU is")
    ap.add_argument("--run", default="accelerate-accumulation")
    ap.add_argument("--project", default="examples")
    args = ap.parse_args()

    accelerator = Accelerator(gradient_accumulation_steps=args.accumulate, cpu=args.cpu)
    torch.manual_seed(0)
    x = torch.randn(args.batches * 16, 20)
    y = (x[:, :5].sum(dim=1) > 0).long()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    with gradwatch.watch(optimizer, model=model, run=args.run, project=args.project, server=args.server) as w:
        print(f"gradwatch run id: {w.run_id}", flush=True)
        for xb, yb in loader:
            with accelerator.accumulate(model):
                loss = nn.functional.cross_entropy(model(xb), yb)
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad()
            w.log(loss=loss.detach())
            if accelerator.sync_gradients and w.step % 10 == 0:
                print(f"step {w.step:4d}  loss {loss.item():.4f}", flush=True)
        print(
            f"done: {w.step} optimizer steps of {args.accumulate} micro-batches; waiting for the server to "
            f"acknowledge {w.pending} messages",
            flush=True,
        )


if __name__ == "__main__":
    main()

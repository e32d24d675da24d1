"""A small regression trained by the Lightning Trainer on CPU, watched by gradwatch in one line.

    pip install gradwatch[lightning]
    gradwatch serve &
    python examples/lightning_trainer.py --server http://127.0.0.1:8765

Automatic optimization with gradient accumulation and clipping; the data is made here.
"""

from __future__ import annotations

import argparse
from typing import Any

import lightning.pytorch as L
import torch
from torch import nn

from gradwatch.integrations.lightning import GradwatchCallback


class Regressor(L.LightningModule):
    def __init__(self, lr: float = 1e-2, hidden: int = 64) -> None:
        super().__init__()
        self.save_hyperparameters()  # recorded with the gradwatch run
        self.net = nn.Sequential(
            nn.Linear(16, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU(), nn.Linear(hidden, 1)
        )

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)  # recorded with the optimizer step it belongs to
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)


def data(n: int = 2048) -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 16, generator=g)
    y = torch.sin(x[:, :1]) + 0.5 * x[:, 1:2] * x[:, 2:3]
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32, shuffle=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--server", default=None, help="gradwatch server URL (default: $GRADWATCH_SERVER or http://127.0.0.1:8765)"
    )
    ap.add_argument("--project", default="demo")
    ap.add_argument("--steps", type=int, default=100)
    args = ap.parse_args()

    torch.manual_seed(0)
    watching = GradwatchCallback(project=args.project, run="lightning-regressor", server=args.server)
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=args.steps,
        accumulate_grad_batches=2,
        gradient_clip_val=1.0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[watching],
    )  # the one line gradwatch needs
    trainer.fit(Regressor(), train_dataloaders=data())
    assert watching.watcher is not None
    print(f"gradwatch run id: {watching.watcher.run_id}", flush=True)


if __name__ == "__main__":
    main()

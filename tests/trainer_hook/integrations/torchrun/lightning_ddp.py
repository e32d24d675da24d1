"""A tiny Lightning regression fitted by DDP on 2 CPU processes, watched by GradwatchCallback on
every rank. Run by test_torchrun.py as `torchrun --nproc-per-node 2 lightning_ddp.py OUT STEPS`;
each rank writes its run id and stream id to OUT/ids.rankR."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as L
import torch
from lightning.pytorch.loggers import CSVLogger
from torch import nn

from gradwatch.integrations.lightning import GradwatchCallback


class Regressor(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=0.01)


def main(out: str, steps: int) -> None:
    torch.manual_seed(0)
    x = torch.randn(64, 8)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)
    watching = GradwatchCallback(project="torchrun", server="http://127.0.0.1:9", warn=False)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_steps=steps,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=1,
        logger=CSVLogger(out, name="tiny"),
        callbacks=[watching],
    )
    trainer.fit(Regressor(), train_dataloaders=data)
    w = watching.watcher
    assert w is not None and w.dist is not None
    # a file per rank: the ranks share torchrun's stdout, where their lines can interleave
    Path(out).mkdir(parents=True, exist_ok=True)
    Path(out, f"ids.rank{trainer.global_rank}").write_text(f"{w.run_id} {w.dist.stream_id}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))

"""Lightning's manual optimization steps with `optimizer.step(closure=do_nothing_closure)` (its
`LightningOptimizer.step()` without a closure, wrapped by the precision plugin): the backward passes
ran before the step, so gradwatch treats it as a plain step: no `closure_calls` scalar, one pass per
step, and gradient norms equal to those an independent step pre-hook takes with torch's own
`vector_norm`. The real Lightning package, `watch()` called from the module (not the integration)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

L = pytest.importorskip("lightning.pytorch", reason="needs Lightning (pip install gradwatch[lightning])")

import gradwatch  # noqa: E402
from support.sent import sent_steps  # noqa: E402

pytestmark = pytest.mark.unit

NOWHERE = "http://127.0.0.1:9"
STEPS = 4


class Manual(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
        self.oracle: list[dict[str, float]] = []
        self.watcher: Any = None
        self.sent: list[dict[str, Any]] = []

    def on_train_start(self) -> None:
        opt = self.optimizers()
        opt.optimizer.register_step_pre_hook(
            lambda o, a, k: self.oracle.append(
                {n: float(torch.linalg.vector_norm(p.grad)) for n, p in self.net.named_parameters()}
            )
        )
        self.watcher = gradwatch.watch(opt, model=self.net, server=NOWHERE, warn=False)

    def training_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward(nn.functional.mse_loss(self.net(x), y))
        opt.step()

    def on_train_end(self) -> None:
        self.sent = sent_steps(self.watcher)
        self.watcher.close(timeout=0.1)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def test_a_manual_step_is_a_plain_step(tmp_path: Path) -> None:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=g)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)
    module = Manual()
    L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=STEPS,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    ).fit(module, train_dataloaders=data)
    msgs = module.sent
    assert [m["step"] for m in msgs] == list(range(1, STEPS + 1))
    assert len(module.oracle) == STEPS
    for m, want in zip(msgs, module.oracle, strict=True):
        assert "closure_calls" not in m["scalars"], m["step"]
        assert m["scalars"]["backward_passes"] == 1.0
        for name, value in want.items():
            assert m["params"]["grad_norm"][name] == pytest.approx(value, rel=1e-5), (m["step"], name)


def test_does_nothing_knows_lightnings_closure_by_identity_and_by_name() -> None:
    from functools import partial

    from lightning.pytorch.core.optimizer import do_nothing_closure

    from gradwatch.closures import does_nothing

    assert does_nothing(do_nothing_closure)
    assert does_nothing(partial(lambda model, opt, closure: closure(), None, None, do_nothing_closure))

    def do_nothing_closure_elsewhere() -> None:
        return None

    do_nothing_closure_elsewhere.__module__ = "pytorch_lightning.core.optimizer"
    do_nothing_closure_elsewhere.__qualname__ = "do_nothing_closure"
    assert does_nothing(do_nothing_closure_elsewhere)  # pytorch_lightning, not imported here
    assert not does_nothing(lambda: None)  # a user's closure, even an empty one, is the user's
    assert not does_nothing(partial(print, "x"))

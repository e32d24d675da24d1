"""gradwatch.integrations.lightning: a real Lightning `Trainer` (automatic optimization with
accumulation and clipping; a GAN with manual optimization and two optimizers) streaming to a
real server, against oracles taken where the step's gradients are final."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from torch import nn

L = pytest.importorskip("lightning.pytorch", reason="needs Lightning (pip install gradwatch[lightning])")

from lightning.pytorch.loggers import CSVLogger  # noqa: E402
from stored import (  # noqa: E402
    Norms,
    accumulation,
    assert_equal_norms,
    assert_no_problem,
    grad_norms,
    listed_status,
    run_info,
    scalar_series,
    stored_norms,
)

from gradwatch.integrations.lightning import GradwatchCallback  # noqa: E402
from support.examples import findings  # noqa: E402

pytestmark = pytest.mark.unit  # a test that starts a server says so (@pytest.mark.server)

ACCUMULATE = 2
CLIP = 0.05  # far below the gradients' norm: every step is clipped
STEPS = 3


def batches(n: int, seed: int = 0) -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    y = x @ torch.randn(8, 1, generator=g) + 1.0
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4)


class Regressor(L.LightningModule):
    """Automatic optimization. The oracle is `configure_gradient_clipping`: Lightning calls it
    inside the step's closure after the backward passes (and after `on_before_optimizer_step`);
    here it clips as Lightning does by default and then reads the gradients, which are now the
    ones the optimizer step uses. A step pre-hook or `on_before_optimizer_step` would be too
    early: the first runs before the closure, the second before the clipping."""

    def __init__(self, lr: float = 0.1, hidden: int = 16) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(8, hidden), nn.Tanh(), nn.Linear(hidden, 1))
        self.oracle: Norms = {}
        self.oracle_steps = 0

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_gradient_clipping(
        self, optimizer: Any, gradient_clip_val: Any = None, gradient_clip_algorithm: Any = None
    ) -> None:
        super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)
        self.oracle_steps += 1
        self.oracle.update(grad_norms(dict(self.named_parameters()), self.oracle_steps))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)


def fit(module: Any, tmp_path: Path, callbacks: list[Any], **trainer_args: Any) -> Any:
    trainer_args.setdefault("max_steps", STEPS)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=1,
        logger=CSVLogger(str(tmp_path), name="tiny"),
        callbacks=callbacks,
        **trainer_args,
    )
    trainer.fit(module, train_dataloaders=batches(64))
    return trainer


@pytest.mark.server
def test_accumulation_and_clipping_values_equal_the_oracle(tmp_path: Path, sqlite_server) -> None:
    torch.manual_seed(0)
    module, watching = Regressor(), GradwatchCallback(project="pl", server=sqlite_server.url, warn=False)
    trainer = fit(module, tmp_path, [watching], accumulate_grad_batches=ACCUMULATE, gradient_clip_val=CLIP)
    w = watching.watcher
    assert w is not None and w.pending == 0, "closed at fit end with everything delivered"
    assert trainer.global_step == STEPS == module.oracle_steps
    run = run_info(sqlite_server.url, w.run_id)
    assert (run["name"], run["project"], run["status"], run["steps"]) == ("tiny/version_0", "pl", "finished", STEPS)
    total = sum(v * v for (s, _), v in module.oracle.items() if s == 1) ** 0.5
    assert total == pytest.approx(CLIP, rel=1e-4)  # the oracle saw the clipped gradients
    assert_equal_norms(stored_norms(sqlite_server.url, w.run_id), module.oracle)
    found = findings(sqlite_server, w.run_id)
    assert_no_problem(found)
    assert accumulation(found) == ACCUMULATE


@pytest.mark.server
def test_hparams_settings_and_logged_scalars_are_recorded(tmp_path: Path, sqlite_server) -> None:
    torch.manual_seed(0)
    losses: dict[int, float] = {}

    class Logged(Regressor):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            loss = super().training_step(batch, batch_idx)
            losses[self.trainer.global_step + 1] = float(loss)  # the last micro-batch's value wins
            return loss

    watching = GradwatchCallback(project="pl", run="mine", server=sqlite_server.url, warn=False)
    fit(Logged(lr=0.05, hidden=12), tmp_path, [watching], accumulate_grad_batches=ACCUMULATE, gradient_clip_val=CLIP)
    w = watching.watcher
    assert w is not None
    run = run_info(sqlite_server.url, w.run_id)
    assert run["name"] == "mine"
    user = run["config"]["user"]
    assert user["hparams"] == {"lr": 0.05, "hidden": 12}
    assert (user["accumulate_grad_batches"], user["gradient_clip_val"]) == (ACCUMULATE, CLIP)
    assert user["framework"] == "lightning"
    # self.log values are current at the optimizer step: stored with the step they belong to
    series = scalar_series(sqlite_server.url, w.run_id, "train_loss")
    assert series["step"] == list(range(1, STEPS + 1))
    assert series["value"] == pytest.approx([losses[s] for s in series["step"]], rel=1e-6)


@pytest.mark.server
def test_precision_plugin_scaler_is_found(tmp_path: Path, sqlite_server) -> None:
    """precision="16-mixed": the plugin's GradScaler scales the loss and unscales the gradients
    before clipping; stored norms equal the unscaled, clipped gradients the step uses. (Lightning
    runs 16-mixed on a GPU; the same plugin with a CPU GradScaler runs here.)"""
    from lightning.pytorch.plugins import MixedPrecision

    torch.manual_seed(0)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12)
    module, watching = Regressor(), GradwatchCallback(server=sqlite_server.url, warn=False)
    trainer = fit(
        module,
        tmp_path,
        [watching],
        accumulate_grad_batches=ACCUMULATE,
        gradient_clip_val=CLIP,
        plugins=[MixedPrecision("16-mixed", "cpu", scaler=scaler)],
    )
    w = watching.watcher
    assert w is not None and w.pending == 0 and trainer.precision_plugin.scaler is scaler
    run = run_info(sqlite_server.url, w.run_id)
    assert run["config"]["amp"] is True and run["config"]["user"]["precision"] == "16-mixed"
    assert_equal_norms(stored_norms(sqlite_server.url, w.run_id), module.oracle)
    assert_no_problem(findings(sqlite_server, w.run_id))


class GAN(L.LightningModule):
    """Manual optimization, two optimizers: D then G every batch. G's loss backpropagates through
    D and fills D's `.grad` after D's step; D's `zero_grad()` clears it before D's next backward.
    The oracle is `on_before_optimizer_step` of an independent callback: in manual optimization
    it runs inside `opt.step()`, after the user's backward passes, and nothing clips after it."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.g = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 8))
        self.d = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

    def training_step(self, batch: Any, batch_idx: int) -> None:
        real, _ = batch
        opt_d, opt_g = self.optimizers()
        bce = nn.functional.binary_cross_entropy_with_logits
        fake = self.g(torch.randn(real.shape[0], 4))
        d_loss = bce(self.d(real), torch.ones(real.shape[0], 1)) + bce(
            self.d(fake.detach()), torch.zeros(real.shape[0], 1)
        )
        opt_d.zero_grad()
        self.manual_backward(d_loss)
        opt_d.step()
        g_loss = bce(self.d(fake), torch.ones(real.shape[0], 1))
        opt_g.zero_grad()
        self.manual_backward(g_loss)  # fills D's .grad too, after D's step
        opt_g.step()
        self.log_dict({"d_loss": d_loss, "g_loss": g_loss})

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        return [torch.optim.Adam(self.d.parameters(), lr=1e-3), torch.optim.Adam(self.g.parameters(), lr=1e-3)]


class StepOracle(L.Callback):
    """Per optimizer, its k-th step's gradients: stored step k holds each optimizer's k-th step."""

    def __init__(self) -> None:
        self.norms: Norms = {}
        self.steps: dict[int, int] = {}

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        k = self.steps[id(optimizer)] = self.steps.get(id(optimizer), 0) + 1
        members = {id(p) for group in optimizer.param_groups for p in group["params"]}
        self.norms.update(grad_norms({n: p for n, p in pl_module.named_parameters() if id(p) in members}, k))


@pytest.mark.server
def test_gan_with_manual_optimization_makes_one_run(tmp_path: Path, sqlite_server) -> None:
    torch.manual_seed(0)
    oracle, watching = StepOracle(), GradwatchCallback(server=sqlite_server.url, warn=False)
    fit(GAN(), tmp_path, [oracle, watching], max_steps=2 * STEPS)  # Lightning counts D's and G's steps
    w = watching.watcher
    assert w is not None and w.pending == 0
    assert sorted(oracle.steps.values()) == [STEPS, STEPS]
    run = run_info(sqlite_server.url, w.run_id)
    assert run["config"]["optimizers"] == ["Adam", "Adam"] and run["steps"] == STEPS
    assert_equal_norms(stored_norms(sqlite_server.url, w.run_id), oracle.norms)
    assert_no_problem(findings(sqlite_server, w.run_id))


class ProgBarLogged(Regressor):
    """Logs its loss for the progress bar (and a second, forked value); its oracle is what it
    logged at each optimizer step (the last micro-batch's value wins)."""

    def __init__(self) -> None:
        super().__init__()
        self.logged: dict[int, float] = {}

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss, prog_bar=True)
        self.log("half", loss / 2, prog_bar=True, on_step=True, on_epoch=True)
        self.logged[self.trainer.global_step + 1] = float(loss)
        return loss


@pytest.mark.server
def test_prog_bar_values_are_forwarded_exactly_without_reading_them_on_the_training_thread(
    tmp_path: Path, sqlite_server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`trainer.callback_metrics` turns every `prog_bar=True` value into a number
    (`convert_tensors_to_scalars`, `.item()`): a device synchronisation per step on a GPU. The
    callback must do neither; Lightning's own batch-end bookkeeping does (which proves the
    counters count)."""
    from lightning.pytorch.trainer.connectors.logger_connector import result

    inside = [False]
    conversions: list[bool] = []  # one per call: was it made inside our callback?
    items: list[bool] = []
    convert, item = result.convert_tensors_to_scalars, torch.Tensor.item

    def counted_convert(value: Any) -> Any:
        conversions.append(inside[0])
        return convert(value)

    def counted_item(tensor: torch.Tensor) -> Any:
        items.append(inside[0])
        return item(tensor)

    class Probed(GradwatchCallback):  # type: ignore[misc, valid-type]
        def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
            inside[0] = True
            try:
                super().on_before_optimizer_step(trainer, pl_module, optimizer)
            finally:
                inside[0] = False

    torch.manual_seed(0)
    module, watching = ProgBarLogged(), Probed(server=sqlite_server.url, warn=False)
    monkeypatch.setattr(result, "convert_tensors_to_scalars", counted_convert)
    monkeypatch.setattr(torch.Tensor, "item", counted_item)
    fit(module, tmp_path, [watching], accumulate_grad_batches=ACCUMULATE)
    monkeypatch.undo()
    assert conversions and not any(conversions), "our callback made Lightning convert the progress-bar values"
    assert not any(items), "our callback read a tensor on the training thread"
    w = watching.watcher
    assert w is not None and w.pending == 0
    loss = scalar_series(sqlite_server.url, w.run_id, "loss")
    assert loss["step"] == list(range(1, STEPS + 1))
    assert loss["value"] == pytest.approx([module.logged[s] for s in loss["step"]], rel=1e-6)
    half = scalar_series(sqlite_server.url, w.run_id, "half")
    assert half["value"] == pytest.approx([module.logged[s] / 2 for s in half["step"]], rel=1e-6)


@pytest.mark.server
def test_unreadable_lightning_internals_forward_nothing_and_training_goes_on(
    tmp_path: Path, sqlite_server, caplog: pytest.LogCaptureFixture
) -> None:
    """Where Lightning's result collection is not what the callback reads (another version), the
    callback warns once, forwards nothing and the run is still watched to the end."""
    from gradwatch.integrations.lightning import step_logged_values

    class NoResults:
        @property
        def _results(self) -> Any:
            raise AttributeError("no _results in this version")

    with caplog.at_level("WARNING", logger="gradwatch"):
        assert step_logged_values(NoResults()) is None
        assert step_logged_values(object()) is None
    assert "cannot read the values logged" in caplog.text

    class Changed(GradwatchCallback):  # type: ignore[misc, valid-type]
        def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
            super().on_before_optimizer_step(NoResults(), pl_module, optimizer)

    torch.manual_seed(0)
    watching = Changed(server=sqlite_server.url, warn=False)
    caplog.clear()
    with caplog.at_level("WARNING", logger="gradwatch"):
        trainer = fit(ProgBarLogged(), tmp_path, [watching])
    assert caplog.text.count("cannot read the values logged") == 1, "warned once, then stopped trying"
    w = watching.watcher
    assert w is not None and trainer.global_step == STEPS
    run = run_info(sqlite_server.url, w.run_id)
    assert (run["status"], run["steps"]) == ("finished", STEPS)
    with httpx.Client(base_url=sqlite_server.url, timeout=30) as http:  # no such series
        assert http.get(f"/api/runs/{w.run_id}/series", params={"key": "loss"}).status_code == 404


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"every": 0}, ValueError),
        ({"run": "x" * 201}, ValueError),
        ({"project": 3}, TypeError),
        ({"server": "no-scheme"}, ValueError),
        ({"updates": 1}, TypeError),
        ({"on_finding": "print"}, TypeError),  # every option of watch() but model, scaler, config
        ({"projekt": "p"}, TypeError),  # a misspelt option
    ],
)
def test_bad_arguments_fail_when_the_callback_is_made(kwargs: dict[str, Any], error: type) -> None:
    with pytest.raises(error):
        GradwatchCallback(**kwargs)


@pytest.mark.server
def test_each_package_gets_a_callback_of_its_own_base(tmp_path: Path, sqlite_server) -> None:
    """`pytorch_lightning` (the older package) has its own Callback base: its Trainer gets a
    callback subclassing it, which measures the same values."""
    pl = pytest.importorskip("pytorch_lightning", reason="needs pytorch-lightning (the older package name)")
    from gradwatch.integrations import lightning as for_lightning
    from gradwatch.integrations import pytorch_lightning as for_pl

    assert issubclass(for_lightning.GradwatchCallback, L.Callback)
    assert not issubclass(for_lightning.GradwatchCallback, pl.Callback)
    assert issubclass(for_pl.GradwatchCallback, pl.Callback) and not issubclass(for_pl.GradwatchCallback, L.Callback)
    assert for_pl.GradwatchCallback is for_pl.GradwatchCallback  # built once
    with pytest.raises(ValueError, match="package must be one of"):
        for_lightning.callback_class("lightning.pytorch")

    class Module(pl.LightningModule):  # Regressor's oracle, on the older package's base
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(8, 1)
            self.oracle: Norms = {}

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return nn.functional.mse_loss(self.net(batch[0]), batch[1])

        def configure_gradient_clipping(
            self, optimizer: Any, gradient_clip_val: Any = None, gradient_clip_algorithm: Any = None
        ) -> None:
            super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)
            self.oracle.update(grad_norms(dict(self.named_parameters()), self.trainer.global_step + 1))

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    torch.manual_seed(0)
    module, watching = Module(), for_pl.GradwatchCallback(server=sqlite_server.url, warn=False)
    trainer = pl.Trainer(
        accelerator="cpu",
        max_steps=STEPS,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        gradient_clip_val=CLIP,
        callbacks=[watching],
    )
    trainer.fit(module, train_dataloaders=batches(32))
    w = watching.watcher
    assert w is not None and w.pending == 0
    run = run_info(sqlite_server.url, w.run_id)
    assert run["config"]["user"]["framework"] == "pytorch_lightning" and run["steps"] == STEPS
    assert_equal_norms(stored_norms(sqlite_server.url, w.run_id), module.oracle)


@pytest.mark.server
def test_an_exception_in_fit_closes_the_run_as_crashed(tmp_path: Path, sqlite_server) -> None:
    class Failing(Regressor):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            if batch_idx == 2:
                raise RuntimeError("the user's bug")
            return super().training_step(batch, batch_idx)

    torch.manual_seed(0)
    watching = GradwatchCallback(server=sqlite_server.url, warn=False)
    with pytest.raises(RuntimeError, match="the user's bug"):
        fit(Failing(), tmp_path, [watching], max_steps=5)
    w = watching.watcher
    assert w is not None and w.pending == 0, "closed at the exception, not left running"
    assert listed_status(sqlite_server.url, w.run_id) == "crashed"
    assert run_info(sqlite_server.url, w.run_id)["steps"] == 2

"""gradwatch for the Lightning `Trainer`, in one line:

    from gradwatch.integrations.lightning import GradwatchCallback
    Trainer(..., callbacks=[GradwatchCallback(project="p")])

`GradwatchCallback` here subclasses `lightning.pytorch.Callback`, or `pytorch_lightning.Callback`
where only the older package is installed; `gradwatch.integrations.pytorch_lightning` has the one
for `pytorch_lightning.Trainer` where both are. Each class is built on first use, so importing
this module imports neither package.

At fit start it watches every optimizer of `trainer.optimizers` as one run (a GAN's two make one
run, as `watch([...])` does), with the LightningModule as the model, under the logger's
name/version unless given a run name, and records the module's `hparams` and the Trainer's
`accumulate_grad_batches`, clipping and precision with the run. The precision plugin's
GradScaler (`precision="16-mixed"`) is found there. Under DDP or FSDP every process watches and
the ranks of the job make one run (gradwatch/distributed.py). At each optimizer step (Lightning's
`on_before_optimizer_step`, after this step's backward passes) the values the module logged
with `self.log(..., on_step=True)` (the default in `training_step`) are recorded with that step,
as the detached tensors Lightning holds: `trainer.callback_metrics` would build the progress-bar
dict, calling `.item()` on each `prog_bar=True` value, a device synchronisation per step.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import logging
import sys
from typing import Any, Optional

import torch

from ..options import WatchOptions
from ..watcher import Watcher
from .common import forward, json_safe, run_name, watch_with

log = logging.getLogger("gradwatch")

__all__ = ["LightningWatching", "callback_class", "installed_package"]  # and GradwatchCallback, made on first access

#: the package a user names -> the module that holds its Callback and Trainer
PACKAGES = {"lightning": "lightning.pytorch", "pytorch_lightning": "pytorch_lightning"}


class LightningWatching:
    """The callback's behaviour, whichever package's `Callback` it is mixed into.

    `watcher` is the `gradwatch.Watcher` while fitting. Arguments are `gradwatch.watch()`'s
    keyword arguments but `model`, `scaler` and `config` (`gradwatch.options.WatchOptions`),
    checked here.
    """

    def __init__(
        self,
        **options: Any,
    ) -> None:
        super().__init__()
        self.options = WatchOptions(**options)
        self.watcher: Optional[Watcher] = None
        self._forwarding = True

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        if self.watcher is not None:  # a second `fit()` is a run of its own
            self.watcher.close()
        optimizers = list(trainer.optimizers)
        if not optimizers:
            raise ValueError(
                "GradwatchCallback: the Trainer has no optimizer to watch (configure_optimizers returned none)"
            )
        precision = getattr(trainer, "precision_plugin", None)
        package = type(trainer).__module__.split(".")[0]  # "lightning" or "pytorch_lightning"
        self._forwarding = True
        self.watcher = watch_with(
            self.options,
            optimizers,
            model=pl_module,
            run=_logger_run_name(trainer),
            scaler=getattr(precision, "scaler", None),
            config={
                "framework": package,
                "lightning_version": getattr(sys.modules.get(package), "__version__", None),
                "accumulate_grad_batches": trainer.accumulate_grad_batches,
                "gradient_clip_val": json_safe(trainer.gradient_clip_val),
                "gradient_clip_algorithm": json_safe(trainer.gradient_clip_algorithm),
                "precision": json_safe(getattr(trainer, "precision", None)),
                "automatic_optimization": bool(getattr(pl_module, "automatic_optimization", True)),
                "hparams": json_safe(dict(getattr(pl_module, "hparams", {}) or {})),
            },
        )

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        if self.watcher is not None and self._forwarding:
            values = step_logged_values(trainer)
            self._forwarding = values is not None and forward(self.watcher, lambda: values)

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        if self.watcher is not None:
            self.watcher.close()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if self.watcher is not None:  # an exception or an interrupt (Ctrl-C) ended the fit
            self.watcher.close(status="crashed")


def step_logged_values(trainer: Any) -> Optional[dict[str, torch.Tensor]]:
    """This step's `self.log(..., on_step=True)` values, by logged name: the detached tensors of
    the training loop's result collection (`_forward_cache`), read without computing anything,
    so without a device synchronisation. Lightning's private attributes are read here only; where
    they differ, this warns and returns None (the callback stops forwarding); it never raises."""
    try:
        results = trainer._results
        values: dict[str, torch.Tensor] = {}
        for _, metric in [] if results is None else results.valid_items():
            cache = metric._forward_cache
            if metric.meta.on_step and isinstance(cache, torch.Tensor):
                values[str(metric.meta.name)] = cache.detach()
        return values
    except Exception as exc:  # Lightning's internals differ: forward nothing rather than fail
        log.warning(
            "gradwatch: cannot read the values logged with self.log from this Lightning version (%s: %s); "
            "they are not recorded with the run",
            type(exc).__name__,
            exc,
        )
        return None


def _logger_run_name(trainer: Any) -> Optional[str]:
    """`name/version_N` of the Trainer's first logger (its folder under save_dir), None without one."""
    logger = getattr(trainer, "logger", None)
    if logger is None:
        return None
    name, version = getattr(logger, "name", None), getattr(logger, "version", None)
    if version is not None and not isinstance(version, str):
        version = f"version_{version}"
    return run_name("/".join(str(part) for part in (name, version) if part))


@functools.cache
def callback_class(package: str = "lightning") -> type:
    """`GradwatchCallback` for `package` ("lightning" or "pytorch_lightning"): a subclass of its
    `Callback`, made once."""
    if package not in PACKAGES:
        raise ValueError(f"package must be one of {sorted(PACKAGES)}, not {package!r}")
    try:
        base = importlib.import_module(PACKAGES[package]).Callback
    except ImportError as exc:
        raise ImportError(
            f"gradwatch's Lightning callback needs the {package!r} package: pip install gradwatch[lightning]"
        ) from exc
    module = __name__ if package == "lightning" else f"{__package__}.pytorch_lightning"
    return type(
        "GradwatchCallback",
        (LightningWatching, base),
        {"__module__": module, "__qualname__": "GradwatchCallback", "__doc__": LightningWatching.__doc__},
    )


def installed_package() -> str:
    """ "lightning" if it is installed, else "pytorch_lightning"; ImportError with neither."""
    for package in PACKAGES:
        if importlib.util.find_spec(package) is not None:
            return package
    raise ImportError("gradwatch's Lightning callback needs Lightning: pip install gradwatch[lightning]")


def __getattr__(name: str) -> Any:
    if name == "GradwatchCallback":
        return callback_class(installed_package())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""gradwatch for the Hugging Face `Trainer`, in one line:

    from gradwatch.integrations.transformers import GradwatchCallback
    Trainer(..., callbacks=[GradwatchCallback(project="p")])

At train begin it watches the optimizer the Trainer hands to its callbacks (accelerate's wrapper
around the torch optimizer) with the Trainer's model, under `args.run_name` unless given a run
name, and records the TrainingArguments and the model's config with the run. The GradScaler of
fp16 training is the one accelerate's optimizer wrapper steps with: `watch()` finds it there. Gradient
accumulation needs nothing: the hook counts the backward passes of each step and sees the Trainer
clear `.grad` after it, which the server reports as `grad_accumulation` (info), never an error.

Under torchrun every process runs the callbacks and every one watches: the ranks of the job
make one run (gradwatch/distributed.py), each streaming what its own optimizer sees.

The Trainer tells its callbacks nothing when `train()` raises. A run whose train end never came is
closed as crashed: at interpreter exit (an exit hook registered after the watcher's own, so run
before it), or at the next train begin of the same callback.
"""

from __future__ import annotations

import atexit
import weakref
from typing import Any, Callable, Optional

import transformers
from transformers import TrainerCallback

from ..options import WatchOptions
from ..watcher import Watcher
from .common import forward, json_safe, watch_with

__all__ = ["GradwatchCallback"]


class GradwatchCallback(TrainerCallback):
    """Watches the Trainer's optimizer from train begin to train end.

    The numbers the Trainer logs (`loss`, `learning_rate`, `grad_norm`, ...) are recorded as the
    run's scalars. The Trainer logs them after its optimizer step, so they are stored with the
    optimizer step after the one they describe (the numbers of the last log, after the last
    step, have no step to go with). `watcher` is the `gradwatch.Watcher` while training runs.
    Arguments are `gradwatch.watch()`'s keyword arguments but `model`,
    `scaler` and `config` (`gradwatch.options.WatchOptions`), checked here.
    """

    def __init__(
        self,
        **options: Any,
    ) -> None:
        self.options = WatchOptions(**options)
        self.watcher: Optional[Watcher] = None
        self._forwarding = True
        self._ended = True  # train end came for the watcher's run (or there is none)
        self._exit_hook: Optional[Callable[[], None]] = None

    def on_train_begin(
        self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None, **kwargs: Any
    ) -> None:
        self._close_unfinished()  # a second `train()` on the same Trainer is a run of its own
        if optimizer is None:
            raise TypeError("GradwatchCallback got no optimizer at train begin: use it with transformers.Trainer")
        model_config = getattr(getattr(model, "config", None), "to_dict", None)
        self._forwarding = True
        self.watcher = watch_with(
            self.options,
            [optimizer],
            model=model,
            run=getattr(args, "run_name", None),
            config={
                "framework": "transformers",
                "transformers_version": transformers.__version__,
                "gradient_accumulation_steps": args.gradient_accumulation_steps,
                "training_args": json_safe(args.to_dict()),
                "model_config": json_safe(model_config()) if callable(model_config) else None,
            },
        )
        self._ended = False
        self._register_exit_hook()

    def on_log(self, args: Any, state: Any, control: Any, logs: Optional[dict[str, Any]] = None, **kwargs: Any) -> None:
        if self.watcher is not None and logs and self._forwarding:
            self._forwarding = forward(self.watcher, lambda: logs)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._ended = True
        if self.watcher is not None:
            self.watcher.close()

    def _close_unfinished(self) -> None:
        """Close as crashed the run of a `train()` that ended without train end: it raised (or
        was interrupted). A run that ended is closed already, and closing again does nothing."""
        if self.watcher is not None:
            self.watcher.close(status="crashed" if not self._ended else "finished")

    def _register_exit_hook(self) -> None:
        """At interpreter exit, close the run as crashed if its train end never came. Exit hooks
        run last registered first: registered anew after each `watch()`, this one runs before the
        watcher's own (which would close the run as finished). It holds the callback weakly."""
        if self._exit_hook is not None:
            atexit.unregister(self._exit_hook)
        me = weakref.ref(self)

        def close_unfinished_at_exit() -> None:
            callback = me()
            if callback is not None:
                callback._close_unfinished()

        self._exit_hook = close_unfinished_at_exit
        atexit.register(close_unfinished_at_exit)

"""gradwatch for `pytorch_lightning.Trainer` (the older package name of Lightning):

    from gradwatch.integrations.pytorch_lightning import GradwatchCallback
    Trainer(..., callbacks=[GradwatchCallback(project="p")])

The same callback as `gradwatch.integrations.lightning`'s (see there), subclassing
`pytorch_lightning.Callback`: the one to use where both packages are installed and the Trainer
is `pytorch_lightning`'s. Built on first use: importing this module imports no Lightning.
"""

from __future__ import annotations

from typing import Any

from .lightning import callback_class


def __getattr__(name: str) -> Any:
    if name == "GradwatchCallback":
        return callback_class("pytorch_lightning")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

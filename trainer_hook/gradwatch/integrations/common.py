"""What the framework callbacks share: watching as their `WatchOptions` say (checked when the
callback is made), the framework's configuration made JSON-safe, and the framework's logged
numbers forwarded as user scalars."""

from __future__ import annotations

import dataclasses
import enum
import logging
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import PurePath
from typing import Any, Callable, Optional, Union

import torch

from ..options import METRIC_NAME, WatchOptions
from ..watcher import Watcher

log = logging.getLogger("gradwatch")

_MAX_NAME = 200


def watch_with(
    options: WatchOptions,
    optimizers: Sequence[Any],
    *,
    model: Optional[torch.nn.Module],
    run: Optional[str],
    config: Mapping[str, Any],
    scaler: Any = None,
) -> Watcher:
    """Watch the framework's optimizers as `options` say (`Watcher` unwraps the framework's
    wrappers and finds the GradScaler accelerate's wrapper steps with); `run` is the framework's
    name for the run, used when the user gave none."""
    opts = list(optimizers)
    if options.run is None:
        options = dataclasses.replace(options, run=run_name(run))
    return Watcher(opts if len(opts) > 1 else opts[0], options, model=model, scaler=scaler, config=config)


def run_name(name: Any) -> Optional[str]:
    """A framework's run name as `watch()` takes it: a string of at most 200 printable
    characters (the end of a longer one: paths differ at their end), else None (a dated name)."""
    if name is None:
        return None
    text = re.sub(r"[\x00-\x1f\x7f]", " ", str(name)).strip()[-_MAX_NAME:]
    return text or None


def json_safe(value: Any, depth: int = 0) -> Any:
    """`value` as strict JSON can carry it: mappings with string keys, lists, finite numbers,
    strings, booleans and None; enums as their value, non-finite floats and anything else as text."""
    if depth > 20:
        return repr(value)
    if value is None or isinstance(value, (bool, str, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, enum.Enum):
        return json_safe(value.value, depth + 1)
    if isinstance(value, Mapping):
        return {str(k): json_safe(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [json_safe(v, depth + 1) for v in value]
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return json_safe(value.item(), depth + 1)
    return repr(value)


def forward(watcher: Watcher, read_logs: Callable[[], Mapping[str, Any]]) -> bool:
    """Record the framework's logged numbers (`read_logs()`) with the watcher's next step.

    A failure here is gradwatch's own and must not end the training: it is logged with its
    traceback and False returned, so that the callback stops forwarding (the watching goes on).
    """
    try:
        watcher.log(scalars(read_logs()))
        return True
    except Exception as exc:
        log.error(
            "gradwatch: stopped recording the framework's logged numbers of run %s after an error of its "
            "own; the training and the watching go on. Please report it with this traceback.",
            watcher.run_id,
            exc_info=exc,
        )
        return False


def scalars(logs: Mapping[str, Any]) -> dict[str, Union[float, torch.Tensor]]:
    """The numbers of a framework's logs that `Watcher.log` takes: ints and floats (not bools)
    and one-element tensors under valid metric names; everything else is left out."""
    out: dict[str, Union[float, torch.Tensor]] = {}
    for key, value in logs.items():
        if not isinstance(key, str) or not METRIC_NAME.match(key):  # one odd key is left out, not fatal
            continue
        if isinstance(value, torch.Tensor):
            if value.numel() == 1 and not value.dtype.is_complex and value.dtype != torch.bool:
                out[key] = value.detach()
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = float(value)
    return out

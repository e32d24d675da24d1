"""What the framework callbacks share: `watch()`'s options checked up front, the framework's
configuration made JSON-safe, and the framework's logged numbers forwarded as user scalars."""

from __future__ import annotations

import enum
import logging
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any, Callable, Optional, Union

import torch

from ..sampling import make_sampler
from ..watcher import Watcher, _check_name, watch
from ..wire import ingest_url

log = logging.getLogger("gradwatch")

#: what `Watcher.log` accepts as a name (checked here so that one odd key is left out, not fatal)
_METRIC_NAME = re.compile(r"^[A-Za-z0-9_.:-][A-Za-z0-9_./:-]{0,127}$")
_MAX_NAME = 200


@dataclass(frozen=True)
class WatchOptions:
    """`watch()`'s own arguments, checked when the callback is made: a typo fails at once, not
    after the framework has set up the model and data."""

    project: Optional[str] = None
    run: Optional[str] = None
    server: Optional[str] = None
    every: Union[int, str] = 1
    token: Optional[str] = None
    updates: bool = False
    warn: bool = True

    def __post_init__(self) -> None:
        _check_name("project", self.project)
        _check_name("run", self.run)
        make_sampler(self.every)
        if self.server is not None:
            ingest_url(self.server)
        if self.token is not None and not isinstance(self.token, str):
            raise TypeError(f"token must be a string, not {type(self.token).__name__}")
        if not isinstance(self.updates, bool) or not isinstance(self.warn, bool):
            raise TypeError("updates and warn must be True or False")

    def watch(
        self,
        optimizers: Sequence[Any],
        *,
        model: Optional[torch.nn.Module],
        run: Optional[str],
        config: Mapping[str, Any],
        scaler: Any = None,
    ) -> Watcher:
        """Watch the framework's optimizers (`watch()` unwraps the framework's wrappers and finds
        the GradScaler accelerate's wrapper steps with); `run` is the framework's name for the
        run, used when the user gave none."""
        opts = list(optimizers)
        return watch(
            opts if len(opts) > 1 else opts[0],
            model=model,
            run=self.run or run_name(run),
            project=self.project,
            server=self.server,
            every=self.every,
            scaler=scaler,
            token=self.token,
            updates=self.updates,
            warn=self.warn,
            config=config,
        )


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
        if not isinstance(key, str) or not _METRIC_NAME.match(key):
            continue
        if isinstance(value, torch.Tensor):
            if value.numel() == 1 and not value.dtype.is_complex and value.dtype != torch.bool:
                out[key] = value.detach()
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = float(value)
    return out

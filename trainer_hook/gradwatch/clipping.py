"""The total gradient norm that the loop's `torch.nn.utils.clip_grad_norm_` computed, every step.

A loop that clips has already paid for the total norm: gradwatch takes the tensor the call
returned, as it is, never computing it again and never reading it on the training thread (a CUDA
tensor rides with the step's one device-to-host copy at measured steps). While a watcher is open,
`torch.nn.utils.clip_grad_norm_` (and `torch.nn.utils.clip_grad.clip_grad_norm_`) is wrapped:
the wrapper calls the original with the same arguments and hands its result to every open
watcher (`ClipNorms.take` then gives it to the next step, as the `clip/total_norm` scalar). A
loop that imported the function by name before `watch()` (`from torch.nn.utils import
clip_grad_norm_`) calls the original: it can log the value itself, `w.log(**{"clip/total_norm":
norm})`. The original is put back when the last watcher closes.
"""

from __future__ import annotations

import functools
import threading
import weakref
from typing import Any, Callable, Optional

import torch
import torch.nn.utils
import torch.nn.utils.clip_grad

KEY = "clip/total_norm"

_lock = threading.Lock()
_open: weakref.WeakSet[ClipNorms] = weakref.WeakSet()
_original: Optional[Callable[..., Any]] = None


class ClipNorms:
    """One watcher's latest clipped total norm (the tensor `clip_grad_norm_` returned)."""

    def __init__(self) -> None:
        self.latest: Optional[torch.Tensor] = None

    def take(self) -> Optional[torch.Tensor]:
        """The norm returned since the last call, if any (once)."""
        latest, self.latest = self.latest, None
        return latest

    def open(self) -> ClipNorms:
        """Start receiving the norms (wraps the function for the first open watcher)."""
        global _original
        with _lock:
            _open.add(self)
            if _original is None:
                _original = torch.nn.utils.clip_grad_norm_
                wrapped = _wrap(_original)
                torch.nn.utils.clip_grad_norm_ = wrapped
                torch.nn.utils.clip_grad.clip_grad_norm_ = wrapped
        return self

    def close(self) -> None:
        """Stop receiving them (puts the original back after the last open watcher)."""
        global _original
        with _lock:
            _open.discard(self)
            if not _open and _original is not None:
                torch.nn.utils.clip_grad_norm_ = _original
                torch.nn.utils.clip_grad.clip_grad_norm_ = _original
                _original = None


def _wrap(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def clip_grad_norm_(*args: Any, **kwargs: Any) -> Any:
        total = original(*args, **kwargs)
        if isinstance(total, torch.Tensor) and total.numel() == 1:
            for norms in list(_open):
                norms.latest = total.detach()
        return total

    clip_grad_norm_._gradwatch = True  # type: ignore[attr-defined]
    return clip_grad_norm_

"""Everything gradwatch reads of a `torch.amp.GradScaler`, the only module that touches its private state.

GradScaler has no public way to ask whether an optimizer's gradients are unscaled yet, nor whether
`scaler.step(opt)` skipped the step; the rest of the hook asks `AmpScaler` and never the scaler.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Callable, Optional

import torch


def is_grad_scaler(scaler: object) -> bool:
    """Whether `scaler` quacks like a `torch.amp.GradScaler` (or the older `torch.cuda.amp` one)."""
    return hasattr(scaler, "_per_optimizer_states") and hasattr(scaler, "is_enabled")


def check_scaler(scaler: object) -> None:
    """TypeError unless `scaler` is a GradScaler."""
    if not is_grad_scaler(scaler):
        raise TypeError(f"scaler must be a torch.amp.GradScaler, not {type(scaler).__name__}")


class AmpScaler:
    """A GradScaler as gradwatch sees it: its scale, whether gradients are unscaled, skipped steps.

    A step the scaler skips (inf/NaN gradients) never calls `optimizer.step()`, so no step hook
    fires; `watch_steps` wraps `scaler.step` (on the instance, undone by `remove`) to see it: the
    watcher calls `stepped()` from its step pre-hook, and `on_skip(opt)` runs when
    `scaler.step(opt)` returned without any. A fused optimizer (`fused=True` Adam, AdamW, SGD,
    Adagrad) is stepped all the same and skips inside its kernel on the scaler's `found_inf`
    tensor: those skips are summed on the device and read with the measured steps, never now
    (reading a CUDA tensor would synchronise).
    """

    def __init__(self, scaler: Any) -> None:
        check_scaler(scaler)
        self.scaler = scaler
        self.skipped = 0  # optimizer steps the scaler skipped
        self._stepped = False
        self._step: Optional[Callable[..., Any]] = None
        self._found_inf: Optional[torch.Tensor] = None  # fused optimizers' skips, summed on the device

    def stepped(self, optimizer: Optional[torch.optim.Optimizer] = None) -> None:
        """An optimizer step is running (called from the step pre-hook). GradScaler hands a fused
        `optimizer` this step's `found_inf` (1.0: the kernel skips the step) as an attribute."""
        self._stepped = True
        found = getattr(optimizer, "found_inf", None)
        if isinstance(found, torch.Tensor):
            found = found.detach().reshape(-1)[0]
            self._found_inf = (
                found.clone()
                if self._found_inf is None
                else self._found_inf.add_(found.to(self._found_inf.device, non_blocking=True))
            )

    def scale(self) -> Optional[torch.Tensor]:
        """The current scale (a tensor on the scaler's device), None before the first `scaler.scale()`."""
        return getattr(self.scaler, "_scale", None)

    def scalars(self, logged: dict[str, Any]) -> None:
        """Add `amp/skipped_steps` and `amp/scale` to a step's scalars (the user's own win)."""
        found = self._found_inf
        logged.setdefault("amp/skipped_steps", self.skipped if found is None else found + self.skipped)
        scale = self.scale()
        if scale is not None:
            logged.setdefault("amp/scale", scale)

    def inverse_scale(
        self, device: torch.device, optimizers: Sequence[torch.optim.Optimizer]
    ) -> Optional[torch.Tensor]:
        """1/scale on `device`, unless the scaler is off or the user already unscaled the gradients
        of any of `optimizers` (`scaler.unscale_(opt)` before clipping): then they are true as they are."""
        scaler, scale = self.scaler, self.scale()
        if scale is None or not scaler.is_enabled():
            return None
        from torch.amp.grad_scaler import OptState

        for opt in optimizers:
            if scaler._per_optimizer_states[id(opt)]["stage"] is OptState.UNSCALED:
                return None
        return scale.to(device=device, non_blocking=True).double().reciprocal().float()

    def remove(self) -> None:
        """Undo the wrapping of `scaler.step` (if nobody wrapped it again since)."""
        if self._step is not None and self.scaler.__dict__.get("step") is self._step:
            del self.scaler.__dict__["step"]
        self._step = None

    def watch_steps(
        self, optimizers: Sequence[torch.optim.Optimizer], on_skip: Callable[[torch.optim.Optimizer], None]
    ) -> None:
        """Wrap `scaler.step` to count the steps of `optimizers` it skips."""
        original = self.scaler.step
        watched = list(optimizers)

        def step(opt: Any, *args: Any, **kwargs: Any) -> Any:
            if self._step is not step or not any(opt is o for o in watched):
                return original(opt, *args, **kwargs)
            self._stepped = False
            out = original(opt, *args, **kwargs)
            if not self._stepped:
                self.skipped += 1
                on_skip(opt)
            return out

        self._step = step
        self.scaler.step = step

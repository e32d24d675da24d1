"""How each `.grad` was filled: backward passes since the last step, and how it was cleared.

A post-accumulate-grad hook per parameter counts the backward passes that add into `.grad`. At
the first of them after an optimizer step it looks at tensor metadata only (no device work):
- a different `.grad` tensor than the step left behind: it was set to `None` (`zero_grad()`,
  `model.zero_grad()`, `p.grad = None`) and autograd made a new one;
- the same tensor whose version counter moved by one: only this accumulation wrote to it, so it
  still held the previous step's gradient (a forgotten `zero_grad()`);
- the same tensor, moved by more: something wrote to it in place in between (`zero_()`, as
  `zero_grad(set_to_none=False)` does).
This tells intentional accumulation (K passes after a clear) from a forgotten clear exactly.
"""
from __future__ import annotations

import weakref
from typing import Any, Optional, Sequence

import numpy as np
import torch

#: `grad_clear` codes (see docs/protocol.md); ABSENT when nothing accumulated since the last step.
CLEAR_NOT, CLEAR_NONE, CLEAR_ZERO = 0.0, 1.0, 2.0


class GradTracker:
    def __init__(self, params: list[torch.Tensor]) -> None:
        n = len(params)
        self._passes = [0] * n
        self._clear: list[Optional[float]] = [None] * n
        # per parameter, as the last step left it: (weakref to .grad, its version), or None before
        # the first step; (None, 0) when .grad was None then
        self._ref: list[Optional[tuple[Optional[weakref.ref[torch.Tensor]], int]]] = [None] * n
        self._handles = [p.register_post_accumulate_grad_hook(self._counter(i))
                         for i, p in enumerate(params) if p.requires_grad and p.is_leaf]
        self._params = params

    def _counter(self, i: int) -> Any:
        def on_accumulate(p: torch.Tensor) -> None:
            if self._passes[i] == 0:
                self._clear[i] = self._how_cleared(i, p.grad)
            self._passes[i] += 1
        return on_accumulate

    def _how_cleared(self, i: int, grad: Optional[torch.Tensor]) -> Optional[float]:
        ref = self._ref[i]
        if ref is None or grad is None:
            return None
        old, version = ref
        if old is None or old() is not grad:
            return CLEAR_NONE
        return CLEAR_NOT if grad._version - version <= 1 else CLEAR_ZERO

    def end_step(self, indices: Optional[Sequence[int]] = None) -> tuple[np.ndarray, np.ndarray]:
        """Passes and clear codes (NaN = nothing to say) since the last step; starts a new step.

        Called after every optimizer step, and for steps a GradScaler skipped, with the
        parameters of the optimizer that stepped (default: all); the arrays cover those only.
        """
        if indices is None:  # one optimizer: whole lists at once (this runs at every step)
            passes = np.array(self._passes, dtype=np.float32)
            clear = np.array([np.nan if c is None else c for c in self._clear], dtype=np.float32)
            self._ref = [(None, 0) if (g := p.grad) is None else (weakref.ref(g), g._version) for p in self._params]
            self._passes = [0] * len(self._params)
            self._clear = [None] * len(self._params)
            return passes, clear
        passes = np.asarray([self._passes[i] for i in indices], dtype=np.float32)
        clear = np.asarray([np.nan if self._clear[i] is None else self._clear[i] for i in indices], dtype=np.float32)
        for i in indices:
            g = self._params[i].grad
            self._ref[i] = (None, 0) if g is None else (weakref.ref(g), g._version)
            self._passes[i] = 0
            self._clear[i] = None
        return passes, clear

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()

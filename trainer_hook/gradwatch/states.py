"""Where an optimizer keeps its per-parameter state, when not in its own `.state`.

`torch.distributed.optim.ZeroRedundancyOptimizer` steps every parameter (its `param_groups` are
the whole model's), but each rank's state lives in its local optimizer, `.optim`, for the
parameters that rank owns: the others have no state on this rank. The hook reads this rank's state
there; the server counts a state that exists on one rank only once (docs/distributed.md).

Quantized state (torchao's and bitsandbytes' 8-bit, 4-bit and FP8 AdamW) is codes plus per-block
scales and a code map: its `<key>_norm` is the norm of the library's own dequantization, computed
from the codes a chunk at a time (`Quantized`), never from a dequantized copy of the whole state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

#: (module, class, attribute holding the optimizer whose `.state` is this rank's)
SHARDED = (("torch.distributed.optim.zero_redundancy_optimizer", "ZeroRedundancyOptimizer", "optim"),)


def state_of(optimizer: torch.optim.Optimizer) -> Any:
    """The mapping parameter -> state dict that holds `optimizer`'s state on this rank."""
    cls = type(optimizer)
    for module, name, attr in SHARDED:
        if cls.__name__ == name and cls.__module__ == module:
            inner = getattr(optimizer, attr, None)
            if isinstance(inner, torch.optim.Optimizer):
                return inner.state
    return optimizer.state


def shards_state(optimizer: torch.optim.Optimizer) -> bool:
    """Whether `optimizer` keeps each parameter's state on the rank that owns it only (SHARDED):
    a DDP replica's state norms are then the only ones of the parameters it owns, which the
    server counts (docs/protocol.md, a replica's digest)."""
    return state_of(optimizer) is not optimizer.state


# -- quantized state ----------------------------------------------------------------------------
#: elements of codes read at once: the norm never holds a float copy of a whole state tensor
CHUNK = 1 << 20


@dataclass(frozen=True)
class Quantized:
    """A state tensor stored as 8-bit codes with one scale per block: element i of block b is
    `value(code_i) * scale_b` (the library's own dequantization), so its squared norm is
    sum_b scale_b^2 * sum_{i in b} lut[byte_i], with `lut` the square of each byte's decoded
    value(s): a 256-entry table, which also covers two 4-bit codes per byte."""

    codes: torch.Tensor  # 1-D uint8, as stored
    lut: torch.Tensor  # 256 float32 on the codes' device
    scale: torch.Tensor  # 1-D, one per block
    block_bytes: int  # bytes of codes per block (the last block may be short)

    @property
    def nbytes(self) -> int:
        return self.codes.numel() * self.codes.element_size() + self.scale.numel() * self.scale.element_size()

    def norm(self) -> torch.Tensor:
        """The norm of the dequantized tensor, as a float32 0-d tensor on its device (no sync),
        reading CHUNK codes at a time."""
        codes, bb = self.codes, self.block_bytes
        full = codes.numel() // bb
        total = torch.zeros((), dtype=torch.float32, device=codes.device)
        rows_per_chunk = max(1, CHUNK // bb)
        for start in range(0, full, rows_per_chunk):
            stop = min(full, start + rows_per_chunk)
            rows = codes[start * bb : stop * bb].view(stop - start, bb)
            total += (self.lut[rows.int()].sum(1) * self.scale[start:stop].float().square()).sum()
        if full * bb < codes.numel():  # a short last block (bitsandbytes)
            total += self.lut[codes[full * bb :].int()].sum() * self.scale[full].float().square()
        return total.sqrt()


_BYTES = 256
#: bitsandbytes' optimizers quantize their state in blocks of 256 (bitsandbytes/optim/optimizer.py)
BNB_BLOCK = 256


def _lut_8bit(qmap: torch.Tensor) -> torch.Tensor:
    return qmap.float().square()


def _lut_4bit(qmap: torch.Tensor) -> torch.Tensor:
    """A byte holds two codes, high nibble first (torchao's OptimState4bit)."""
    q2 = qmap.float().square()
    byte = torch.arange(_BYTES, device=qmap.device)
    return q2[byte >> 4] + q2[byte & 0xF]


def _lut_float8(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.arange(_BYTES, dtype=torch.uint8, device=device).view(dtype).float().square()


def quantized(key: str, value: Any, state: dict[str, Any], p: torch.Tensor) -> Optional[Quantized]:
    """`state[key]` as a `Quantized` when it is a quantized state of `p` that this module knows:
    torchao's OptimState8bit / OptimState4bit / OptimStateFp8 (AdamW8bit, AdamW4bit, AdamWFp8),
    bitsandbytes' 8-bit blockwise `stateN` (with `qmapN` and `absmaxN`); None otherwise."""
    cls = type(value)
    if cls.__module__.startswith("torchao.optim.subclass_"):
        codes, scale = getattr(value, "codes", None), getattr(value, "scale", None)
        if not isinstance(codes, torch.Tensor) or not isinstance(scale, torch.Tensor) or not scale.numel():
            return None
        flat = codes.reshape(-1)
        if cls.__name__ == "OptimState8bit":
            lut = _lut_8bit(value.qmap)
        elif cls.__name__ == "OptimState4bit":
            lut = _lut_4bit(value.qmap)
        elif cls.__name__ == "OptimStateFp8":
            lut, flat = _lut_float8(codes.dtype, codes.device), flat.view(torch.uint8)
        else:
            return None
        return Quantized(flat, lut, scale.reshape(-1), flat.numel() // scale.numel())
    if (
        key.startswith("state")
        and isinstance(value, torch.Tensor)
        and value.dtype == torch.uint8
        and value.shape == p.shape
        and isinstance(qmap := state.get(f"qmap{key[5:]}"), torch.Tensor)
        and isinstance(absmax := state.get(f"absmax{key[5:]}"), torch.Tensor)
        and qmap.numel() == _BYTES
        and absmax.numel()
    ):  # bitsandbytes' blockwise 8-bit state: blocks of 256 codes, the last one short
        flat = value.reshape(-1)
        if -(-flat.numel() // BNB_BLOCK) != absmax.numel():
            return None
        return Quantized(flat, _lut_8bit(qmap), absmax.reshape(-1), BNB_BLOCK)
    return None

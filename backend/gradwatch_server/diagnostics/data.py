"""What the checks read: `RunContext` (from the run's `hello`) and `StepView` (one stored or
ingested step, decoded once for all checks).

Per-parameter arrays arrive as raw little-endian bytes (wire, store) or numpy arrays (replay).
ABSENT (the NaN with bits 0x7FDEAD00) is resolved here, on the bits, so that checks never see
it as a number: float metrics become float64 arrays with NaN where ABSENT, plus a mask.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..jobs.assemble import DESYNC_METRIC
from ..protocol import GRAD_STATUS, absent_mask

# grad_status codes (docs/protocol.md)
NONE, ZERO, NONZERO, NONFINITE = 0, 1, 2, 3
# grad_clear codes (docs/protocol.md); NOT_SEEN stands for ABSENT
NOT_CLEARED, SET_TO_NONE, ZERO_FILLED, NOT_SEEN = 0, 1, 2, -1

#: The per-parameter metrics and scalars the checks read (a replay from the store reads only these).
METRICS = (
    "grad_norm",
    GRAD_STATUS,
    "backward_passes",
    "grad_clear",
    DESYNC_METRIC,
    "update_ratio",
    "eps_share",
    "spike_z",
    "spike_ratio",
)
SCALARS = (
    "mem/zero_grad_bytes",
    "amp/scale",
    "amp/skipped_steps",
    "loss",
    "grad_norm_total",
    "clip/total_norm",
    "flight/total_z",
    "flight/total_ratio",
)

_DTYPE_BYTES = {
    "float64": 8,
    "double": 8,
    "float32": 4,
    "float": 4,
    "float16": 2,
    "half": 2,
    "bfloat16": 2,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "complex64": 8,
    "complex128": 16,
    "bool": 1,
}


@dataclass(frozen=True)
class RunContext:
    """A run as its `hello` described it: parameter names and sizes, and the hook's config."""

    params: tuple[str, ...]
    numel: np.ndarray  # int64 per parameter
    bytes_per_param: np.ndarray  # numel x element size (float32 assumed for unknown dtypes)
    config: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, params: Sequence[tuple[str, int, str]], config: Mapping[str, Any] | None = None) -> RunContext:
        """From (name, numel, dtype) per parameter, in the order of the per-parameter arrays."""
        numel = np.array([n for _, n, _ in params], dtype=np.int64)
        size = np.array([_DTYPE_BYTES.get(d, 4) for _, _, d in params], dtype=np.int64)
        return cls(
            params=tuple(name for name, _, _ in params),
            numel=numel,
            bytes_per_param=numel * size,
            config=dict(config or {}),
        )

    def names(self, mask: np.ndarray) -> tuple[str, ...]:
        """The names of the parameters where `mask` is true."""
        return tuple(self.params[i] for i in np.flatnonzero(mask))

    def config_names(self, key: str) -> tuple[str, ...]:
        """A list of parameter names from the config (e.g. `unoptimized_params`); () if absent or malformed."""
        value = self.config.get(key)
        if not isinstance(value, list):
            return ()
        return tuple(v for v in value if isinstance(v, str))


def _floats(raw: bytes | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(float64 values with NaN where ABSENT, ABSENT mask) of a float32 per-parameter array."""
    arr = (
        np.frombuffer(raw, dtype="<f4")
        if isinstance(raw, (bytes, bytearray, memoryview))
        else np.asarray(raw, dtype="<f4")
    )
    absent = absent_mask(arr)
    values = arr.astype(np.float64)
    if absent.any():  # most arrays have none: no masked write at every step
        values[absent] = np.nan
    return values, absent


@dataclass(frozen=True)
class StepView:
    """One step, as the checks read it. Arrays are per parameter, in `RunContext.params` order.

    `status` is always there (derived from `grad_norm` when the step has no `grad_status`);
    `passes` (backward passes since the previous step) and `clear` (how `.grad` was cleared,
    NOT_SEEN where ABSENT) are None when the hook did not send them (older hooks).
    """

    step: int
    scalars: Mapping[str, float]
    grad_norm: np.ndarray  # float64, NaN where there is no .grad (and where the norm is NaN)
    status: np.ndarray  # uint8 codes
    passes: np.ndarray | None = None  # float64, NaN where ABSENT
    clear: np.ndarray | None = None  # int64 codes, NOT_SEEN where ABSENT
    #: `np.nan_to_num(passes)`, made once: three checks read it (a NaN count is not above 0)
    passes_known: np.ndarray | None = None
    #: A distributed job's step: per parameter, how many ranks' gradient differs from rank 0's
    #: (jobs/assemble.py; NaN where the rule does not apply); None elsewhere.
    desync: np.ndarray | None = None
    #: `update_ratio` per parameter (NaN where ABSENT) when the hook measured updates (`updates=True`)
    update_ratio: np.ndarray | None = None
    #: `eps_share` per parameter (Adam family): share of entries in Adam's epsilon regime
    eps_share: np.ndarray | None = None
    #: the hook's flight recorder's spike score and ratio per parameter, at a spike it recorded
    #: between measured steps (scored against every step's norms, which the server lacks)
    spike_z: np.ndarray | None = None
    spike_ratio: np.ndarray | None = None
    #: what checks derive from this step and share, filled as they run (spikes.py's gradient score)
    memo: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(
        cls, step: int, scalars: Mapping[str, float], arrays: Mapping[str, bytes | np.ndarray], count: int
    ) -> StepView:
        """From a step's scalars and raw arrays (`count` parameters)."""
        if "grad_norm" in arrays:
            norm, no_grad = _floats(arrays["grad_norm"])
        else:
            norm, no_grad = np.full(count, np.nan), np.ones(count, dtype=bool)
        raw_status = arrays.get(GRAD_STATUS)
        if raw_status is not None:
            status = (
                np.frombuffer(raw_status, dtype="u1")
                if isinstance(raw_status, (bytes, bytearray, memoryview))
                else np.asarray(raw_status, dtype="u1")
            )
        else:  # as the hook derives it
            status = np.full(count, NONZERO, dtype=np.uint8)
            status[norm == 0] = ZERO
            status[~np.isfinite(norm)] = NONFINITE
            status[no_grad] = NONE
        passes = _floats(arrays["backward_passes"])[0] if "backward_passes" in arrays else None
        clear = None
        if "grad_clear" in arrays:
            values, absent = _floats(arrays["grad_clear"])
            clear = np.where(absent | ~np.isfinite(values), NOT_SEEN, values).astype(np.int64)
        return cls(
            step=step,
            scalars=scalars,
            grad_norm=norm,
            status=status,
            passes=passes,
            clear=clear,
            passes_known=None if passes is None else np.nan_to_num(passes),
            desync=_floats(arrays[DESYNC_METRIC])[0] if DESYNC_METRIC in arrays else None,
            update_ratio=_floats(arrays["update_ratio"])[0] if "update_ratio" in arrays else None,
            eps_share=_floats(arrays["eps_share"])[0] if "eps_share" in arrays else None,
            spike_z=_floats(arrays["spike_z"])[0] if "spike_z" in arrays else None,
            spike_ratio=_floats(arrays["spike_ratio"])[0] if "spike_ratio" in arrays else None,
        )

    @classmethod
    def unmeasured(cls, step: int, scalars: Mapping[str, float], count: int) -> StepView:
        """A step the hook did not measure: its scalars only (the loss it logged, learning rates)."""
        return cls(step=step, scalars=scalars, grad_norm=np.full(count, np.nan), status=np.zeros(count, dtype=np.uint8))

    def scalar(self, key: str) -> float | None:
        value = self.scalars.get(key)
        return None if value is None else float(value)

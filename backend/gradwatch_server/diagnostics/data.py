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

    @classmethod
    def unmeasured_batch(cls, steps: Sequence[tuple[int, Mapping[str, float]]], count: int) -> list[StepView]:
        """`unmeasured` of each (step, scalars), sharing one read-only pair of arrays: a check
        writing into a step's arrays fails loudly rather than changing the other steps."""
        norm, status = np.full(count, np.nan), np.zeros(count, dtype=np.uint8)
        norm.flags.writeable = status.flags.writeable = False
        return [cls(step=step, scalars=scalars, grad_norm=norm, status=status) for step, scalars in steps]

    def scalar(self, key: str) -> float | None:
        value = self.scalars.get(key)
        return None if value is None else float(value)


#: The float metrics `StepView.of` decodes, by field (grad_norm and the status are done apart).
_FLOAT_FIELDS = (
    ("desync", DESYNC_METRIC),
    ("update_ratio", "update_ratio"),
    ("eps_share", "eps_share"),
    ("spike_z", "spike_z"),
    ("spike_ratio", "spike_ratio"),
)


class StepBatch:
    """Consecutive measured steps, judged at once (`Check.observe_batch`): their `StepView`s and,
    per field, the steps' arrays as one 2-D array (a row per step), made once for all checks.

    Per step the checks' numpy calls cost more than their work (80 parameters: a microsecond or
    two a call, about 15 checks of several calls each); over a batch of the hook's steps (its
    `linger` brings tens of them) one call covers them all (docs/design.md)."""

    def __init__(self, views: Sequence[StepView], stacked: Mapping[str, np.ndarray] | None = None) -> None:
        self.views = list(views)
        self.steps = np.array([v.step for v in self.views], dtype=np.int64)
        self._stacked: dict[str, np.ndarray | None] = dict(stacked or {})
        #: what one check worked out for the batch and another may reuse (spikes.py's scores)
        self.memo: dict[str, Any] = {}

    def __len__(self) -> int:
        return len(self.views)

    def stack(self, name: str) -> np.ndarray | None:
        """The `StepView` field `name` of every step as rows of one array; None where a step
        lacks it (then the caller judges step by step)."""
        if name not in self._stacked:
            rows = [getattr(v, name) for v in self.views]
            self._stacked[name] = (
                None if any(r is None for r in rows) or len({len(r) for r in rows}) != 1 else np.stack(rows)
            )
        return self._stacked[name]

    @classmethod
    def decode(
        cls, records: Sequence[tuple[int, Mapping[str, float], Mapping[str, bytes | np.ndarray]]], count: int
    ) -> StepBatch | None:
        """`StepView.of` of each (step, scalars, arrays), the same arrays, decoded at once: one
        `frombuffer` and one ABSENT mask per metric for the whole batch. None (the caller decodes
        step by step) unless every step has the same metrics, each of `count` values."""
        if not records:
            return None
        keys = [k for k in METRICS if k in records[0][2]]  # what `StepView.of` reads
        if "grad_norm" not in keys or any([k for k in METRICS if k in r[2]] != keys for r in records):
            return None
        n = len(records)

        def rows(key: str, dtype: str) -> np.ndarray | None:
            """The steps' `key` as an (n, count) array of `dtype` (raw bytes joined, or arrays
            stacked, as `StepView.of` reads each); None unless each has `count` values."""
            raws = [r[2][key] for r in records]
            size = count * np.dtype(dtype).itemsize
            if all(isinstance(raw, bytes) and len(raw) == size for raw in raws):
                return np.frombuffer(b"".join(raws), dtype=dtype).reshape(n, count)  # type: ignore[arg-type]
            if all(isinstance(raw, np.ndarray) and raw.shape == (count,) for raw in raws):
                return np.stack([np.asarray(raw, dtype=dtype) for raw in raws])
            return None

        loaded = {k: rows(k, "u1" if k == GRAD_STATUS else "<f4") for k in keys}
        if any(arr is None for arr in loaded.values()):
            return None

        def floats(key: str) -> tuple[np.ndarray, np.ndarray]:
            arr = loaded[key]
            assert arr is not None
            absent = absent_mask(arr)
            values = arr.astype(np.float64)
            if absent.any():
                values[absent] = np.nan
            return values, absent

        norm, no_grad = floats("grad_norm")
        given = loaded.get(GRAD_STATUS)
        if given is not None:
            status = given
        else:  # as the hook derives it
            status = np.full((n, count), NONZERO, dtype=np.uint8)
            status[norm == 0] = ZERO
            status[~np.isfinite(norm)] = NONFINITE
            status[no_grad] = NONE
        stacked: dict[str, np.ndarray | None] = {"grad_norm": norm, "status": status}
        passes = floats("backward_passes")[0] if "backward_passes" in keys else None
        stacked["passes"] = passes
        stacked["passes_known"] = None if passes is None else np.nan_to_num(passes)
        if "grad_clear" in keys:
            values, absent = floats("grad_clear")
            stacked["clear"] = np.where(absent | ~np.isfinite(values), NOT_SEEN, values).astype(np.int64)
        else:
            stacked["clear"] = None
        for name, key in _FLOAT_FIELDS:
            stacked[name] = floats(key)[0] if key in keys else None
        views = [
            StepView(
                step=step,
                scalars=scalars,
                **{name: None if arr is None else arr[i] for name, arr in stacked.items()},  # type: ignore[arg-type]
            )
            for i, (step, scalars, _) in enumerate(records)
        ]
        return cls(views, {k: v for k, v in stacked.items() if v is not None})

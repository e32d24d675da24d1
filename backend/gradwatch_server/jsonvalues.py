"""Numbers as the API's JSON writes them: standard JSON has no NaN or infinities.

Non-finite floats become the strings "NaN", "Infinity", "-Infinity"; a value that does not apply
(ABSENT, or an empty downsampling bucket) becomes null. The inverse is `from_json`, used when
an exported run is imported.
"""

from __future__ import annotations

import math

import numpy as np

from .protocol import ABSENT_BITS, absent_mask

JsonFloat = float | str | None

_ABSENT_F32 = np.array([ABSENT_BITS], dtype="<u4").view("<f4")[0]


def word(value: float) -> JsonFloat:
    """One float for JSON: itself when finite, else its string."""
    if math.isfinite(value):
        return value
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


def float_list(values: np.ndarray, missing: np.ndarray | None = None) -> list[JsonFloat]:
    """A 1-D float array as a JSON list; entries where `missing` is true become null.

    float32 values widen to float64 exactly, so a client can recover the stored bits.
    """
    out: list[JsonFloat] = values.astype(np.float64).tolist()
    bad = ~np.isfinite(values)
    if missing is not None:
        bad |= missing
    for i in np.flatnonzero(bad):
        out[i] = None if missing is not None and missing[i] else word(out[i])  # type: ignore[arg-type]
    return out


def metric_list(values: np.ndarray) -> list[JsonFloat]:
    """A float32 per-parameter array (ABSENT included) as a JSON list."""
    return float_list(values, absent_mask(values))


def from_json(value: object) -> float:
    """A JSON scalar back to a float: strings to non-finite values; rejects anything else."""
    if isinstance(value, str):
        parsed = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}.get(value)
        if parsed is None:
            raise ValueError(f"{value!r} is not a number")
        return parsed
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{value!r} is not a number")
    return float(value)


def metric_array(values: list[object]) -> np.ndarray:
    """A JSON list of a per-parameter metric back to float32, null becoming ABSENT."""
    out = np.empty(len(values), dtype="<f4")
    for i, v in enumerate(values):
        out[i] = _ABSENT_F32 if v is None else from_json(v)
    return out

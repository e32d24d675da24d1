"""How values are kept in columns: scalars with their NaN and -0.0 marked, shapes as JSON."""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

#: `scalars.special` codes (see schema.py): values SQLite cannot keep in a REAL column.
SPECIAL_NAN = 1
SPECIAL_NEG_ZERO = 2


def encode_scalar(value: float) -> tuple[float | None, int | None]:
    if math.isnan(value):
        return None, SPECIAL_NAN
    if value == 0.0 and math.copysign(1.0, value) < 0:
        return 0.0, SPECIAL_NEG_ZERO
    return value, None


def decode_scalars(rows: Sequence[Any]) -> np.ndarray:
    """(value, special) rows -> float64 array, NaN and -0.0 restored."""
    values = np.array([r.value for r in rows], dtype=np.float64)  # None becomes NaN
    special = np.array([r.special or 0 for r in rows], dtype=np.int64)
    values[special == SPECIAL_NAN] = np.nan
    values[special == SPECIAL_NEG_ZERO] = -0.0
    return values


def scalar_columns(rows: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
    """(steps, float64 values) of plain (step, value, special) rows of a scalar, NaN and -0.0
    restored; read column by column (zip(*rows) builds big tuples that wake the garbage collector)."""
    values = np.array([r[1] for r in rows], dtype=np.float64)  # None (a NaN) becomes NaN
    special = np.array([r[2] for r in rows], dtype=np.float64)  # None (nothing special) becomes NaN
    values[special == SPECIAL_NAN] = np.nan
    values[special == SPECIAL_NEG_ZERO] = -0.0
    return np.array([r[0] for r in rows], dtype=np.int64), values


@functools.lru_cache(maxsize=1024)
def shape(text: str) -> tuple[int, ...]:
    """A stored shape (a JSON list), decoded; each distinct shape once."""
    return tuple(json.loads(text))

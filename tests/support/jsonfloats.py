"""Reading the API's JSON numbers back: non-finite values travel as "NaN", "Infinity" and
"-Infinity" (JSON has no tokens for them), absent ones as null. Shared by tests and benchmarks."""

from __future__ import annotations

import math

_WORDS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def number(value: object) -> float:
    """A JSON value of the API as a float (null -> NaN)."""
    if value is None:
        return math.nan
    if isinstance(value, str):
        return _WORDS[value]
    return float(value)  # type: ignore[arg-type]


def same(a: float, b: float, rel: float = 0.0) -> bool:
    """Equal, NaN equal to NaN, or within `rel` relative difference."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b or abs(a - b) <= rel * max(abs(a), abs(b))

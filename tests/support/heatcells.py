"""A heatmap's cells as float32 bit patterns, read from either encoding of the API
(docs/api.md, Heatmap): `z_f32` (base64 of little-endian float32) and `z` (JSON numbers, with
"NaN"/"Infinity"/"-Infinity" and null), so that a test compares the two bit for bit."""

from __future__ import annotations

import base64
import binascii
from typing import Any

import numpy as np

from support.jsonfloats import number

#: The f32 encoding's cell without a value (null in `z`), and its NaN.
EMPTY_BITS = 0x7FC00001
NAN_BITS = 0x7FC00000


def f32_bits(body: dict[str, Any]) -> np.ndarray:
    """`z_f32` as uint32, shape [len(params), len(step)]; only standard, padded base64 passes."""
    text = body["z_f32"]
    assert isinstance(text, str) and len(text) % 4 == 0, "base64 with padding"
    try:
        raw = base64.b64decode(text, validate=True)  # refuses the URL-safe alphabet and stray characters
    except binascii.Error as exc:
        raise AssertionError(f"z_f32 is not standard base64: {exc}") from exc
    return np.frombuffer(raw, dtype="<u4").reshape(len(body["params"]), len(body["step"]))


def json_bits(body: dict[str, Any]) -> np.ndarray:
    """`z` as the uint32 bits `z_f32` must hold for it; each number must be exactly a float32."""
    out = np.empty((len(body["params"]), len(body["step"])), dtype="<u4")
    for i, row in enumerate(body["z"]):
        assert len(row) == len(body["step"])
        for j, value in enumerate(row):
            if value is None:
                out[i, j] = EMPTY_BITS
            elif value == "NaN":
                out[i, j] = NAN_BITS
            else:
                cell = np.float32(number(value))
                assert float(cell) == number(value), (i, j, value)  # exact in float32
                out[i, j] = cell.view("<u4")
    return out


def assert_same_cells(as_json: dict[str, Any], as_f32: dict[str, Any]) -> np.ndarray:
    """The two answers hold the same grid (the f32 one with `z` null); returns its bits."""
    assert as_f32["z"] is None and "z_f32" not in as_json
    assert {k: v for k, v in as_f32.items() if k not in ("z", "z_f32")} == {
        k: v for k, v in as_json.items() if k != "z"
    }
    bits = f32_bits(as_f32)
    assert np.array_equal(bits, json_bits(as_json))
    return bits

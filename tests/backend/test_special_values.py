"""NaN, ±Inf, -0.0 and the extremes round-trip exactly: websocket -> database -> JSON API, CSV
and Parquet exports, on SQLite and PostgreSQL. Scalars are float64 (1e308 fits); per-parameter
values are float32 (3.4e38 is the largest)."""

from __future__ import annotations

import csv
import io
import json
import math
import struct

import httpx
import numpy as np
import pyarrow.parquet as pq
import pytest

from support.heatcells import EMPTY_BITS, NAN_BITS, assert_same_cells
from support.jsonfloats import number
from support.server import ServerProcess
from support.wiremsg import ABSENT_BITS, Hook, close, f32, hello, step

pytestmark = pytest.mark.server

SCALARS = {"big": 1e308, "tiny": 5e-324, "nan": "NaN", "inf": "Infinity", "ninf": "-Infinity", "nzero": -0.0}
PARAM = [float("nan"), float("inf"), float("-inf"), -0.0, 3.4e38, 1e-45]  # one value per parameter
NAMES = [f"p{i}.weight" for i in range(len(PARAM))]


def bits64(x: float) -> bytes:
    return struct.pack("<d", x)


def bits32(x: float) -> bytes:
    return np.float32(x).tobytes()


def same64(got: float, want: float) -> bool:
    return (math.isnan(got) and math.isnan(want)) or bits64(got) == bits64(want)


def same32(got: float, want: float) -> bool:
    return (math.isnan(got) and math.isnan(want)) or bits32(got) == bits32(want)


def bits(x: float) -> int:
    """The float32 bit pattern of x, as an integer."""
    return int(np.float32(x).view("<u4"))


def test_special_values_round_trip_everywhere(server: ServerProcess) -> None:
    with Hook(server.ws_url) as hook:
        hook.call(hello("special", params=NAMES))
        assert (
            hook.call(step(1, 1, scalars=SCALARS, arrays={"grad_norm": f32(*PARAM)}, grad_status=[3, 3, 3, 1, 2, 2]))[
                "type"
            ]
            == "ack"
        )
        hook.call(close(2))
    want = {k: number(v) for k, v in SCALARS.items()}
    with httpx.Client(base_url=server.url, timeout=30) as http:
        for key, value in want.items():  # JSON API, scalars
            got = http.get("/api/runs/special/series", params={"key": key}).json()["value"][0]
            assert same64(number(got), value), (key, got)
        series = http.get("/api/runs/special/params/series", params={"metric": "grad_norm", "param": NAMES}).json()[
            "series"
        ]
        for s in series:  # JSON API, per-parameter values
            assert same32(number(s["value"][0]), PARAM[NAMES.index(s["param"])]), s

        rows = list(csv.DictReader(io.StringIO(http.get("/api/runs/special/export", params={"format": "csv"}).text)))
        assert [r["param"] for r in rows] == NAMES
        for r, value in zip(rows, PARAM):  # CSV: text that parses back to the same float32
            assert same32(float(r["grad_norm"]), value), r

        table = pq.read_table(io.BytesIO(http.get("/api/runs/special/export", params={"format": "parquet"}).content))
        data = table.to_pydict()
        for name, value in zip(data["param"], data["grad_norm"]):  # Parquet
            assert same32(value, PARAM[NAMES.index(name)]), (name, value)
        # Scalars are not per parameter: the CSV and Parquet rows leave them out; the JSON-lines
        # export (what `gradwatch import` reads) carries them.
        lines = [
            json.loads(line)
            for line in http.get("/api/runs/special/export", params={"format": "json"}).text.splitlines()
        ]
        steps = [line for line in lines if line.get("type") == "step"]
        assert len(steps) == 1
        for key, value in want.items():
            assert same64(number(steps[0]["scalars"][key]), value), (key, steps[0]["scalars"][key])


def test_heatmap_f32_keeps_special_values_exactly(server: ServerProcess) -> None:
    """encoding=f32: ±Inf, -0.0 and the extremes as they are; every NaN, whatever its payload (even
    EMPTY's own bits), is 0x7FC00000; a cell with no value is EMPTY, 0x7FC00001; raw and downsampled."""
    odd_nans = np.array([EMPTY_BITS, 0xFFC00000, 0x7F800001], dtype="<u4").view("<f4")  # EMPTY's, negative, signalling
    second = np.concatenate([odd_nans, f32(0, 0, 0)])
    second.view("<u4")[3:] = ABSENT_BITS
    third = f32(1.0, 2.0, 3.0, -0.0, -3.4e38, 0)
    third.view("<u4")[5] = ABSENT_BITS
    with Hook(server.ws_url) as hook:
        hook.call(hello("special-f32", params=NAMES))
        for i, values in enumerate((f32(*PARAM), second, third), start=1):
            hook.call(step(i, i, arrays={"grad_norm": values}, grad_status=[3, 3, 3, 1, 2, 2]))
        hook.call(close(4))
    neg_zero, big, low, tiny = 0x80000000, bits(3.4e38), bits(-3.4e38), 1
    with httpx.Client(base_url=server.url, timeout=30) as http:

        def both(**params: object) -> np.ndarray:
            url = "/api/runs/special-f32/heatmap"
            return assert_same_cells(
                http.get(url, params=params).json(), http.get(url, params={**params, "encoding": "f32"}).json()
            )

        assert both(metric="grad_norm").T.tolist() == [
            [NAN_BITS, bits(math.inf), bits(-math.inf), neg_zero, big, tiny],
            [NAN_BITS, NAN_BITS, NAN_BITS, EMPTY_BITS, EMPTY_BITS, EMPTY_BITS],
            [bits(1.0), bits(2.0), bits(3.0), neg_zero, low, EMPTY_BITS],
        ]
        assert both(metric="grad_norm", max_steps=2).T.tolist() == [  # steps 1 | 2-3
            [NAN_BITS, bits(math.inf), bits(-math.inf), neg_zero, big, tiny],
            [NAN_BITS, NAN_BITS, NAN_BITS, neg_zero, low, EMPTY_BITS],
        ]
        assert both(metric="grad_status", max_steps=2).view("<f4").T.tolist() == [[3, 3, 3, 1, 2, 2]] * 2

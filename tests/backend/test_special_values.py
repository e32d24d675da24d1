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

from conftest import ServerProcess
from jsonfloats import number
from wiremsg import Hook, close, f32, hello, step

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


def test_special_values_round_trip_everywhere(server: ServerProcess) -> None:
    with Hook(server.ws_url) as hook:
        hook.call(hello("special", params=NAMES))
        assert hook.call(step(1, 1, scalars=SCALARS, arrays={"grad_norm": f32(*PARAM)},
                              grad_status=[3, 3, 3, 1, 2, 2]))["type"] == "ack"
        hook.call(close(2))
    want = {k: number(v) for k, v in SCALARS.items()}
    with httpx.Client(base_url=server.url, timeout=30) as http:
        for key, value in want.items():  # JSON API, scalars
            got = http.get("/api/runs/special/series", params={"key": key}).json()["value"][0]
            assert same64(number(got), value), (key, got)
        series = http.get("/api/runs/special/params/series",
                          params={"metric": "grad_norm", "param": NAMES}).json()["series"]
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
        lines = [json.loads(line) for line in http.get("/api/runs/special/export", params={"format": "json"}).text.splitlines()]
        steps = [line for line in lines if line.get("type") == "step"]
        assert len(steps) == 1
        for key, value in want.items():
            assert same64(number(steps[0]["scalars"][key]), value), (key, steps[0]["scalars"][key])

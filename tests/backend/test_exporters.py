"""Export helpers: safe download names, CSV cells that cannot run as spreadsheet formulas, and a
step's values as CSV text."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from gradwatch_server.exporters import FIXED_METRICS, _text_column, csv_columns, safe_cell, safe_filename
from gradwatch_server.protocol import ABSENT_BITS
from gradwatch_server.store import Run

pytestmark = pytest.mark.unit

RUN = Run(
    id="abc",
    name="x",
    project="p",
    status="finished",
    created_at=0.0,
    updated_at=0.0,
    finished_at=None,
    last_seq=0,
    steps=0,
    last_step=None,
    param_count=0,
    param_numel=0,
    optimizer=None,
    config={},
    hook_version=None,
)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("lr3e-4", "lr3e-4.csv"),
        ('a"b\r\nc; filename=evil.sh', "a_b_c_filename_evil.sh.csv"),
        ("../../etc/passwd", "etc_passwd.csv"),
        ("日本語", "abc.csv"),
        ("...", "abc.csv"),
    ],
)
def test_safe_filename(name: str, expected: str) -> None:
    assert safe_filename(replace(RUN, name=name), "csv") == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("=SUM(A1)", "'=SUM(A1)"),
        ("+cmd", "'+cmd"),
        ("-x.weight", "'-x.weight"),
        ("@import", "'@import"),
        ("\tx", "'\tx"),
        ("-1.5", "-1.5"),
        ("-inf", "-inf"),
        ("+3", "+3"),
        ("layer.0.weight", "layer.0.weight"),
    ],
)
def test_safe_cell(text: str, expected: str) -> None:
    assert safe_cell(text) == expected


def test_csv_columns_put_the_contract_columns_first() -> None:
    assert csv_columns(["zeta", "grad_norm", "alpha"]) == ["step", "param", *FIXED_METRICS, "alpha", "zeta"]


def _absent(count: int) -> np.ndarray:
    return np.full(count, ABSENT_BITS, np.uint32).view(np.float32)


@pytest.mark.parametrize(
    "values",
    [
        np.ones(5, np.float32),  # one value across the step: written once
        np.array([0.0, -0.0, 0.0], np.float32),  # equal as numbers, not as text
        np.full(3, -0.0, np.float32),
        np.full(3, np.nan, np.float32),  # measured NaN: data
        _absent(4),  # no value: empty cells
        np.concatenate([_absent(1), np.ones(2, np.float32)]),
        np.array([0.1, 3e-8, np.inf, -np.inf, np.nan, 123456.79], np.float32),
        np.ones(1, np.float32),
    ],
)
def test_a_steps_values_are_written_as_each_one_alone_would_be(values: np.ndarray) -> None:
    """Each cell is numpy's shortest float32 text of its own value ('' for ABSENT), whether or
    not the step's values are all alike."""
    expected = ["" if int(v.view(np.uint32)) == ABSENT_BITS else str(v) for v in values]
    assert list(_text_column(values, len(values))) == expected


def test_the_server_imports_pyarrow_only_for_a_parquet_export() -> None:
    """pyarrow is heavy to import, and only the Parquet exports need it: a server's start must
    not import it. A fresh interpreter, as a server's start is."""
    code = (
        "import sys; import gradwatch_server.app, gradwatch_server.cli, gradwatch_server.step_table;"
        "print('pyarrow' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["False"]

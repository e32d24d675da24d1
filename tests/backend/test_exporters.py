"""Export helpers: safe download names, and CSV cells that cannot run as spreadsheet formulas."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gradwatch_server.exporters import FIXED_METRICS, csv_columns, safe_cell, safe_filename
from gradwatch_server.store import Run

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

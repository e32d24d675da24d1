"""The spool's framing: complete records read back exactly; a torn or corrupted tail is dropped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gradwatch.spool import SpoolWriter, frame, locked_elsewhere, pending_spools, read_records

pytestmark = pytest.mark.unit


def write(directory: Path, n: int) -> Path:
    w = SpoolWriter(directory, "run1", json.dumps({"type": "hello"}))
    for seq in range(1, n + 1):
        w.append(json.dumps({"type": "step", "seq": seq, "name": "ünïcode"}))
    w.close(delete=False)
    return w.path


def test_records_round_trip(tmp_path: Path) -> None:
    path = write(tmp_path, 5)
    records, report = read_records(path)
    got = [json.loads(r) for r in records]
    assert got[0] == {"type": "hello"} and [g["seq"] for g in got[1:]] == [1, 2, 3, 4, 5]
    assert got[1]["name"] == "ünïcode"
    assert report.records == 6 and report.torn is None


@pytest.mark.parametrize("cut", [1, 5, 11, 13])
def test_a_torn_tail_is_dropped_not_misread(tmp_path: Path, cut: int) -> None:
    path = write(tmp_path, 3)
    data = path.read_bytes()
    path.write_bytes(data[:-cut])  # a crash mid-write
    records, report = read_records(path)
    assert [json.loads(r).get("seq") for r in records] == [None, 1, 2]
    assert report.torn is not None


def test_a_corrupted_record_stops_the_read(tmp_path: Path) -> None:
    path = write(tmp_path, 3)
    data = bytearray(path.read_bytes())
    last = len(frame(json.dumps({"type": "step", "seq": 3, "name": "ünïcode"})))
    data[-last // 2] ^= 0xFF  # flip a byte inside the last record's payload
    path.write_bytes(bytes(data))
    records, report = read_records(path)
    assert len(list(records)) == 3 and "checksum" in (report.torn or "")


def test_a_live_run_holds_its_spool(tmp_path: Path) -> None:
    w = SpoolWriter(tmp_path, "live", "{}")
    assert locked_elsewhere(w.path) and pending_spools(tmp_path) == []
    w.close(delete=False)
    assert pending_spools(tmp_path) == [w.path]
    w2 = SpoolWriter(tmp_path, "done", "{}")
    w2.close(delete=True)
    assert not w2.path.exists()

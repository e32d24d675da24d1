"""The spool's framing: complete records read back exactly (JSON text, and binary step frames as
written or as the JSON they stand for); a torn or corrupted tail is dropped."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gradwatch import wire
from gradwatch.spool import SpoolWriter, frame, locked_elsewhere, pending_spools, read_payloads, read_records
from gradwatch_server.protocol import parse_binary, parse_message

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


def binary_step(seq: int) -> bytes:
    grads = np.array([0.5, float(seq), np.nan], dtype=np.float32)
    status = np.array([2, 2, 3], dtype=np.uint8)
    return wire.binary_steps(
        seq, [wire.UnsentStep(seq, 1.7e9 + seq, {"loss": 1.0 / seq}, {"grad_norm": grads}, status)]
    )


@pytest.mark.parametrize("cut", [0, 3, 20])
def test_binary_step_frames_read_back_as_written_or_as_their_json(tmp_path: Path, cut: int) -> None:
    """A binary frame keeps its bytes (`read_payloads`) and reads as the JSON message it stands
    for (`read_records`, which the server parses to the same step); JSON records between them
    stay text; a torn binary tail is dropped like a JSON one."""
    w = SpoolWriter(tmp_path, "mixed", json.dumps({"type": "hello"}))
    frames = [binary_step(1), binary_step(3)]
    w.append(frames[0])
    w.append(json.dumps({"type": "step", "seq": 2}))
    w.append(frames[1])
    w.close(delete=False)
    if cut:
        w.path.write_bytes(w.path.read_bytes()[:-cut])
    payloads, report = read_payloads(w.path)
    expected = [json.dumps({"type": "hello"}), frames[0], json.dumps({"type": "step", "seq": 2}), frames[1]]
    assert list(payloads) == expected[: 3 if cut else 4]
    assert (report.torn is not None) == bool(cut)
    texts = list(read_records(w.path)[0])
    assert all(isinstance(t, str) for t in texts) and len(texts) == (3 if cut else 4)
    assert json.loads(texts[1]) == wire.binary_as_json(frames[0])
    as_text, as_frame = parse_message(texts[1], 3), parse_binary(frames[0], 3)
    assert as_text.model_dump(exclude={"v"}) == as_frame.model_dump(exclude={"v"})  # v: 1 and 3
    assert [wire.seq_of(p) for p in expected] == [0, 1, 2, 3]

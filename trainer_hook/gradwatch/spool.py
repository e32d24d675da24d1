"""The spool: every message a run sends, written ahead to disk, so a server that is down, a
killed server or a killed training process loses nothing that was serialized.

One file per run, `<GRADWATCH_SPOOL>/<run id>.spool` (default `~/.gradwatch/spool`). The first
record is the run's `hello`, then every message in `seq` order. A record is framed as

    magic (4 bytes) | length (uint32 LE) | CRC-32 of the payload (uint32 LE) | payload

where the magic says what the payload is: b"GWS1" a message as UTF-8 JSON; b"GWB1" a step
message as its binary frame (protocol v3, `wire.binary_steps`), kept as the sender made it for
the server instead of serialized again as JSON (added later: older spools have none, and an
older hook reads one as a torn tail; docs/protocol.md). A tail torn by a crash mid-write is
detected (short frame or bad checksum) and dropped, never misread. The writer holds an exclusive `flock` on the file while its run is alive; replay
(replay.py) claims a file with the same lock, so it skips live runs and one replayer sends a file
at a time. A file is deleted once the server has acknowledged everything in it.

This module is the file format and its locking only, and needs no torch. Where `fcntl` is missing
(Windows) the files cannot be locked, so no run spools there: `SpoolWriter` refuses with an
OSError that says why, and the watcher keeps unsent data in memory only.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import zlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Optional, Union

from . import wire

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger("gradwatch")

MAGIC = b"GWS1"
#: a record whose payload is a binary step frame (protocol v3), not JSON text
BINARY_MAGIC = b"GWB1"
_HEADER = struct.Struct("<4sII")
SUFFIX = ".spool"


def spool_dir(env: Mapping[str, str] = os.environ) -> Path:
    return Path(env.get("GRADWATCH_SPOOL") or Path.home() / ".gradwatch" / "spool")


#: A record's payload: a message's JSON text, or a step message's binary frame.
Payload = Union[str, bytes]


def frame(payload: Payload) -> bytes:
    return b"".join(_framed(payload))


def _framed(payload: Payload) -> tuple[bytes, bytes]:
    """A record's header and its payload's bytes."""
    if isinstance(payload, bytes):
        return _HEADER.pack(BINARY_MAGIC, len(payload), zlib.crc32(payload)), payload
    data = payload.encode("utf-8")
    return _HEADER.pack(MAGIC, len(data), zlib.crc32(data)), data


def as_json(payload: Payload) -> str:
    """A record's message as JSON text (a binary step frame as the JSON message it stands for)."""
    return payload if isinstance(payload, str) else wire.dumps(wire.binary_as_json(payload))


class SpoolWriter:
    """Append-only, locked spool file of one run (used by the sender thread only)."""

    def __init__(self, directory: Path, run_id: str, hello: str) -> None:
        if fcntl is None:
            raise OSError("spool files need file locking (fcntl), which this platform lacks")
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"{run_id}{SUFFIX}"
        self._file: IO[bytes] = open(self.path, "ab")
        fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self._file.write(frame(hello))
        self._file.flush()

    def append(self, payload: Payload) -> None:
        for part in _framed(payload):  # `frame`'s bytes, without copying the payload into them
            self._file.write(part)

    def flush(self) -> None:
        """Hand buffered records to the OS: they survive the process being killed from here on."""
        self._file.flush()

    def records(self) -> Iterator[str]:
        """Every complete record written so far (the hello first), as JSON text."""
        self.flush()
        return read_records(self.path)[0]

    def payloads(self) -> Iterator[Payload]:
        """Every complete record written so far (the hello first), as written."""
        self.flush()
        return read_payloads(self.path)[0]

    def close(self, delete: bool) -> None:
        self._file.flush()
        if delete:
            self.path.unlink(missing_ok=True)
        self._file.close()  # releases the lock


def read_records(path: Path) -> tuple[Iterator[str], TailReport]:
    """Iterate a spool's complete records as JSON text (`as_json`); the report says afterwards
    whether a torn tail was dropped."""
    payloads, report = read_payloads(path)
    return map(as_json, payloads), report


def read_payloads(path: Path) -> tuple[Iterator[Payload], TailReport]:
    """Iterate a spool's complete records as written: JSON text, or a binary step frame (bytes);
    the report says afterwards whether a torn tail was dropped."""
    report = TailReport()

    def gen() -> Iterator[Payload]:
        with open(path, "rb") as f:
            while True:
                header = f.read(_HEADER.size)
                if not header:
                    return
                if len(header) < _HEADER.size:
                    report.torn = f"a {len(header)}-byte partial header"
                    return
                magic, length, crc = _HEADER.unpack(header)
                if magic not in (MAGIC, BINARY_MAGIC):
                    report.torn = "a frame without the spool's magic bytes"
                    return
                data = f.read(length)
                if len(data) < length or zlib.crc32(data) != crc:
                    report.torn = "a record cut short or failing its checksum"
                    return
                report.records += 1
                yield data if magic == BINARY_MAGIC else data.decode("utf-8")

    return gen(), report


class TailReport:
    def __init__(self) -> None:
        self.records = 0
        self.torn: Optional[str] = None


def locked_elsewhere(path: Path) -> bool:
    """True while a live run (or a replay) holds the file."""
    with claim(path) as claimed:
        return not claimed


@contextlib.contextmanager
def claim(path: Path) -> Iterator[bool]:
    """Hold the file's lock for a replay: yields False when a live run or another replay holds it,
    or when it is gone (delivered meanwhile by another process)."""
    if fcntl is None:
        yield False
        return
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        yield False
        return
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True  # closing the file releases the lock


def pending_spools(directory: Path) -> list[Path]:
    """Spool files no live run holds, oldest first."""
    stamped = []
    for path in directory.glob(f"*{SUFFIX}") if directory.is_dir() else ():
        try:
            stamped.append((path.stat().st_mtime, path))
        except FileNotFoundError:  # delivered and deleted meanwhile by another process
            continue
    return [p for _, p in sorted(stamped) if not locked_elsewhere(p)]

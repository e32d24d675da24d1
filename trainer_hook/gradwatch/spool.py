"""The spool: every message a run sends, written ahead to disk, so a server that is down, a
killed server or a killed training process loses nothing that was serialized.

One file per run, `<GRADWATCH_SPOOL>/<run id>.spool` (default `~/.gradwatch/spool`). The first
record is the run's `hello`, then every message in `seq` order. A record is framed as

    b"GWS1" | length (uint32 LE) | CRC-32 of the payload (uint32 LE) | payload (UTF-8 JSON)

so a tail torn by a crash mid-write is detected (short frame or bad checksum) and dropped, never
misread. The writer holds an exclusive `flock` on the file while its run is alive; replay skips
locked files. A file is deleted once the server has acknowledged everything in it.

This module needs no torch: `gradwatch sync` (the server's CLI) uses it too.
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import struct
import zlib
from pathlib import Path
from typing import IO, Optional
from collections.abc import Iterator, Mapping

log = logging.getLogger("gradwatch")

MAGIC = b"GWS1"
_HEADER = struct.Struct("<4sII")
SUFFIX = ".spool"


def spool_dir(env: Mapping[str, str] = os.environ) -> Path:
    return Path(env.get("GRADWATCH_SPOOL") or Path.home() / ".gradwatch" / "spool")


def frame(payload: str) -> bytes:
    data = payload.encode("utf-8")
    return _HEADER.pack(MAGIC, len(data), zlib.crc32(data)) + data


class SpoolWriter:
    """Append-only, locked spool file of one run (used by the sender thread only)."""

    def __init__(self, directory: Path, run_id: str, hello: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"{run_id}{SUFFIX}"
        self._file: IO[bytes] = open(self.path, "ab")
        fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self._file.write(frame(hello))
        self._file.flush()

    def append(self, payload: str) -> None:
        self._file.write(frame(payload))

    def flush(self) -> None:
        """Hand buffered records to the OS: they survive the process being killed from here on."""
        self._file.flush()

    def records(self) -> Iterator[str]:
        """Every complete record written so far (the hello first)."""
        self.flush()
        return read_records(self.path)[0]

    def close(self, delete: bool) -> None:
        self._file.flush()
        if delete:
            self.path.unlink(missing_ok=True)
        self._file.close()  # releases the lock


def read_records(path: Path) -> tuple[Iterator[str], TailReport]:
    """Iterate a spool's complete records; the report says afterwards whether a torn tail was dropped."""
    report = TailReport()

    def gen() -> Iterator[str]:
        with open(path, "rb") as f:
            while True:
                header = f.read(_HEADER.size)
                if not header:
                    return
                if len(header) < _HEADER.size:
                    report.torn = f"a {len(header)}-byte partial header"
                    return
                magic, length, crc = _HEADER.unpack(header)
                if magic != MAGIC:
                    report.torn = "a frame without the spool's magic bytes"
                    return
                data = f.read(length)
                if len(data) < length or zlib.crc32(data) != crc:
                    report.torn = "a record cut short or failing its checksum"
                    return
                report.records += 1
                yield data.decode("utf-8")

    return gen(), report


class TailReport:
    def __init__(self) -> None:
        self.records = 0
        self.torn: Optional[str] = None


def locked_elsewhere(path: Path) -> bool:
    """True while a live run holds the file (its writer's flock)."""
    try:
        with open(path, "rb") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(f, fcntl.LOCK_UN)
            return False
    except FileNotFoundError:
        return True


def pending_spools(directory: Path) -> list[Path]:
    """Spool files no live run holds, oldest first."""
    stamped = []
    for path in directory.glob(f"*{SUFFIX}") if directory.is_dir() else ():
        try:
            stamped.append((path.stat().st_mtime, path))
        except FileNotFoundError:  # delivered and deleted meanwhile by another process
            continue
    return [p for _, p in sorted(stamped) if not locked_elsewhere(p)]


def replay(path: Path, ws_url: str, token: Optional[str] = None, timeout: float = 30.0) -> tuple[int, Optional[str]]:
    """Send one spool file to a server and delete it once everything is acknowledged.

    Returns (messages the server had not acknowledged before, torn-tail description or None).
    Raises OSError/ConnectionError when the server cannot be reached or refuses the run.
    """
    try:
        guard = open(path, "rb")
    except FileNotFoundError:  # another process delivered it meanwhile
        return 0, None
    with guard:
        try:  # one replayer at a time, and never a file whose run is still alive
            fcntl.flock(guard, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return 0, None
        return _replay_locked(path, ws_url, token, timeout)


def _replay_locked(path: Path, ws_url: str, token: Optional[str], timeout: float) -> tuple[int, Optional[str]]:
    from websockets.sync.client import connect

    records, report = read_records(path)
    hello_text = next(records, None)
    if hello_text is None:
        path.unlink(missing_ok=True)
        return 0, report.torn
    headers = {"Authorization": f"Bearer {token}"} if token else None
    sent = last = 0
    with connect(ws_url, additional_headers=headers, open_timeout=10, close_timeout=2,
                 max_size=16 << 20, compression=None) as ws:
        ws.send(hello_text)
        welcome = json.loads(ws.recv(timeout=timeout))
        if welcome.get("type") != "welcome":
            raise ConnectionError(f"the server refused the spooled run {path.stem}: {welcome.get('message', welcome)}")
        acked = int(welcome.get("last_seq", 0))
        for text in records:
            seq = int(json.loads(text)["seq"])
            last = max(last, seq)
            if seq > acked:
                ws.send(text)
                sent += 1
        while acked < last:
            reply = json.loads(ws.recv(timeout=timeout))
            if reply.get("type") == "ack":
                acked = int(reply["seq"])
            elif reply.get("type") == "error":
                raise ConnectionError(f"the server refused a spooled message of {path.stem}: {reply.get('message')}")
    path.unlink(missing_ok=True)
    if report.torn:
        log.warning("gradwatch: %s ended in %s; the %d complete records before it were replayed",
                    path.name, report.torn, report.records)
    return sent, report.torn

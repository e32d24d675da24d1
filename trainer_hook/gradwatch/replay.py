"""Spool replay: deliver what earlier runs left in the spool (their server was away, their process
was killed) and delete each file once the server has acknowledged everything in it.

It speaks through the hook's one protocol client (connection.py): the same handshake as the live
sender, so the server's `last_seq` in its welcome says what it already has, and only the rest is
sent. `watch()` replays in the background; `python -m gradwatch sync` (`__main__.py`) by hand.
Needs no torch.
"""
from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection

from .connection import Refused, closed, handshake, replies
from .spool import claim, read_records

log = logging.getLogger("gradwatch")


@dataclass(frozen=True)
class Delivery:
    """What replaying one spool file did."""

    run_id: str
    #: messages sent: those the server had not acknowledged before
    sent: int = 0
    #: what was dropped at the file's end (a torn or corrupted record), if anything
    torn: Optional[str] = None
    #: False when a live run or another replay held the file: nothing was sent
    claimed: bool = True


def replay(path: Path, ws_url: str, token: Optional[str] = None, timeout: float = 30.0) -> Delivery:
    """Send one spool file to the server at `ws_url` and delete it once everything is acknowledged.

    Raises `connection.Refused` when the server refuses the run or one of its messages (the token,
    the protocol version), OSError/TimeoutError when it cannot be reached or stops answering; the
    file then stays for the next try.
    """
    with claim(path) as claimed:
        if not claimed:
            return Delivery(path.stem, claimed=False)
        return _deliver(path, ws_url, token, timeout)


def _deliver(path: Path, ws_url: str, token: Optional[str], timeout: float) -> Delivery:
    records, report = read_records(path)
    hello = next(records, None)
    if hello is None:  # torn before its hello was complete: nothing to deliver
        path.unlink(missing_ok=True)
        return Delivery(path.stem, torn=report.torn)
    sent = last = 0
    with contextlib.ExitStack() as scope:
        ws, welcome = handshake(ws_url, hello, token, scope, open_timeout=10, welcome_timeout=timeout,
                                send_timeout=timeout)
        acked = int(welcome.get("last_seq", 0))
        try:
            for text in records:
                seq = int(json.loads(text)["seq"])
                last = max(last, seq)
                if seq > acked:
                    ws.send(text)
                    sent += 1
            while acked < last:
                acked = _wait_acks(ws, acked, timeout, path.stem)
        except ConnectionClosed as exc:
            raise closed(exc, "the server closed the connection before acknowledging everything") from None
    path.unlink(missing_ok=True)
    if report.torn:
        log.warning("gradwatch: %s ended in %s; the %d complete records before it were replayed",
                    path.name, report.torn, report.records)
    return Delivery(path.stem, sent, report.torn)


def _wait_acks(ws: ClientConnection, acked: int, timeout: float, run_id: str) -> int:
    """Read the replies that come within `timeout`; returns the highest seq acknowledged."""
    answered = False
    for reply in replies(ws, timeout):
        answered = True
        if reply.get("type") == "ack":
            acked = max(acked, int(reply["seq"]))
        elif reply.get("type") == "error":
            raise Refused(f"the server refused a spooled message of run {run_id}: {reply.get('message')}")
    if not answered:
        raise TimeoutError(f"the server acknowledged nothing for {timeout:g} s")
    return acked

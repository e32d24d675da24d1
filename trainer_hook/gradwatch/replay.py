"""Spool replay: deliver what earlier runs left in the spool (their server was away, their process
was killed) and delete each file once the server has acknowledged everything in it.

It speaks through the hook's one protocol client (connection.py): the same handshake as the live
sender, so the server's `last_seq` in its welcome says what it already has, and only the rest is
sent. `watch()` replays in the background; `python -m gradwatch sync` (`__main__.py`) by hand.
Needs no torch.

A file that can never be delivered (the server refuses one of its messages as invalid, or a
record in it is not a message with a `seq`) is moved aside to `<name>.rejected`, never deleted,
so that no later replay sends it again and again; a refused token or an unreachable server
leaves the file where it is, for the next try.
"""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn, Optional

from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection

from .connection import CLOSE_INVALID, CLOSE_POLICY, CLOSE_TOO_BIG, Refused, closed, handshake, replies
from .spool import Payload, as_json, claim, read_payloads
from .wire import binary_header, reads_binary

#: What a moved-aside spool file's name ends with (after `.spool`: replay never lists it again).
REJECTED = ".rejected"
#: Close codes that refuse a message itself: sending it again would fail the same way.
_MESSAGE_REFUSED = (CLOSE_INVALID, CLOSE_TOO_BIG)

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


class Rejected(Refused):
    """The server refused a message of the spool file, or a record in it cannot be read: the file
    was moved aside to `moved` (never deleted), since sending it again would fail the same way."""

    def __init__(self, reason: str, moved: Path) -> None:
        super().__init__(f"{reason}; the file was moved aside to {moved}")
        self.reason, self.moved = reason, moved


class _Unsendable(Exception):
    """Why a spool file can never be delivered; `replay` moves it aside."""


class _ErrorReply(Exception):
    """The server answered a spooled message with an `error` reply (its message)."""


def replay(path: Path, ws_url: str, token: Optional[str] = None, timeout: float = 30.0) -> Delivery:
    """Send one spool file to the server at `ws_url` and delete it once everything is acknowledged.

    Raises `Rejected` (after moving the file aside) when the server refuses one of its messages
    or a record cannot be read; `connection.Refused` when the server refuses the connection (the
    token, the hello's protocol version) and OSError/TimeoutError when it cannot be reached or
    stops answering: the file then stays for the next try.
    """
    with claim(path) as claimed:
        if not claimed:
            return Delivery(path.stem, claimed=False)
        try:
            return _deliver(path, ws_url, token, timeout)
        except _Unsendable as exc:
            raise Rejected(str(exc), _move_aside(path)) from None


def _move_aside(path: Path) -> Path:
    """Rename `path` to `<name>.rejected` (`<name>.N.rejected` if that exists); returns the new path."""
    target, n = path.with_name(path.name + REJECTED), 1
    while target.exists():
        target, n = path.with_name(f"{path.name}.{n}{REJECTED}"), n + 1
    path.rename(target)
    return target


def _seq(payload: Payload, number: int) -> int:
    """The `seq` of a spooled message; _Unsendable when the record is not a message with one."""
    try:
        seq = (binary_header(payload) if isinstance(payload, bytes) else json.loads(payload))["seq"]
        if isinstance(seq, bool) or not isinstance(seq, int):
            raise TypeError(f"seq {seq!r} is not an integer")
        return seq
    except (ValueError, KeyError, TypeError) as exc:
        raise _Unsendable(f"record {number} is not a message with a seq ({type(exc).__name__}: {exc})") from None


def _check_hello(text: Payload) -> str:
    """The hello, the first record; _Unsendable when it is not one."""
    if isinstance(text, bytes):
        raise _Unsendable("its first record is not a hello (a binary frame)")
    try:
        message = json.loads(text)
    except ValueError as exc:
        raise _Unsendable(f"its first record is not a hello (ValueError: {exc})") from None
    if not isinstance(message, dict) or message.get("type") != "hello":
        raise _Unsendable("its first record is not a hello")
    return text


def _deliver(path: Path, ws_url: str, token: Optional[str], timeout: float) -> Delivery:
    records, report = read_payloads(path)
    try:
        hello = next(records, None)
    except UnicodeDecodeError as exc:
        raise _Unsendable(f"its first record is not text ({exc})") from None
    if hello is None:  # torn before its hello was complete: nothing to deliver
        path.unlink(missing_ok=True)
        return Delivery(path.stem, torn=report.torn)
    hello = _check_hello(hello)
    sent = last = 0
    with contextlib.ExitStack() as scope:
        ws, welcome = handshake(
            ws_url, hello, token, scope, open_timeout=10, welcome_timeout=timeout, send_timeout=timeout
        )
        acked = int(welcome.get("last_seq", 0))
        binary = reads_binary(welcome)
        number = 1
        try:
            try:
                for number, payload in enumerate(records, 2):
                    seq = _seq(payload, number)
                    last = max(last, seq)
                    if seq > acked:  # a binary step frame as JSON to a server that does not read them
                        ws.send(payload if binary else as_json(payload))
                        sent += 1
            except UnicodeDecodeError as exc:
                raise _Unsendable(f"record {number + 1} is not text ({exc})") from None
            while acked < last:
                acked = _wait_acks(ws, acked, timeout)
        except _ErrorReply as exc:
            _refused_message(ws, f"the server refused a spooled message of run {path.stem}: {exc}")
        except ConnectionClosed as exc:
            if exc.rcvd is not None and exc.rcvd.code in _MESSAGE_REFUSED:
                raise _Unsendable(
                    f"the server refused a spooled message of run {path.stem} ({exc.rcvd.reason or exc.rcvd.code})"
                ) from None
            raise closed(exc, "the server closed the connection before acknowledging everything") from None
    path.unlink(missing_ok=True)
    if report.torn:
        log.warning(
            "gradwatch: %s ended in %s; the %d complete records before it were replayed",
            path.name,
            report.torn,
            report.records,
        )
    return Delivery(path.stem, sent, report.torn)


def _refused_message(ws: ClientConnection, why: str) -> NoReturn:
    """After an error reply, the close that follows says whose fault it was: the message's (the
    file is unsendable), the token's (Refused) or the server's (ConnectionError: try again)."""
    code = None
    try:
        while True:
            ws.recv(timeout=5.0)
    except ConnectionClosed as exc:
        code = exc.rcvd.code if exc.rcvd is not None else None
    except TimeoutError:
        pass
    if code == CLOSE_POLICY:
        raise Refused(why)
    if code is not None and code not in _MESSAGE_REFUSED:
        raise ConnectionError(f"{why} (close code {code}: the server's fault; the file stays for the next try)")
    raise _Unsendable(why)


def _wait_acks(ws: ClientConnection, acked: int, timeout: float) -> int:
    """Read the replies that come within `timeout`; returns the highest seq acknowledged. A close
    right after replies is read at the next call (the acks before it count: a server may close
    once it has acknowledged the run's `close`)."""
    answered = False
    try:
        for reply in replies(ws, timeout):
            answered = True
            if reply.get("type") == "ack":
                acked = max(acked, int(reply["seq"]))
            elif reply.get("type") == "error":
                raise _ErrorReply(str(reply.get("message")))
    except ConnectionClosed:
        if not answered:
            raise
    if not answered:
        raise TimeoutError(f"the server acknowledged nothing for {timeout:g} s")
    return acked

"""Read back what a Watcher queued for the server (its unacknowledged messages), decoded."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import numpy as np

from gradwatch import Watcher
from gradwatch.sender import Sender
from gradwatch.wire import ABSENT_BITS, binary_as_json
from support.wiresteps import split


def decode(b64: str, dtype: str = "<f4") -> list[float | None]:
    raw = np.frombuffer(base64.b64decode(b64), dtype=dtype)
    if dtype == "<f4":
        absent = raw.view("<u4") == ABSENT_BITS
        return [None if a else float(v) for v, a in zip(raw, absent)]
    return raw.tolist()


def wait_serialized(sender: Sender, timeout: float) -> bool:
    """Wait until every message submitted to `sender` is serialized (in its `_unacked`, sent or
    kept for resending); False if it is not within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while sender._serialized < sender._submitted and time.monotonic() < deadline:
        time.sleep(0.005)
    return sender._serialized >= sender._submitted


def sent_steps(w: Watcher, timeout: float = 5.0) -> list[dict[str, Any]]:
    """Step messages with per-parameter arrays decoded, keyed by parameter name (the steps the
    flight recorder holds, with every=N or "auto", are handed to the sender first)."""
    w._rounds._flush_recorder()
    assert wait_serialized(w._sender, timeout), "the sender thread did not serialize in time"
    names = [p.name for p in w.layout.params]
    out = []
    for _, payload in list(w._sender._unacked):  # JSON text, or a binary step frame (protocol v3)
        for msg in split(json.loads(payload) if isinstance(payload, str) else binary_as_json(payload)):
            msg["params"] = {k: dict(zip(names, decode(v))) for k, v in msg["params"].items()}
            if "grad_status" in msg:
                msg["grad_status"] = dict(zip(names, decode(msg["grad_status"], "u1")))
            out.append(msg)
    return out


def measured(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The steps whose tensors were measured (not only their cheap facts, nor the gradient norms
    the flight recorder sends around an incident, which come without `grad_status`)."""
    return [m for m in steps if "grad_norm" in m["params"] and "grad_status" in m]

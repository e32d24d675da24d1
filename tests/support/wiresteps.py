"""Messages as steps: the `step` messages a `step` or `steps` message (protocol v1) stands for."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable
from typing import Any


def split(msg: dict[str, Any]) -> list[dict[str, Any]]:
    """The `step` messages a `step` or `steps` message stands for (arrays still base64)."""
    if msg["type"] == "step":
        return [msg]
    if msg["type"] != "steps":
        return []
    k = len(msg["step"])

    def rows(b64: str) -> list[str]:
        raw = base64.b64decode(b64)
        width = len(raw) // k
        return [base64.b64encode(raw[i * width : (i + 1) * width]).decode() for i in range(k)]

    params = {m: rows(v) for m, v in msg["params"].items()}
    status = rows(msg["grad_status"]) if "grad_status" in msg else None
    return [
        {
            "v": msg["v"],
            "type": "step",
            "seq": msg["seq"],
            "step": step,
            "time": msg["time"][i],
            "scalars": {key: values[i] for key, values in msg["scalars"].items()},
            "params": {m: r[i] for m, r in params.items()},
            **({} if status is None else {"grad_status": status[i]}),
            **({"grad_digest": msg["grad_digest"][i]} if "grad_digest" in msg else {}),
        }
        for i, step in enumerate(msg["step"])
    ]


def spooled_steps(records: Iterable[str]) -> list[int]:
    """The steps of spooled (or sent) message texts, in order."""
    return [m["step"] for text in records for m in split(json.loads(text))]

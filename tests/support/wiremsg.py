"""Hand-built wire protocol v1 messages and a small websocket hook for the backend tests.

Deliberately independent of the `gradwatch` hook: these tests check the server against
docs/protocol.md, not against the hook's own encoder.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

ABSENT_BITS = 0x7FDEAD00
ABSENT = np.array([ABSENT_BITS], dtype="<u4").view("<f4")[0]


def f32(*values: float) -> np.ndarray:
    return np.array(values, dtype="<f4")


def with_absent(values: np.ndarray, *indices: int) -> np.ndarray:
    out = values.astype("<f4").copy()
    out.view("<u4")[list(indices)] = ABSENT_BITS
    return out


def b64(array: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(array).tobytes()).decode("ascii")


def hello(run_id: str, params: Sequence[str] = ("fc.weight", "fc.bias"), **run: Any) -> dict[str, Any]:
    return {
        "v": 1,
        "type": "hello",
        "run": {
            "id": run_id,
            "name": run.pop("name", run_id),
            "project": run.pop("project", "tests"),
            "started_at": run.pop("started_at", 1_700_000_000.0),
            "hook_version": "0.1.0",
            "optimizer": "AdamW",
            "config": {"every": 1},
            **run,
        },
        "params": [
            {
                "name": n,
                "shape": [2, 3] if n.endswith("weight") else [3],
                "numel": 6 if n.endswith("weight") else 3,
                "dtype": "float32",
                "group": 0,
                "optimizer": 0,
            }
            for n in params
        ],
        "groups": [{"optimizer": 0, "index": 0, "name": None, "hparams": {"lr": 0.001, "betas": [0.9, 0.999]}}],
    }


def rank_hello(
    job: str,
    rank: int,
    world_size: int,
    params: Sequence[str] = ("fc.weight", "fc.bias"),
    *,
    local_numel: Sequence[int] | None = None,
    counted: Sequence[bool] | None = None,
    **run: Any,
) -> dict[str, Any]:
    """The hello of rank `rank` of a distributed job (docs/protocol.md, "Distributed training"):
    run id `JOB.rRANK`, the `dist` object, and each parameter's piece where given."""
    message = hello(f"{job}.r{rank}", params, **{"name": job, **run})
    message["dist"] = {"job": job, "rank": rank, "world_size": world_size}
    for i, p in enumerate(message["params"]):
        if local_numel is not None:
            p["local_numel"] = local_numel[i]
        if counted is not None:
            p["counted"] = counted[i]
    return message


def step(
    seq: int,
    step_index: int,
    *,
    scalars: Mapping[str, float | str] | None = None,
    arrays: Mapping[str, np.ndarray] | None = None,
    grad_status: Sequence[int] | None = None,
    time: float | None = None,
) -> dict[str, Any]:
    message: dict[str, Any] = {
        "v": 1,
        "type": "step",
        "seq": seq,
        "step": step_index,
        "time": 1_700_000_000.0 + step_index if time is None else time,
        "scalars": dict(scalars or {}),
        "params": {k: b64(v.astype("<f4")) for k, v in (arrays or {}).items()},
    }
    if grad_status is not None:
        message["grad_status"] = b64(np.array(grad_status, dtype="u1"))
    return message


def close(seq: int) -> dict[str, Any]:
    return {"v": 1, "type": "close", "seq": seq, "status": "finished"}


class Hook:
    """A websocket client speaking the protocol by hand; use it as a context manager."""

    def __init__(self, ws_url: str, token: str | None = None) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else None
        self._connect = connect(
            f"{ws_url}/ws/ingest", additional_headers=headers, open_timeout=10, close_timeout=5, max_size=None
        )
        self.ws: ClientConnection
        self.findings: list[dict[str, Any]] = []
        self.costs: list[float] = []
        self.paces: list[float] = []

    def __enter__(self) -> Hook:
        self.ws = self._connect.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._connect.__exit__(None, None, None)

    def send(self, message: Mapping[str, Any] | str | bytes) -> None:
        self.ws.send(message if isinstance(message, (str, bytes)) else json.dumps(message, allow_nan=False))

    def recv(self, timeout: float = 10) -> dict[str, Any]:
        """The next reply; `finding` frames (diagnostics, sent ahead of acks) go to `self.findings`,
        `pace` frames (a browser opened the run) to `self.paces`, and an ack's `cpu_per_step` (the
        server's cost, which comes once the server has stored for a few seconds: cost.py) to
        `self.costs`, so that replies compare equal whatever the timing."""
        while True:
            frame = json.loads(self.ws.recv(timeout))
            if "cpu_per_step" in frame:
                self.costs.append(frame.pop("cpu_per_step"))
            if frame.get("type") == "finding":
                self.findings.append(frame["finding"])
            elif frame.get("type") == "pace":
                self.paces.append(frame["linger"])
            else:
                return frame

    def call(self, message: Mapping[str, Any] | str | bytes) -> dict[str, Any]:
        self.send(message)
        return self.recv()

    def refused(self, timeout: float = 10) -> tuple[int | None, str, str | None]:
        """Read until the server closes: (close code, close reason, text of its error frame)."""
        error = None
        try:
            while True:
                frame = json.loads(self.ws.recv(timeout))
                if frame.get("type") == "error":
                    error = frame["message"]
        except ConnectionClosed as closed:
            rcvd = closed.rcvd
            return (rcvd.code if rcvd else None), (rcvd.reason if rcvd else ""), error


def steps(
    seq: int,
    step_indices: Sequence[int],
    *,
    scalars: Mapping[str, Sequence[float | str]] | None = None,
    arrays: Mapping[str, np.ndarray] | None = None,
    grad_status: Sequence[Sequence[int]] | None = None,
    times: Sequence[float] | None = None,
) -> dict[str, Any]:
    """A `steps` message; each array in `arrays` is steps x parameters."""
    message: dict[str, Any] = {
        "v": 1,
        "type": "steps",
        "seq": seq,
        "step": list(step_indices),
        "time": list(times) if times is not None else [1700000000.0 + s for s in step_indices],
        "scalars": {k: list(v) for k, v in (scalars or {}).items()},
        "params": {k: b64(np.asarray(v, dtype="<f4")) for k, v in (arrays or {}).items()},
    }
    if grad_status is not None:
        message["grad_status"] = b64(np.asarray(grad_status, dtype="u1"))
    return message


def binary(message: Mapping[str, Any], header: Mapping[str, Any] | None = None) -> bytes:
    """A `step` or `steps` message (as built here, arrays in base64) as a version 3 binary frame
    (docs/protocol.md): uint32 little-endian header length, the JSON header (the message with
    `params` the list of its metrics' names and `grad_status` true where sent, padded with spaces
    to a multiple of 8 bytes from the frame's start), then each array's raw bytes in that order.
    `header`: keys to put in (or over) the header, to build inconsistent frames."""
    arrays = [base64.b64decode(v) for v in message["params"].values()]
    head = {**message, "v": 3, "params": list(message["params"])}
    if "grad_status" in message:
        arrays.append(base64.b64decode(message["grad_status"]))
        head["grad_status"] = True
    text = json.dumps({**head, **(header or {})}, allow_nan=False).encode()
    text += b" " * (-(4 + len(text)) % 8)
    return len(text).to_bytes(4, "little") + text + b"".join(arrays)

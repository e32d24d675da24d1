"""Wire protocol v1 and v2, hook side: message builders (see docs/protocol.md).

The server's pydantic models in ``gradwatch_server.protocol`` are the one definition; a test
validates every message built here against them.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from collections.abc import KeysView, Mapping, Sequence
from typing import Any, NamedTuple, Optional

import numpy as np

PROTOCOL_VERSION = 1
#: v2: v1 plus a rank's hello naming its job's parameter list by digest (`rank_hellos`).
PROTOCOL_VERSION_2 = 2
#: v3: a `step`/`steps` message as a binary frame (`binary_steps`): sent only to a server whose
#: welcome lists 3 in its `versions` (`reads_binary`).
PROTOCOL_VERSION_3 = 3
#: A binary frame's arrays start at a multiple of this offset (its header is padded with spaces).
BINARY_ALIGN = 8

#: Bit pattern of the float32 NaN that means "does not apply" (no grad, no such state yet).
#: A quiet NaN that no hardware produces, so every other NaN stays a measured value.
ABSENT_BITS = 0x7FDEAD00

#: The scalar that marks a step sent again with arrays it was first sent without (the flight
#: recorder's, recorder.RESENT, and a replica's asked for by the server: protocol v2).
RESENT = "flight/resent"

GRAD_STATUS_NONE, GRAD_STATUS_ZERO, GRAD_STATUS_NONZERO, GRAD_STATUS_NONFINITE = 0, 1, 2, 3


def b64_array(values: np.ndarray) -> str:
    """Base64 of a little-endian array, the wire encoding of per-parameter values."""
    little = np.ascontiguousarray(values, dtype=values.dtype.newbyteorder("<"))
    return base64.b64encode(little.tobytes()).decode("ascii")


def json_scalar(value: float) -> float | str:
    """A float as standard JSON allows it: non-finite values become strings."""
    if math.isfinite(value):
        return value
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


def hello(
    run: Mapping[str, Any],
    params: Sequence[Mapping[str, Any]],
    groups: Sequence[Mapping[str, Any]],
    dist: Optional[Mapping[str, Any]] = None,
) -> dict[str, Any]:
    """`dist` (`{"job", "rank", "world_size"}`): this stream is one rank of a distributed job,
    whose `run["id"]` is then `f"{job}.r{rank}"`; a single-process run's hello has no `dist`."""
    message = {"v": PROTOCOL_VERSION, "type": "hello", "run": dict(run), "params": list(params), "groups": list(groups)}
    if dist is not None:
        message["dist"] = dict(dist)
    return message


def params_digest(params: Sequence[Mapping[str, Any]], groups: Sequence[Mapping[str, Any]]) -> str:
    """v2's `params_digest` of a hello's `params` and `groups`: SHA-256 of their canonical JSON
    (each parameter `[name, shape, numel, dtype, group, optimizer]` in order, each group
    `[optimizer, index, name, hparams]` by (optimizer, index); keys sorted, no spaces, ASCII).
    A rank's own pieces (`local_numel`, `counted`) are not part of it."""
    canon = {
        "params": [[p["name"], list(p["shape"]), p["numel"], p["dtype"], p["group"], p["optimizer"]] for p in params],
        "groups": [
            [g["optimizer"], g["index"], g.get("name"), dict(g.get("hparams") or {})]
            for g in sorted(groups, key=lambda g: (g["optimizer"], g["index"]))
        ],
    }
    text = json.dumps(canon, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


def rank_hellos(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The hellos a rank of a distributed job tries in turn, from its v1 `hello` (with `dist`):
    v2 naming the job's parameter list by digest (rank > 0: the list is usually there already),
    v2 with the list in full (a server that does not know the digest closes with
    CLOSE_NEED_PARAMS), and v1 as given (for a server older than v2). A hello without `dist` is
    tried as it is."""
    dist = message.get("dist")
    if dist is None:
        return [dict(message)]
    params = message["params"]
    groups = message.get("groups", [])
    job_wide = [{k: v for k, v in p.items() if k not in ("local_numel", "counted")} for p in params]
    counted = [bool(p.get("counted", True)) for p in params]
    local = [int(p.get("local_numel", p["numel"])) for p in params]
    pieces: dict[str, Any] = {
        "counted": counted[0] if counted and all(c == counted[0] for c in counted) else counted or True,
        "local_numel": None if all(n == p["numel"] for n, p in zip(local, params)) else local,
    }
    digest = params_digest(job_wide, groups)
    base = {k: v for k, v in message.items() if k not in ("params", "groups")}
    named = {**base, "v": PROTOCOL_VERSION_2, "params_digest": digest, "pieces": pieces}
    full = {**named, "params": job_wide, "groups": list(groups)}
    return ([named] if int(dist["rank"]) > 0 else []) + [full, dict(message)]


def is_replica(message: Mapping[str, Any]) -> bool:
    """Whether a rank's v1 `hello` is a DDP replica's: every piece the whole tensor and counted
    on another rank. Its measured steps may send their `grad_digest` (protocol v2) alone."""
    params = message.get("params") or []
    return (
        message.get("dist") is not None
        and int(message["dist"]["rank"]) > 0
        and bool(params)
        and all(not p.get("counted", True) and p.get("local_numel", p["numel"]) == p["numel"] for p in params)
    )


def grad_digest(grad_norm: np.ndarray | None, grad_status: np.ndarray | None) -> str:
    """What a replica sends for its grad_norm and grad_status (docs/protocol.md, version 2):
    BLAKE2b, 16 bytes, of the float32 grad_norm bytes, a 0xFF byte, the uint8 status bytes."""
    h = hashlib.blake2b(digest_size=16)
    h.update(b"" if grad_norm is None else np.ascontiguousarray(grad_norm, dtype="<f4").tobytes())
    h.update(b"\xff")
    h.update(b"" if grad_status is None else np.ascontiguousarray(grad_status, dtype=np.uint8).tobytes())
    return h.hexdigest()


#: Per-parameter norms of what every rank holding a parameter has a piece of (the server's
#: EVERY_RANK_NORMS): a replica's add nothing the server counts. Every other `<key>_norm` is of
#: optimizer state, which a sharded optimizer keeps on the parameter's owner rank only.
EVERY_RANK_NORMS = frozenset({"grad_norm", "param_norm", "update_norm", "param_before_norm"})


def digested(record: UnsentStep, state: bool = False) -> UnsentStep:
    """A replica's measured step as it sends it: its scalars and the `grad_digest` of its
    grad_norm and grad_status; of its per-parameter arrays, with `state` (its optimizer shards
    its state: ZeroRedundancyOptimizer), its optimizer-state norms, which the server takes from
    the owner rank; none otherwise (rank 0's state is every parameter's)."""
    digest = grad_digest(record.metrics.get("grad_norm"), record.grad_status)
    kept = {m: v for m, v in record.metrics.items() if state and m.endswith("_norm") and m not in EVERY_RANK_NORMS}
    return UnsentStep(record.step, record.time, record.scalars, kept, None, digest)


def step(
    seq: int,
    step_index: int,
    time: float,
    scalars: Mapping[str, float],
    metrics: Mapping[str, np.ndarray],
    grad_status: np.ndarray | None,
) -> dict[str, Any]:
    """A step; `grad_status` is None for a step whose gradients were not measured."""
    message = {
        "v": PROTOCOL_VERSION,
        "type": "step",
        "seq": seq,
        "step": step_index,
        "time": time,
        "scalars": {k: json_scalar(float(v)) for k, v in scalars.items()},
        "params": {k: b64_array(v.astype(np.float32, copy=False)) for k, v in metrics.items()},
    }
    if grad_status is not None:
        message["grad_status"] = b64_array(grad_status.astype(np.uint8, copy=False))
    return message


class UnsentStep(NamedTuple):
    """One step's data before it has a `seq` (the hook's; the server's stored step is its
    `StoredStep`): the sender sends consecutive unsent steps with the same keys as one `steps`
    message. A named tuple: the sender thread makes one per step, and a tuple is made in a
    fraction of a frozen dataclass's time."""

    step: int
    time: float
    scalars: Mapping[str, float]
    metrics: Mapping[str, np.ndarray]
    grad_status: Optional[np.ndarray]
    #: a replica's digest of its grad_norm and grad_status, sent instead of its arrays (`digested`)
    digest: Optional[str] = None

    def keys(self) -> tuple[KeysView[str], KeysView[str], bool, bool]:
        """What steps of one message share: equal (as sets: views, not copies) for such steps."""
        return self.scalars.keys(), self.metrics.keys(), self.grad_status is not None, self.digest is not None

    @property
    def nbytes(self) -> int:
        """About what it adds to a message (base64 arrays, scalars)."""
        arrays = sum([v.size for v in self.metrics.values()]) * 4 if self.metrics else 0
        if self.grad_status is not None:
            arrays += self.grad_status.size
        return arrays * 4 // 3 + 24 * len(self.scalars) + 32


def scalar_columns(records: Sequence[UnsentStep]) -> dict[str, list[float | str]]:
    """Each scalar of `records` (the first's keys) as a list over the steps, as JSON allows it
    (`json_scalar`: a column whose sum is finite has no value to change; `np.array` of the rows
    below, rather than `np.stack`, for the same reason: a few microseconds a step)."""
    columns: dict[str, list[float | str]] = {}
    for k in records[0].scalars:
        values = [float(r.scalars[k]) for r in records]
        columns[k] = list(values) if math.isfinite(sum(values)) else [json_scalar(v) for v in values]
    return columns


def steps(seq: int, records: Sequence[UnsentStep]) -> dict[str, Any]:
    """One message for `records` (same keys, increasing steps): a `step` for one, else `steps`,
    column by column: each scalar a list, each per-parameter metric one steps x parameters array."""
    first = records[0]
    if len(records) == 1:
        message = step(seq, first.step, first.time, first.scalars, first.metrics, first.grad_status)
        if first.digest is not None:
            message.update(v=PROTOCOL_VERSION_2, grad_digest=first.digest)
        return message
    message = {
        "v": PROTOCOL_VERSION,
        "type": "steps",
        "seq": seq,
        "step": [r.step for r in records],
        "time": [r.time for r in records],
        "scalars": scalar_columns(records),
        "params": {k: b64_array(np.array([r.metrics[k] for r in records], dtype=np.float32)) for k in first.metrics},
    }
    if first.grad_status is not None:
        message["grad_status"] = b64_array(
            np.array([r.grad_status for r in records if r.grad_status is not None], dtype=np.uint8)
        )
    if first.digest is not None:
        message.update(v=PROTOCOL_VERSION_2, grad_digest=[r.digest for r in records])
    return message


def reads_binary(welcome: Mapping[str, Any]) -> bool:
    """Whether the server that sent this welcome reads binary step frames (version 3)."""
    versions = welcome.get("versions")
    return isinstance(versions, list) and PROTOCOL_VERSION_3 in versions


def binary_frame(header: Mapping[str, Any], arrays: Sequence[Any]) -> bytes:
    """A binary frame (version 3): the JSON header's length (uint32, little-endian), the header
    padded with spaces to BINARY_ALIGN, then the arrays' raw bytes (little-endian), in order."""
    return binary_payload(_encode(header), b"".join(arrays))


def binary_payload(header: str, arrays: bytes) -> bytes:
    """`binary_frame` with its header serialized and its arrays joined already (the rank
    simulator, benchmarks/ranks.py, formats the header per step and keeps the arrays)."""
    text = header.encode()
    text += b" " * (-(4 + len(text)) % BINARY_ALIGN)
    return b"".join((len(text).to_bytes(4, "little"), text, arrays))


def binary_steps(seq: int, records: Sequence[UnsentStep]) -> bytes:
    """`steps(seq, records)` as a binary frame (version 3): the header is the JSON message with
    `params` the list of the metrics' names and `grad_status` true or absent; the arrays follow,
    each steps x parameters, step-major: the metrics' float32, then the uint8 grad_status."""
    first = records[0]
    names = list(first.metrics)
    header: dict[str, Any] = {"v": PROTOCOL_VERSION_3, "seq": seq}
    if len(records) == 1:
        header.update(
            type="step",
            step=first.step,
            time=first.time,
            scalars={k: json_scalar(float(v)) for k, v in first.scalars.items()},
        )
        arrays = [np.ascontiguousarray(first.metrics[k], dtype="<f4") for k in names]
        if first.grad_status is not None:
            arrays.append(np.ascontiguousarray(first.grad_status, dtype=np.uint8))
    else:
        header.update(
            type="steps",
            step=[r.step for r in records],
            time=[r.time for r in records],
            scalars=scalar_columns(records),
        )
        arrays = [np.array([r.metrics[k] for r in records], dtype="<f4") for k in names]
        if first.grad_status is not None:
            arrays.append(np.array([r.grad_status for r in records if r.grad_status is not None], dtype=np.uint8))
    header["params"] = names
    if first.grad_status is not None:
        header["grad_status"] = True
    if first.digest is not None:
        header["grad_digest"] = first.digest if len(records) == 1 else [r.digest for r in records]
    return binary_frame(header, arrays)


def binary_header(frame: bytes) -> dict[str, Any]:
    """A binary frame's JSON header (its `seq`, `type`, ...)."""
    size = int.from_bytes(frame[:4], "little")
    header: dict[str, Any] = json.loads(frame[4 : 4 + size])
    return header


def seq_of(payload: str | bytes) -> int:
    """The `seq` of a serialized message (JSON text or binary frame); 0 for one without (a hello)."""
    message = binary_header(payload) if isinstance(payload, bytes) else json.loads(payload)
    seq: int = message.get("seq", 0)
    return seq


def binary_as_json(frame: bytes) -> dict[str, Any]:
    """A binary step frame (`binary_steps`) as the JSON message it stands for (its arrays in
    base64): what a hook resends to a server that does not read binary frames."""
    size = int.from_bytes(frame[:4], "little")
    header = binary_header(frame)
    names, status = header.pop("params"), header.pop("grad_status", False)
    floats = len(names) * 4 + (1 if status else 0)
    width = (len(frame) - 4 - size) // floats if floats else 0  # steps x parameters
    at = 4 + size
    params = {}
    for name in names:
        params[name] = base64.b64encode(frame[at : at + 4 * width]).decode("ascii")
        at += 4 * width
    message = {**header, "v": PROTOCOL_VERSION_2 if "grad_digest" in header else PROTOCOL_VERSION, "params": params}
    if status:
        message["grad_status"] = base64.b64encode(frame[at : at + width]).decode("ascii")
    return message


def close(seq: int, status: str = "finished") -> dict[str, Any]:
    return {"v": PROTOCOL_VERSION, "type": "close", "seq": seq, "status": status}


#: `json.dumps(message, allow_nan=False, separators=(",", ":"))`, with its encoder made once
_encode = json.JSONEncoder(allow_nan=False, separators=(",", ":"), check_circular=False).encode


def dumps(message: Mapping[str, Any]) -> str:
    """Serialize strictly: a bare NaN token would be refused by the server."""
    return _encode(message)

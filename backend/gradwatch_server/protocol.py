"""Wire protocol v1 (hook -> server): the one definition both sides are checked against.

See docs/protocol.md. `parse_message` turns one text frame into a validated `Hello`, `Step`, `Steps`
or `Close`, or raises `ProtocolError` with a message that says what is wrong. Per-parameter arrays
are decoded from base64 during validation, so a `Step` carries the raw little-endian bytes that
the store keeps as they are.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)

PROTOCOL_VERSION = 1

#: Bit pattern of the float32 NaN that means "does not apply to this parameter" (no `.grad`,
#: no such optimizer state yet). Test for it on the raw uint32 bits, before any arithmetic.
ABSENT_BITS = 0x7FDEAD00

#: `grad_status` codes, in increasing order of concern (the heatmap shows the highest).
GRAD_STATUS_NAMES = ("none", "zero", "nonzero", "nonfinite")

#: The metric name under which `grad_status` is stored beside the float metrics.
GRAD_STATUS = "grad_status"

#: dtype codes of stored per-parameter arrays (numpy spelling, little-endian).
FLOAT_DTYPE = "f4"
STATUS_DTYPE = "u1"


def array_dtype(metric: str) -> str:
    """The dtype of a per-parameter array: uint8 codes for grad_status, float32 otherwise."""
    return STATUS_DTYPE if metric == GRAD_STATUS else FLOAT_DTYPE


#: `seq` and `step` are stored as 64-bit integers (BIGINT) on SQLite and PostgreSQL alike.
MAX_INT64 = 2**63 - 1


def _no_nul(value: str) -> str:
    # PostgreSQL text cannot hold U+0000 (SQLite can): refused on both, so runs move between them.
    if "\x00" in value:
        raise ValueError("must not contain the NUL character (U+0000)")
    return value


#: A job id: the run id a distributed job's ranks share (the parent run), at most 56 characters so
#: that every stream id `JOB.rRANK` (rank < 65536) fits in 64.
JOB_ID_PATTERN = r"^[A-Za-z0-9_-]{1,56}$"
#: Every stored run id: a single-process run's or a job's (1-64 of [A-Za-z0-9_-]), or a rank's
#: stream `JOB.rRANK` (only with `dist` in the hello; `Hello._stream_id` checks which).
RUN_ID_PATTERN = r"^(?:[A-Za-z0-9_-]{1,64}|[A-Za-z0-9_-]{1,56}\.r(?:0|[1-9][0-9]{0,4}))$"
#: Most ranks a job may have.
MAX_WORLD_SIZE = 65536

RunId = Annotated[str, StringConstraints(pattern=RUN_ID_PATTERN)]
SeriesName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_./:-]{1,128}$")]
Label = Annotated[str, StringConstraints(min_length=1, max_length=256), AfterValidator(_no_nul)]

_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


class ProtocolError(ValueError):
    """A frame that breaks the protocol; the message is sent to the client as is."""


def _finite(value: float) -> float:
    if not math.isfinite(value):
        raise ValueError("must be a finite number")
    return value


FiniteFloat = Annotated[float, AfterValidator(_finite)]


def _scalar(value: object) -> float:
    if isinstance(value, str) and value in _NON_FINITE:
        return _NON_FINITE[value]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError('must be a number or one of the strings "NaN", "Infinity", "-Infinity"')
    try:
        return float(value)
    except OverflowError:  # an integer beyond float64's range
        raise ValueError("is too large for a float64") from None


#: On the wire a JSON number or "NaN"/"Infinity"/"-Infinity"; after validation a float.
ScalarValue = Annotated[
    float,
    BeforeValidator(_scalar),
    WithJsonSchema({"anyOf": [{"type": "number"}, {"enum": list(_NON_FINITE)}]}),
]


class _Message(BaseModel):
    # strict: no "1" for 1, no true for 1; forbid: a misspelt field is an error, not ignored.
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    v: Literal[1]


class RunInfo(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    id: RunId
    name: Label | None = None
    project: Label | None = None
    started_at: FiniteFloat
    hook_version: Annotated[str, StringConstraints(max_length=64), AfterValidator(_no_nul)] | None = None
    optimizer: Annotated[str, StringConstraints(max_length=128), AfterValidator(_no_nul)] | None = None
    config: dict[str, Any] = Field(default_factory=dict)


class ParamInfo(BaseModel):
    """One parameter. `shape`/`numel` are the full (unsharded) tensor's; in a distributed run
    `local_numel` is this rank's piece and `counted` whether it counts toward the global value
    (a replica counts once): the server adds the counted pieces' squared norms."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    name: Annotated[str, StringConstraints(min_length=1, max_length=512), AfterValidator(_no_nul)]
    shape: list[Annotated[int, Field(ge=0)]] = Field(max_length=64)
    numel: int = Field(ge=0)
    dtype: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.]{1,32}$")]
    group: int = Field(ge=0)
    optimizer: int = Field(ge=0)
    local_numel: int | None = Field(default=None, ge=0, description="elements of this rank's piece (default: numel)")
    counted: bool = Field(default=True, description="whether this rank's piece counts toward the global value")

    @model_validator(mode="after")
    def _numel_matches_shape(self) -> ParamInfo:
        if self.numel != math.prod(self.shape):
            raise ValueError(f"numel {self.numel} does not match shape {self.shape}")
        if self.local_numel is not None and self.local_numel > self.numel:
            raise ValueError(f"local_numel {self.local_numel} is above numel {self.numel} (a piece of the tensor)")
        return self

    @property
    def piece_numel(self) -> int:
        """Elements of this rank's piece: `local_numel`, or the whole tensor."""
        return self.numel if self.local_numel is None else self.local_numel


class GroupInfo(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    optimizer: int = Field(ge=0)
    index: int = Field(ge=0)
    name: Label | None = None
    hparams: dict[str, Any] = Field(default_factory=dict)


class DistInfo(BaseModel):
    """The job a rank's stream belongs to: every rank of a job sends the same `job` and
    `world_size`; the server assembles their steps into the run `job`."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    job: Annotated[str, StringConstraints(pattern=JOB_ID_PATTERN)]
    rank: int = Field(ge=0, lt=MAX_WORLD_SIZE)
    world_size: int = Field(ge=1, le=MAX_WORLD_SIZE)

    @model_validator(mode="after")
    def _rank_in_world(self) -> DistInfo:
        if self.rank >= self.world_size:
            raise ValueError(f"rank {self.rank} is not below world_size {self.world_size}")
        return self

    @property
    def stream_id(self) -> str:
        """The run id this rank's hello must carry: its child run's."""
        return stream_id(self.job, self.rank)


def stream_id(job: str, rank: int) -> str:
    """The id of rank `rank`'s stream (its child run) in job `job`."""
    return f"{job}.r{rank}"


def is_stream_id(run_id: str) -> bool:
    """Whether a stored run id is a rank's stream `JOB.rRANK` (no other run id has a dot)."""
    return "." in run_id


class Hello(_Message):
    type: Literal["hello"]
    run: RunInfo
    params: list[ParamInfo]
    groups: list[GroupInfo] = Field(default_factory=list)
    dist: DistInfo | None = None

    @model_validator(mode="after")
    def _stream_id(self) -> Hello:
        # A stream id belongs to one rank of one job: without `dist` a run could take a child's
        # id, and with it a rank could write into another rank's stream.
        if self.dist is None:
            if "." in self.run.id:
                raise ValueError(
                    f"run id {self.run.id!r} is a rank's stream id (JOB.rRANK): send it with "
                    '"dist": {"job", "rank", "world_size"}, or use an id of [A-Za-z0-9_-] only'
                )
        elif self.run.id != self.dist.stream_id:
            raise ValueError(
                f"run id {self.run.id!r} must be the stream id {self.dist.stream_id!r} "
                f"(job {self.dist.job!r}, rank {self.dist.rank})"
            )
        return self

    @field_validator("params")
    @classmethod
    def _unique_names(cls, params: list[ParamInfo]) -> list[ParamInfo]:
        seen: set[str] = set()
        for p in params:
            if p.name in seen:
                raise ValueError(f"parameter name {p.name!r} appears twice")
            seen.add(p.name)
        return params

    @field_validator("groups")
    @classmethod
    def _unique_groups(cls, groups: list[GroupInfo]) -> list[GroupInfo]:
        keys = [(g.optimizer, g.index) for g in groups]
        if len(set(keys)) != len(keys):
            raise ValueError("a param group (optimizer, index) appears twice")
        return groups


def _decode_base64(value: object) -> bytes:
    if not isinstance(value, str):
        raise ValueError("must be a base64 string")
    try:  # in C, without b64decode's regex pass (half a frame's validation); accepts a subset of it
        return binascii.a2b_base64(value, strict_mode=True)
    except (binascii.Error, ValueError):
        pass
    try:  # what strict mode refuses but validate=True takes (as the protocol always has)
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("is not valid base64 (standard alphabet, padded)") from None


def _decode_array(value: object, info: ValidationInfo, itemsize: int) -> bytes:
    """Base64 -> bytes, checked against the parameter count given in the validation context."""
    raw = _decode_base64(value)
    count = (info.context or {}).get("param_count")
    if count is None:
        raise ValueError("cannot be checked: the parameter count is unknown (send hello first)")
    if len(raw) != count * itemsize:
        raise ValueError(
            f"decodes to {len(raw)} bytes, expected {count * itemsize} ({count} parameters x {itemsize} bytes)"
        )
    return raw


def _decode_floats(value: object, info: ValidationInfo) -> bytes:
    return _decode_array(value, info, 4)


def _decode_codes(value: object, info: ValidationInfo) -> bytes:
    raw = _decode_array(value, info, 1)
    if raw and max(raw) >= len(GRAD_STATUS_NAMES):
        raise ValueError(f"has a code above {len(GRAD_STATUS_NAMES) - 1}")
    return raw


def _base64_schema(description: str) -> WithJsonSchema:
    """The JSON schema of an array sent as a base64 string."""
    return WithJsonSchema({"type": "string", "contentEncoding": "base64", "description": description})


#: On the wire a base64 string; after validation the raw little-endian bytes it encodes.
Float32Array = Annotated[
    bytes,
    BeforeValidator(_decode_floats),
    _base64_schema("little-endian float32, one per parameter"),
]
StatusArray = Annotated[
    bytes,
    BeforeValidator(_decode_codes),
    _base64_schema("uint8 grad_status codes, one per parameter"),
]


class Step(_Message):
    type: Literal["step"]
    seq: int = Field(ge=1, le=MAX_INT64)
    step: int = Field(ge=0, le=MAX_INT64)
    time: FiniteFloat
    scalars: dict[SeriesName, ScalarValue] = Field(default_factory=dict, max_length=10_000)
    params: dict[SeriesName, Float32Array] = Field(default_factory=dict, max_length=1_000)
    grad_status: StatusArray | None = None

    @field_validator("params")
    @classmethod
    def _no_status_in_params(cls, params: dict[str, bytes]) -> dict[str, bytes]:
        if GRAD_STATUS in params:
            raise ValueError(f"{GRAD_STATUS!r} belongs in the top-level grad_status field")
        return params

    def arrays(self) -> dict[str, bytes]:
        """Every per-parameter array as raw bytes, `grad_status` included."""
        if self.grad_status is None:
            return dict(self.params)
        return {**self.params, GRAD_STATUS: self.grad_status}


#: Most steps one `steps` message may carry.
MAX_BATCH_STEPS = 4096


#: A `steps` message's arrays: decoded here, their size checked against steps x parameters once
#: both are known (`Steps._columns_fit`).
Float32Matrix = Annotated[
    bytes,
    BeforeValidator(_decode_base64),
    _base64_schema("little-endian float32, steps x parameters, step-major"),
]
StatusMatrix = Annotated[
    bytes,
    BeforeValidator(_decode_base64),
    _base64_schema("uint8 grad_status codes, steps x parameters, step-major"),
]


class Steps(_Message):
    """Consecutive steps with the same keys in one frame, column by column (docs/protocol.md).

    One `seq` covers them all: they are stored in one transaction, or (a resend) not at all.
    `expand` gives the `Step` messages they stand for, so storage and live updates see steps only.
    """

    type: Literal["steps"]
    seq: int = Field(ge=1, le=MAX_INT64)
    step: list[Annotated[int, Field(ge=0, le=MAX_INT64)]] = Field(min_length=1, max_length=MAX_BATCH_STEPS)
    time: list[FiniteFloat]
    scalars: dict[SeriesName, list[ScalarValue]] = Field(default_factory=dict, max_length=10_000)
    params: dict[SeriesName, Float32Matrix] = Field(default_factory=dict, max_length=1_000)
    grad_status: StatusMatrix | None = None

    @model_validator(mode="after")
    def _columns_fit(self, info: ValidationInfo) -> Steps:
        k = len(self.step)
        if any(b <= a for a, b in zip(self.step, self.step[1:])):
            raise ValueError("step must be strictly increasing")
        if len(self.time) != k:
            raise ValueError(f"time has {len(self.time)} values for {k} steps")
        for key, values in self.scalars.items():
            if len(values) != k:
                raise ValueError(f"scalars.{key} has {len(values)} values for {k} steps")
        if GRAD_STATUS in self.params:
            raise ValueError(f"{GRAD_STATUS!r} belongs in the top-level grad_status field")
        count = (info.context or {}).get("param_count")
        if count is None:
            raise ValueError("cannot be checked: the parameter count is unknown (send hello first)")
        arrays = [(f"params.{m}", raw, 4) for m, raw in self.params.items()]
        if self.grad_status is not None:
            arrays.append(("grad_status", self.grad_status, 1))
        for where, raw, itemsize in arrays:
            if len(raw) != k * count * itemsize:
                raise ValueError(
                    f"{where} decodes to {len(raw)} bytes, expected {k * count * itemsize} "
                    f"({k} steps x {count} parameters x {itemsize} bytes)"
                )
        if self.grad_status and max(self.grad_status) >= len(GRAD_STATUS_NAMES):
            raise ValueError(f"grad_status has a code above {len(GRAD_STATUS_NAMES) - 1}")
        return self

    def expand(self) -> list[Step]:
        """One `Step` per step, sharing this message's `seq` (already validated: no second pass)."""
        k = len(self.step)

        def rows(raw: bytes) -> list[bytes]:
            width = len(raw) // k
            return [raw[i * width : (i + 1) * width] for i in range(k)]

        params = {m: rows(raw) for m, raw in self.params.items()}
        status = None if self.grad_status is None else rows(self.grad_status)
        return [
            Step.model_construct(
                v=PROTOCOL_VERSION,
                type="step",
                seq=self.seq,
                step=step,
                time=time,
                scalars={key: values[i] for key, values in self.scalars.items()},
                params={m: r[i] for m, r in params.items()},
                grad_status=None if status is None else status[i],
            )
            for i, (step, time) in enumerate(zip(self.step, self.time))
        ]


class Close(_Message):
    type: Literal["close"]
    seq: int = Field(ge=1, le=MAX_INT64)
    status: Literal["finished", "crashed"] = "finished"


Message = Hello | Step | Steps | Close
_MODELS: dict[str, type[Hello] | type[Step] | type[Steps] | type[Close]] = {
    "hello": Hello,
    "step": Step,
    "steps": Steps,
    "close": Close,
}


def _refuse_constant(token: str) -> float:
    raise ProtocolError(f'bare {token} is not standard JSON; send the string "{token}" instead')


def _describe(exc: ValidationError, kind: str) -> str:
    """The first few validation errors as one line: where, and what is wrong."""
    parts = []
    for err in exc.errors()[:3]:
        where = ".".join(str(p) for p in err["loc"]) or kind
        msg = err["msg"].removeprefix("Value error, ")
        parts.append(f"{where}: {msg}")
    more = len(exc.errors()) - 3
    suffix = f" (and {more} more)" if more > 0 else ""
    return f"invalid {kind} message: " + "; ".join(parts) + suffix


def parse_message(text: str | bytes, param_count: int | None = None) -> Message:
    """Validate one frame. `param_count` is the length of the run's `params` (after `hello`)."""
    try:
        data = json.loads(text, parse_constant=_refuse_constant)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"frame is not valid JSON: {exc}") from None
    return validate_message(data, param_count)


def validate_message(data: object, param_count: int | None = None) -> Message:
    """Validate one decoded message (a dict as `json.loads` gives it)."""
    if not isinstance(data, dict):
        raise ProtocolError("frame must be a JSON object")
    version = data.get("v")
    if type(version) is not int or version != PROTOCOL_VERSION:
        raise ProtocolError(f"unsupported protocol version {version!r}: this server speaks version {PROTOCOL_VERSION}")
    kind = data.get("type")
    if not isinstance(kind, str) or kind not in _MODELS:
        raise ProtocolError(f"unknown message type {kind!r}: expected one of {', '.join(_MODELS)}")
    try:
        return _MODELS[kind].model_validate(data, context={"param_count": param_count})
    except ValidationError as exc:
        raise ProtocolError(_describe(exc, kind)) from None


def decode_floats(raw: bytes) -> np.ndarray:
    """Raw wire/store bytes -> float32 array (read-only view, no copy)."""
    return np.frombuffer(raw, dtype="<f4")


def decode_status(raw: bytes) -> np.ndarray:
    """Raw wire/store bytes -> uint8 status codes (read-only view, no copy)."""
    return np.frombuffer(raw, dtype="u1")


def absent_mask(values: np.ndarray) -> np.ndarray:
    """True where a float32 array holds ABSENT (compared on the bits, before any arithmetic)."""
    mask: np.ndarray = np.ascontiguousarray(values, dtype="<f4").view("<u4") == ABSENT_BITS
    return mask

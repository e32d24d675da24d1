"""Wire protocol v1, v2 and v3 (hook -> server): the one definition both sides are checked against.

See docs/protocol.md. Version 2 adds to v1's hello, for a rank of a distributed job, a digest of
the job's parameter list (`params_digest`) that may stand for the list, and the rank's own pieces
of the parameters (`pieces`) in a compact form; every other message reads as in v1. `parse_message` turns one text frame into a validated `Hello`, `Step`, `Steps`
or `Close`, or raises `ProtocolError` with a message that says what is wrong. Per-parameter arrays
are decoded from base64 during validation, so a `Step` carries the raw little-endian bytes that
the store keeps as they are. Version 3 sends a `step` or `steps` message as a binary frame, its
arrays raw after a JSON header: `parse_binary` reads it into the same models, with no base64.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
from collections.abc import Sequence
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
#: The versions of JSON text frames this server reads: v2 is v1 plus the hello's `params_digest`
#: and `pieces`.
PROTOCOL_VERSIONS = (1, 2)
#: Version 3: a `step` or `steps` message as a binary frame (`parse_binary`), its per-parameter
#: arrays raw after a JSON header, no base64. The welcome's `versions` lists it.
BINARY_VERSION = 3
#: What the welcome says this server reads (`versions`): a hook sends binary step frames only to
#: a server that lists BINARY_VERSION.
READ_VERSIONS = (*PROTOCOL_VERSIONS, BINARY_VERSION)

#: Bit pattern of the float32 NaN that means "does not apply to this parameter" (no `.grad`,
#: no such optimizer state yet). Test for it on the raw uint32 bits, before any arithmetic.
ABSENT_BITS = 0x7FDEAD00

#: `grad_status` codes, in increasing order of concern (the heatmap shows the highest).
GRAD_STATUS_NAMES = ("none", "zero", "nonzero", "nonfinite")

#: The metric name under which `grad_status` is stored beside the float metrics.
GRAD_STATUS = "grad_status"

#: The scalar that marks a step sent again by the hook's flight recorder, with per-parameter arrays
#: it kept (the `grad_norm` of a step before an incident, sent earlier with its cheap facts only):
#: the server adds those arrays to the stored step, and stores nothing else of it (docs/protocol.md).
RESENT = "flight/resent"

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

    v: Literal[1, 2, 3]


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


#: A `params_digest`: SHA-256 in lowercase hex (protocol v2).
DIGEST_PATTERN = r"^[0-9a-f]{64}$"
ParamsDigest = Annotated[str, StringConstraints(pattern=DIGEST_PATTERN)]


def params_digest(params: Sequence[ParamInfo], groups: Sequence[GroupInfo]) -> str:
    """The digest of a job's parameter list and param groups (v2's `params_digest`): SHA-256 of
    their canonical JSON (each parameter `[name, shape, numel, dtype, group, optimizer]` in order,
    each group `[optimizer, index, name, hparams]` sorted by (optimizer, index); keys sorted, no
    spaces, ASCII). A rank's own pieces (`local_numel`, `counted`) are not part of it."""
    canon = {
        "params": [[p.name, list(p.shape), p.numel, p.dtype, p.group, p.optimizer] for p in params],
        "groups": [
            [g.optimizer, g.index, g.name, g.hparams] for g in sorted(groups, key=lambda g: (g.optimizer, g.index))
        ],
    }
    text = json.dumps(canon, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


class Pieces(BaseModel):
    """A rank's pieces of the job's parameters (v2), in parameter order: `counted` one flag for
    every piece or one per parameter; `local_numel` None (every piece is the whole tensor) or one
    count per parameter."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    counted: bool | list[bool] = True
    local_numel: list[Annotated[int, Field(ge=0)]] | None = None

    def check(self, params: Sequence[ParamInfo]) -> None:
        """Raise ValueError unless these pieces fit `params` (one per parameter, none larger)."""
        n = len(params)
        if isinstance(self.counted, list) and len(self.counted) != n:
            raise ValueError(f"pieces.counted has {len(self.counted)} flags for {n} parameters")
        if self.local_numel is not None:
            if len(self.local_numel) != n:
                raise ValueError(f"pieces.local_numel has {len(self.local_numel)} counts for {n} parameters")
            for p, local in zip(params, self.local_numel):
                if local > p.numel:
                    raise ValueError(f"pieces.local_numel {local} of {p.name!r} is above its numel {p.numel}")

    def counted_flags(self, count: int) -> list[bool]:
        return list(self.counted) if isinstance(self.counted, list) else [self.counted] * count

    @classmethod
    def of(cls, params: Sequence[ParamInfo]) -> Pieces:
        """The pieces a v1 hello gives in its params, compactly (one flag where all agree)."""
        flags = [p.counted for p in params]
        counted: bool | list[bool] = flags[0] if flags and all(f == flags[0] for f in flags) else flags or True
        whole = all(p.local_numel is None or p.local_numel == p.numel for p in params)
        return cls.model_construct(counted=counted, local_numel=None if whole else [p.piece_numel for p in params])


class Hello(_Message):
    """v1: `params` (and `groups`) in full. v2, for a rank (`dist`): `params_digest` names the
    job's parameter list and groups, which may then be left out (the server has them from an
    earlier hello of the job, else it closes with CLOSE_NEED_PARAMS: send them in full);
    `pieces` gives the rank's own pieces (then `params` carry none)."""

    type: Literal["hello"]
    run: RunInfo
    params: list[ParamInfo] = Field(default_factory=list)
    groups: list[GroupInfo] = Field(default_factory=list)
    dist: DistInfo | None = None
    params_digest: ParamsDigest | None = None
    pieces: Pieces | None = None

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

    @model_validator(mode="after")
    def _version_2(self) -> Hello:
        v2 = self.params_digest is not None or self.pieces is not None
        if v2 and self.v < 2:
            raise ValueError('params_digest and pieces are protocol version 2: send "v": 2')
        if v2 and self.dist is None:
            raise ValueError("params_digest and pieces are for a rank of a distributed job (a hello with dist)")
        if "params" not in self.model_fields_set:
            if self.params_digest is None:
                raise ValueError("params: Field required (or, in v2, a params_digest that names them)")
            if self.groups:
                raise ValueError("groups without params: a hello that names its parameters by digest sends neither")
            return self
        if self.pieces is not None:
            if any(p.local_numel is not None or not p.counted for p in self.params):
                raise ValueError("with pieces, give each piece there, not in params (local_numel, counted)")
            self.pieces.check(self.params)
        if self.params_digest is not None:
            digest = params_digest(self.params, self.groups)
            if digest != self.params_digest:
                raise ValueError(
                    f"params_digest {self.params_digest} does not match the params and groups sent "
                    f"(their digest is {digest}; docs/protocol.md says how it is computed)"
                )
        return self

    @property
    def names_params(self) -> bool:
        """A v2 hello that names the job's parameters by digest instead of listing them."""
        return "params" not in self.model_fields_set

    def rank_pieces(self) -> Pieces:
        """This rank's pieces of the parameters: `pieces`, or as `params` give them."""
        return self.pieces if self.pieces is not None else Pieces.of(self.params)

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
    if isinstance(value, bytes):  # a binary frame's array (`parse_binary`): raw already
        return value
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
    if raw and int(np.frombuffer(raw, dtype="u1").max()) >= len(GRAD_STATUS_NAMES):
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


#: A replica's `grad_digest`: BLAKE2b, 16 bytes, as 32 lowercase hex digits (`grad_digest`).
GradDigest = Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")]


def grad_digest(grad_norm: bytes | None, grad_status: bytes | None) -> str:
    """The digest a DDP replica sends instead of its arrays (docs/protocol.md, version 2):
    BLAKE2b (16 bytes) of its little-endian float32 grad_norm bytes, then a 0xFF byte, then its
    uint8 grad_status bytes (either empty where not sent). Equal digests: the same bits."""
    h = hashlib.blake2b(digest_size=16)
    h.update(grad_norm or b"")
    h.update(b"\xff")
    h.update(grad_status or b"")
    return h.hexdigest()


def _check_digest_step(v: int, grad_norm: bool, grad_status: bool) -> None:
    """A `grad_digest` stands for a replica's arrays: version 2, and not beside them."""
    if v < 2:
        raise ValueError('grad_digest needs "v": 2')
    if grad_norm or grad_status:
        raise ValueError("grad_digest stands for grad_norm and grad_status: send one or the others")


class Step(_Message):
    type: Literal["step"]
    seq: int = Field(ge=1, le=MAX_INT64)
    step: int = Field(ge=0, le=MAX_INT64)
    time: FiniteFloat
    scalars: dict[SeriesName, ScalarValue] = Field(default_factory=dict, max_length=10_000)
    params: dict[SeriesName, Float32Array] = Field(default_factory=dict, max_length=1_000)
    grad_status: StatusArray | None = None
    #: v2, a DDP replica's measured step: the digest of its grad_norm and grad_status
    #: (`grad_digest`) instead of its per-parameter arrays (docs/protocol.md, version 2)
    grad_digest: GradDigest | None = None

    @field_validator("params")
    @classmethod
    def _no_status_in_params(cls, params: dict[str, bytes]) -> dict[str, bytes]:
        if GRAD_STATUS in params:
            raise ValueError(f"{GRAD_STATUS!r} belongs in the top-level grad_status field")
        return params

    @model_validator(mode="after")
    def _digest_alone(self) -> Step:
        if self.grad_digest is not None:
            _check_digest_step(self.v, "grad_norm" in self.params, self.grad_status is not None)
        return self

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
    grad_digest: list[GradDigest] | None = None

    @model_validator(mode="after")
    def _columns_fit(self, info: ValidationInfo) -> Steps:
        k = len(self.step)
        if self.grad_digest is not None:
            _check_digest_step(self.v, "grad_norm" in self.params, self.grad_status is not None)
            if len(self.grad_digest) != k:
                raise ValueError(f"grad_digest has {len(self.grad_digest)} values for {k} steps")
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
        if self.grad_status and int(np.frombuffer(self.grad_status, dtype="u1").max()) >= len(GRAD_STATUS_NAMES):
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
            _construct_step(
                {
                    "v": PROTOCOL_VERSION,
                    "type": "step",
                    "seq": self.seq,
                    "step": step,
                    "time": time,
                    "scalars": {key: values[i] for key, values in self.scalars.items()},
                    "params": {m: r[i] for m, r in params.items()},
                    "grad_status": None if status is None else status[i],
                    "grad_digest": None if self.grad_digest is None else self.grad_digest[i],
                }
            )
            for i, (step, time) in enumerate(zip(self.step, self.time))
        ]


_set_attribute = object.__setattr__
_STEP_FIELDS = frozenset(Step.model_fields)


def _construct_step(fields: dict[str, Any]) -> Step:
    """`Step.model_construct(**fields)` of every field, in the order they are declared, at a
    fraction of its cost (it looks at each field's aliases and defaults: most of a frame's
    parsing, a step at a time): the attributes it sets, set directly
    (tests/backend/test_protocol_models.py holds the two equal)."""
    step = Step.__new__(Step)
    _set_attribute(step, "__dict__", fields)
    _set_attribute(step, "__pydantic_fields_set__", set(_STEP_FIELDS))
    _set_attribute(step, "__pydantic_extra__", None)
    _set_attribute(step, "__pydantic_private__", None)
    return step


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


#: One decoder for every frame: `json.loads` with an option builds a new one per call.
_JSON = json.JSONDecoder(parse_constant=_refuse_constant)


def parse_message(text: str | bytes, param_count: int | None = None) -> Message:
    """Validate one frame. `param_count` is the length of the run's `params` (after `hello`)."""
    try:
        data = _JSON.decode(text) if isinstance(text, str) else json.loads(text, parse_constant=_refuse_constant)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"frame is not valid JSON: {exc}") from None
    return validate_message(data, param_count)


def validate_message(data: object, param_count: int | None = None) -> Message:
    """Validate one decoded message (a dict as `json.loads` gives it)."""
    if not isinstance(data, dict):
        raise ProtocolError("frame must be a JSON object")
    version = data.get("v")
    if type(version) is not int or version not in PROTOCOL_VERSIONS:
        raise ProtocolError(
            f"unsupported protocol version {version!r}: this server speaks versions "
            + ", ".join(map(str, PROTOCOL_VERSIONS))
        )
    kind = data.get("type")
    if not isinstance(kind, str) or kind not in _MODELS:
        raise ProtocolError(f"unknown message type {kind!r}: expected one of {', '.join(_MODELS)}")
    try:
        return _MODELS[kind].model_validate(data, context={"param_count": param_count})
    except ValidationError as exc:
        raise ProtocolError(_describe(exc, kind)) from None


#: A binary frame (version 3) starts with its JSON header's length, a little-endian uint32.
_HEADER_LENGTH = 4
#: The header is padded (JSON whitespace) so that the arrays start at a multiple of this offset.
BINARY_ALIGN = 8


def parse_binary(frame: bytes, param_count: int | None = None) -> Step | Steps:
    """Validate one binary frame (version 3, docs/protocol.md): a `step` or `steps` message whose
    header (JSON: the message without its arrays; `params` the list of the metrics' names, in
    the order of their arrays, `grad_status` true when its codes follow them) precedes the raw
    little-endian arrays, each steps x parameters, float32 (uint8 for grad_status). Every check
    of the JSON form applies, and the frame's size must be exactly what the header says."""
    if param_count is None:
        raise ProtocolError("a binary frame carries steps: send hello (a JSON text frame) first")
    if len(frame) < _HEADER_LENGTH:
        raise ProtocolError(f"binary frame of {len(frame)} bytes is truncated: it has no header length")
    size = int.from_bytes(frame[:_HEADER_LENGTH], "little")
    body = _HEADER_LENGTH + size
    if body > len(frame):
        raise ProtocolError(
            f"binary frame is truncated: its header says {size} bytes, {len(frame) - _HEADER_LENGTH} follow"
        )
    try:
        header = _JSON.decode(frame[_HEADER_LENGTH:body].decode())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"binary frame's header is not valid JSON: {exc}") from None
    if not isinstance(header, dict):
        raise ProtocolError("binary frame's header must be a JSON object")
    if header.get("v") != BINARY_VERSION or type(header.get("v")) is not int:
        raise ProtocolError(f'binary frame\'s header must say "v": {BINARY_VERSION}, not {header.get("v")!r}')
    kind = header.get("type")
    if kind not in ("step", "steps"):
        raise ProtocolError(f"a binary frame carries a step or steps message, not {kind!r}: send it as JSON text")
    names, status = header.get("params", []), header.get("grad_status", False)
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names) or len(set(names)) != len(names):
        raise ProtocolError("binary frame's header: params must be a list of distinct metric names")
    if not isinstance(status, bool):
        raise ProtocolError("binary frame's header: grad_status must be true or false")
    rows = header.get("step")
    rows = len(rows) if kind == "steps" and isinstance(rows, list) else 1
    width = rows * param_count
    expected = width * (4 * len(names) + (1 if status else 0))
    if len(frame) - body != expected:
        raise ProtocolError(
            f"binary frame carries {len(frame) - body} bytes of arrays, expected {expected} "
            f"({len(names)} float32 arrays{' and grad_status' if status else ''} of {rows} steps x "
            f"{param_count} parameters)"
        )
    view = memoryview(frame)
    arrays: dict[str, bytes] = {}
    at = body
    for name in names:
        arrays[name] = bytes(view[at : at + 4 * width])
        at += 4 * width
    data = {**header, "params": arrays}
    if status:
        data["grad_status"] = bytes(view[at : at + width])
    else:
        data.pop("grad_status", None)
    try:
        return _MODELS[kind].model_validate(data, context={"param_count": param_count})  # type: ignore[return-value]
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

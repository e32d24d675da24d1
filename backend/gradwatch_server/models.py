"""Public JSON shapes of the REST API and the live websocket (see docs/api.md).

Numbers that may be non-finite are `JsonFloat`: a float, "NaN"/"Infinity"/"-Infinity", or null
for a value that does not apply (jsonvalues.py makes them).
"""

from __future__ import annotations

import unicodedata
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, model_validator

from .protocol import Label
from .store import Group, Param, Run

JsonFloat = float | str | None
RunStatus = Literal["running", "finished", "crashed"]


class Health(BaseModel):
    status: Literal["ok"] = "ok"
    version: str
    worker: int | None = Field(
        None, description="process id of the worker that answered (`gradwatch serve --workers N` runs several)"
    )


class FindingCounts(BaseModel):
    error: int = 0
    warning: int = 0
    info: int = 0


class RunPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: str
    name: str
    project: str
    status: RunStatus
    steps: int = Field(description="number of stored steps")
    last_step: int | None
    created_at: float = Field(description="when the run started, Unix seconds")
    updated_at: float
    finished_at: float | None
    param_count: int
    param_numel: int
    optimizer: str | None
    config: dict[str, Any]
    hook_version: str | None
    world_size: int | None = Field(
        None, description="a distributed job's number of ranks (null for a single-process run)"
    )
    parent_id: str | None = Field(None, description="a rank's run (JOB.rRANK): the id of its job's run")
    rank: int | None = Field(None, description="a rank's run: its rank")
    tags: list[str] = Field(default_factory=list, description="set with PATCH; filter with ?tag=")
    findings: FindingCounts = Field(
        default_factory=FindingCounts, description="stored findings by severity (GET .../diagnostics lists them)"
    )

    @classmethod
    def of(cls, run: Run) -> RunPublic:
        return cls.model_validate(run)


class RunsPublic(BaseModel):
    data: list[RunPublic]
    count: int = Field(description="number of runs matching the filters, all pages together")


#: Limits of run tags (PATCH /api/runs/{id}).
MAX_TAGS = 32
MAX_TAG_LENGTH = 64


def _tag(value: str) -> str:
    # Commas separate tags where people type them (the dashboard); control characters (NUL
    # above all: PostgreSQL cannot store it) have no business in a label.
    if any(unicodedata.category(c) == "Cc" for c in value):
        raise ValueError("must not contain control characters (NUL, tab, newline, ...)")
    if "," in value:
        raise ValueError("must not contain a comma (the dashboard separates tags with commas)")
    return value


Tag = Annotated[
    str, StringConstraints(strip_whitespace=True, min_length=1, max_length=MAX_TAG_LENGTH), AfterValidator(_tag)
]


class RunUpdate(BaseModel):
    """PATCH body: a new name, new tags, or both; a field left out is unchanged."""

    model_config = ConfigDict(extra="forbid")

    name: Label | None = Field(default=None, description="1 to 256 characters, no NUL (as a run's name in the hello)")
    tags: list[Tag] | None = Field(
        default=None,
        max_length=MAX_TAGS,
        description=f"the run's tags, replacing its old ones: at most {MAX_TAGS}, each 1 to {MAX_TAG_LENGTH} "
        "characters (spaces around it removed), no comma, no control character; repeats are dropped",
    )

    @model_validator(mode="after")
    def _something(self) -> RunUpdate:
        if self.name is None and self.tags is None:
            raise ValueError('give "name", "tags" or both')
        if self.tags is not None:
            self.tags = list(dict.fromkeys(self.tags))
        return self


class ParamPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    index: int
    name: str
    shape: list[int]
    numel: int
    dtype: str
    group: int
    optimizer: int

    @classmethod
    def of(cls, param: Param) -> ParamPublic:
        return cls.model_validate(param)


class ParamsPublic(BaseModel):
    data: list[ParamPublic]
    count: int


class GroupPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    optimizer: int = Field(description="which optimizer (0 unless the hook watches several)")
    index: int = Field(description="the param group's index in that optimizer")
    name: str | None
    hparams: dict[str, Any] = Field(description="the group's settings at the hello: lr, weight_decay, betas, ...")

    @classmethod
    def of(cls, group: Group) -> GroupPublic:
        return cls.model_validate(group)


class GroupsPublic(BaseModel):
    data: list[GroupPublic]
    count: int


class MetricsPublic(BaseModel):
    scalars: list[str] = Field(description="keys for /series")
    params: list[str] = Field(description="metrics for /params/series and /heatmap")


_TIME = "only with ?time=true: each point's wall time in Unix seconds (a bucket's first step's)"
_TIME0 = "only with ?time=true: the wall time of the run's first stored step (x = time - time0 aligns runs)"


class Series(BaseModel):
    key: str
    downsampled: bool
    step: list[int] = Field(description="each point's step (a bucket's first step when downsampled)")
    value: list[JsonFloat] = Field(description="the value, or a bucket's mean of finite values")
    min: list[JsonFloat] | None = Field(description="bucket minimum; null unless downsampled")
    max: list[JsonFloat] | None = Field(description="bucket maximum; null unless downsampled")
    time: list[JsonFloat] | None = Field(default=None, description=_TIME)
    time0: float | None = Field(default=None, description=_TIME0)


class ParamSeries(BaseModel):
    param: str
    index: int
    value: list[JsonFloat]
    min: list[JsonFloat] | None
    max: list[JsonFloat] | None


class ParamSeriesPublic(BaseModel):
    metric: str
    downsampled: bool
    step: list[int]
    series: list[ParamSeries]
    time: list[JsonFloat] | None = Field(default=None, description=_TIME)
    time0: float | None = Field(default=None, description=_TIME0)


class Spread(BaseModel):
    metric: str
    downsampled: bool
    step: list[int] = Field(description="each point's step (a bucket's first step when downsampled)")
    params: list[int] = Field(description="parameters with a finite value (a finite bucket mean) at the point")
    nonfinite: list[int] = Field(description="parameters with a NaN or infinite value at the point (left out)")
    min: list[JsonFloat]
    q25: list[JsonFloat]
    median: list[JsonFloat]
    q75: list[JsonFloat]
    max: list[JsonFloat] = Field(description="null where no parameter has a finite value")


class Heatmap(BaseModel):
    metric: str
    params: list[str]
    step: list[int] = Field(description="each column's first step")
    z: list[list[int | JsonFloat]] | None = Field(
        description="z[i][j]: parameter i over step bucket j; null with encoding=f32 (see z_f32)"
    )
    downsampled: bool
    z_f32: str | None = Field(
        default=None,
        description=(
            "only with encoding=f32: the cells as base64 (standard alphabet, padded) of little-endian float32, "
            "row-major, shape [len(params), len(step)]: cell (i, j) is float i*len(step)+j, the value z[i][j] "
            "would hold; a cell without a value (null in z) is the NaN with bits 0x7FC00001 (EMPTY), a NaN "
            "0x7FC00000; for grad_status the codes 0-3 as floats"
        ),
    )


class FindingFigure(BaseModel):
    label: str = Field(description='what the number is, e.g. "bytes held between steps"')
    value: JsonFloat
    unit: str = Field(description='"bytes", "passes", "steps" or "ratio"')
    text: str = Field(description='the value as it reads, e.g. "1.5 MiB"')
    step: int | None = Field(default=None, description="the step at which the figure holds (null: not said)")
    evidence: dict[str, Any] | None = Field(
        default=None,
        description=(
            "an instability finding's evidence (grad_norm_spike, large_update, adam_epsilon_regime, loss_spike): "
            "the step, the parameters that moved with how far (ratio to their median, score in sigma) and, for "
            "loss_spike, those that moved first with how many steps before (docs/diagnostics.md); null elsewhere"
        ),
    )


class Finding(BaseModel):
    code: str = Field(description="one of the codes of docs/diagnostics.md")
    severity: Literal["info", "warning", "error"]
    message: str = Field(description="one sentence: what happened, and the fix")
    params: list[str] = Field(description="the parameters concerned (none for run-wide findings)")
    first_step: int | None = Field(description="the step where it began (null: known from the start)")
    figure: FindingFigure | None = Field(default=None, description="the number that sizes it, where one does")


class RankPublic(BaseModel):
    rank: int
    run_id: str = Field(description="the rank's own run (JOB.rRANK): every run endpoint reads it")
    status: RunStatus
    last_step: int | None = Field(description="the last step the rank sent (null before its first)")
    steps: int = Field(description="steps the rank sent")
    updated_at: float = Field(description="when the rank's run last changed, Unix seconds")
    lost: bool = Field(
        description="the rank stopped sending while others went on: the job's steps after its last one are partial"
    )


class PartialRangePublic(BaseModel):
    first: int
    last: int
    missing: list[int] = Field(description="the ranks the steps first..last were assembled without")


class PartialPublic(BaseModel):
    steps: int = Field(description="how many of the job's stored steps are partial")
    ranges: list[PartialRangePublic] = Field(
        description="runs of consecutive stored steps missing the same ranks, in step order"
    )


class RanksPublic(BaseModel):
    world_size: int = Field(description="the job's ranks; 1 for a single-process run")
    ranks: list[RankPublic] = Field(
        description="by rank, those that have reached the server (empty for a single process)"
    )
    partial: PartialPublic


class RankOutlierPublic(BaseModel):
    rank: int
    median: float = Field(description="the rank's median over the window")
    others: float = Field(description="the median of every rank's median")
    high: bool = Field(description="above the others (slower, larger); false: below")


class RankSpreadPublic(BaseModel):
    metric: str = Field(description="the per-rank scalar: time/step_s, time/before_backward_s, memory, grad_norm_total")
    ranks: int = Field(description="ranks with a finite value in the window")
    steps: list[int] = Field(description="the window's steps, ascending")
    min: list[float | None]
    p5: list[float | None]
    p50: list[float | None]
    p95: list[float | None]
    max: list[float | None]
    outliers: list[RankOutlierPublic] = Field(
        description="ranks whose median over the window stands apart from the others' (farthest first, at most 8)"
    )

"""Public JSON shapes of the REST API and the live websocket (see docs/api.md).

Numbers that may be non-finite are `JsonFloat`: a float, "NaN"/"Infinity"/"-Infinity", or null
for a value that does not apply (jsonvalues.py makes them).
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .protocol import Label
from .store import Param, Run

JsonFloat = float | str | None
RunStatus = Literal["running", "finished", "crashed"]


class Health(BaseModel):
    status: Literal["ok"] = "ok"
    version: str


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

    @classmethod
    def of(cls, run: Run) -> RunPublic:
        return cls.model_validate(run)


class RunsPublic(BaseModel):
    data: list[RunPublic]
    count: int = Field(description="number of runs matching the filters, all pages together")


class RunUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Label = Field(description="1 to 256 characters, no NUL (as a run's name in the hello)")


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


class MetricsPublic(BaseModel):
    scalars: list[str] = Field(description="keys for /series")
    params: list[str] = Field(description="metrics for /params/series and /heatmap")


class Series(BaseModel):
    key: str
    downsampled: bool
    step: list[int] = Field(description="each point's step (a bucket's first step when downsampled)")
    value: list[JsonFloat] = Field(description="the value, or a bucket's mean of finite values")
    min: list[JsonFloat] | None = Field(description="bucket minimum; null unless downsampled")
    max: list[JsonFloat] | None = Field(description="bucket maximum; null unless downsampled")


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


class Heatmap(BaseModel):
    metric: str
    params: list[str]
    step: list[int] = Field(description="each column's first step")
    z: list[list[int | JsonFloat]] = Field(description="z[i][j]: parameter i over step bucket j")
    downsampled: bool


class FindingFigure(BaseModel):
    label: str = Field(description='what the number is, e.g. "bytes held between steps"')
    value: JsonFloat
    unit: str = Field(description='"bytes", "passes", "steps" or "ratio"')
    text: str = Field(description='the value as it reads, e.g. "1.5 MiB"')


class Finding(BaseModel):
    code: str = Field(description="one of the codes of DESIGN.md's Diagnostics table")
    severity: Literal["info", "warning", "error"]
    message: str = Field(description="one sentence: what happened, and the fix")
    params: list[str] = Field(description="the parameters concerned (none for run-wide findings)")
    first_step: int | None = Field(description="the step where it began (null: known from the start)")
    figure: FindingFigure | None = Field(default=None, description="the number that sizes it, where one does")

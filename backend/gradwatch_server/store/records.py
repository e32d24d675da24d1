"""What the store takes and returns: plain records, and the errors it raises."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

RUN_STATUSES = ("running", "finished", "crashed")

#: Severities of findings, as counted per run in `Run.findings`.
SEVERITIES = ("error", "warning", "info")


def no_findings() -> dict[str, int]:
    return dict.fromkeys(SEVERITIES, 0)


class StoreError(RuntimeError):
    """A storage problem the user can act on; the message says how."""


class ParamsMismatch(StoreError):
    """A `hello` resumes a run but lists different parameters."""


class UnknownRun(StoreError):
    """No run has this id."""


#: A run's kinds (runs.kind): one process's run, a distributed job's parent run, one rank's run.
RUN_KINDS = ("run", "job", "rank")


@dataclass(frozen=True)
class Run:
    id: str
    name: str
    project: str
    status: str
    created_at: float
    updated_at: float
    finished_at: float | None
    last_seq: int
    steps: int
    last_step: int | None
    param_count: int
    param_numel: int
    optimizer: str | None
    config: dict[str, Any]
    hook_version: str | None
    #: A distributed job's parent run has `world_size`; each rank's child run has all three.
    parent_id: str | None = None
    rank: int | None = None
    world_size: int | None = None
    #: What the run is (RUN_KINDS): "run" (one process), "job" (a job's parent) or "rank".
    kind: str = "run"
    tags: list[str] = field(default_factory=list)
    #: Stored findings by severity ({"error": n, "warning": n, "info": n}).
    findings: dict[str, int] = field(default_factory=no_findings)


@dataclass(frozen=True)
class Param:
    index: int
    name: str
    shape: list[int]
    numel: int
    dtype: str
    group: int
    optimizer: int
    #: A child run's piece of the parameter (None elsewhere): its element count, and whether it
    #: counts toward the global value.
    local_numel: int | None = None
    counted: bool | None = None


@dataclass(frozen=True)
class Group:
    optimizer: int
    index: int
    name: str | None
    hparams: dict[str, Any]


@dataclass(frozen=True)
class OpenedRun:
    """What `open_run` did: `created` a new run, or resumed one (`resumed_from` its status)."""

    run: Run
    created: bool
    resumed_from: str | None


@dataclass(frozen=True)
class StepData:
    """One `step` message to store: scalars as floats, arrays as raw little-endian bytes."""

    seq: int
    step: int
    time: float
    scalars: Mapping[str, float]
    arrays: Mapping[str, bytes]
    #: the flight recorder's arrays for a step stored earlier without them (protocol.RESENT): only
    #: its arrays are added, to the stored step; it is never stored as a step of its own
    resent: bool = False
    #: a DDP replica's `grad_digest` (protocol v2) in place of its grad_norm and grad_status: kept
    #: by the job's memory for `rank_desync`, and stored with the rank's step (rank_steps) for
    #: the recent window, so that a comparison survives a restart
    digest: str | None = None


@dataclass(frozen=True)
class StoredFinding:
    """One diagnostic finding as stored (diagnostics/ makes them; the codes: docs/diagnostics.md)."""

    code: str
    severity: str
    message: str
    params: list[str]
    first_step: int | None
    figure: dict[str, Any] | None


@dataclass(frozen=True)
class DiagnosisMark:
    """The stored findings of a run cover its first `steps` stored steps, by rules `version`."""

    steps: int
    last_step: int | None
    version: int


@dataclass
class StoredStep:
    """One stored step, as the exporters read it."""

    step: int
    seq: int
    time: float
    scalars: dict[str, float] = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    digest: str | None = None  # a DDP replica's grad_digest (a rank's step, in its recent window)

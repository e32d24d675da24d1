"""Table definitions (SQLAlchemy Core), portable between SQLite and PostgreSQL.

Laid out for the dashboard's reads: a scalar's series is one primary-key range
(run_id, key, step); a parameter metric is one row per (run, metric, step) holding the
whole per-parameter array as a blob, so "all parameters over a window of steps" is one range
scan, and "one parameter over many steps" reads a 4-byte slice of each blob (`substr`) over a
short window, and the blocks of `metric_blocks` (blocks.py) over a long one.

Small-row tables are WITHOUT ROWID on SQLite: the primary key is the table's b-tree, which saves
a second index and a lookup. `param_metrics` keeps its rowid because its rows are large (SQLite
advises WITHOUT ROWID only for rows well under a twentieth of a page).

Changing this file needs a new migration under migrations/versions/ (0002 added `findings` and
`diagnoses`, 0003 `run_tags`, 0004 `metric_blocks`, 0005 `deleted_runs`, 0006 distributed jobs:
`runs.parent_id/rank/world_size`, `params.local_numel/counted`, `partial_steps`, 0007 `runs.kind` and
`rank_summaries`, 0008 `rank_spread`, 0009 `runs.pieces`, 0010 `rank_steps` and `rank_keys`); a
test checks that the migrations produce exactly these tables.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Double,
    ForeignKey,
    Integer,
    LargeBinary,
    MetaData,
    SmallInteger,
    String,
    Table,
    Text,
)

metadata = MetaData()


def _run_id() -> Column[str]:
    """The key column pointing at the owning run; deleting the run deletes the row."""
    return Column("run_id", String(64), ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)


runs = Table(
    "runs",
    metadata,
    Column("id", String(64), primary_key=True),  # chosen by the hook
    Column("name", Text, nullable=False),
    Column("project", Text, nullable=False, index=True),
    Column("status", String(16), nullable=False),  # running | finished | crashed
    Column("created_at", Double, nullable=False, index=True),  # Unix seconds
    Column("updated_at", Double, nullable=False),
    Column("finished_at", Double),
    Column("last_seq", BigInteger, nullable=False),  # highest committed message seq
    Column("steps", Integer, nullable=False),  # number of stored steps
    Column("last_step", BigInteger),
    Column("param_count", Integer, nullable=False),
    Column("param_numel", BigInteger, nullable=False),
    Column("optimizer", Text),
    Column("config", Text, nullable=False),  # JSON object
    Column("hook_version", String(64)),
    # A distributed job (docs/protocol.md, "Distributed training") is a parent run (id = the job,
    # world_size set, parent_id NULL) holding the assembled global steps, and a child run per
    # rank (id JOB.rRANK, parent_id = JOB, rank, world_size) holding what that rank sent.
    # Deleting the parent deletes its children. All three are NULL for a single-process run.
    Column("parent_id", String(64), ForeignKey("runs.id", ondelete="CASCADE"), index=True),
    Column("rank", Integer),
    Column("world_size", Integer),
    # What the run is, stated rather than guessed from the columns above: "run" (one process),
    # "job" (a distributed job's parent run) or "rank" (one rank's child run). Set when the run is
    # created; migration 0007 filled it from parent_id and world_size.
    Column("kind", String(8), nullable=False, server_default="run"),
    # A rank's run (kind "rank") opened since migration 0009 keeps no parameter rows of its own:
    # it shares its job's, and this holds its pieces of them as JSON (`counted`: one flag or one
    # per parameter; `local_numel`: null, every piece whole, or one count per parameter).
    Column("pieces", Text),
)

# Runs deleted (DELETE /api/runs/{id}, `gradwatch gc`), by id: a request for one is answered
# "deleted" rather than "no such run" (a page open on it, a link kept). No foreign key: the run's
# row is gone. A run that arrives again under the same id (a replayed spool) leaves this table.
deleted_runs = Table(
    "deleted_runs",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("deleted_at", Double, nullable=False),  # Unix seconds
)

params = Table(
    "params",
    metadata,
    _run_id(),
    Column("idx", Integer, primary_key=True),  # position in the per-parameter arrays
    Column("name", Text, nullable=False),
    Column("shape", Text, nullable=False),  # JSON list
    Column("numel", BigInteger, nullable=False),
    Column("dtype", String(32), nullable=False),
    Column("group_idx", Integer, nullable=False),
    Column("optimizer_idx", Integer, nullable=False),
    # A rank's piece of the parameter (child runs of a distributed job only; NULL elsewhere):
    # its element count, and whether it counts toward the global value (a replica counts once).
    Column("local_numel", BigInteger),
    Column("counted", Boolean),
    sqlite_with_rowid=False,
)

groups = Table(
    "groups",
    metadata,
    _run_id(),
    Column("optimizer_idx", Integer, primary_key=True),
    Column("idx", Integer, primary_key=True),
    Column("name", Text),
    Column("hparams", Text, nullable=False),  # JSON object
    sqlite_with_rowid=False,
)

steps = Table(
    "steps",
    metadata,
    _run_id(),
    Column("step", BigInteger, primary_key=True),
    Column("seq", BigInteger, nullable=False),
    Column("time", Double, nullable=False),
    sqlite_with_rowid=False,
)

# A scalar is `value` unless `special` says otherwise: SQLite turns NaN into NULL and -0.0 into 0,
# so NaN is `value` NULL with `special` 1 and -0.0 is `value` 0 with `special` 2 (store/values.py). A
# query like `value < 0.1` thus never matches a NaN; infinities are stored as themselves.
scalars = Table(
    "scalars",
    metadata,
    _run_id(),
    Column("key", String(128), primary_key=True),
    Column("step", BigInteger, primary_key=True),
    Column("value", Double),
    Column("special", SmallInteger),
    sqlite_with_rowid=False,
)

# One row per (run, metric, step): `data` is the little-endian array exactly as decoded from the
# wire (float32 'f4', ABSENT and NaN payloads bit for bit, or uint8 'u1' for grad_status).
param_metrics = Table(
    "param_metrics",
    metadata,
    _run_id(),
    Column("metric", String(128), primary_key=True),
    Column("step", BigInteger, primary_key=True),
    Column("data", LargeBinary, nullable=False),
    Column("dtype", String(4), nullable=False),
)

# Summaries of aligned blocks of a series' steps (blocks.py): block `block` of `size` steps,
# [block * size, (block + 1) * size), of a parameter metric (`kind` "param"; parameters
# [part * 64, part * 64 + 64)) or of a scalar ("scalar", part 0), written by ingest once the
# block is closed. `data` is a 20-byte record per parameter, 28 bytes for a scalar (min, max,
# sum, finite and NaN counts): a long window reads a few thousand small rows, not a row per step.
# Rows up to 1.3 KB: a rowid table, like param_metrics. Keyed block before part: ingest and the
# heatmap read every part of a range of blocks.
metric_blocks = Table(
    "metric_blocks",
    metadata,
    _run_id(),
    Column("kind", String(8), primary_key=True),  # param | scalar
    Column("metric", String(128), primary_key=True),
    Column("size", Integer, primary_key=True),
    Column("block", BigInteger, primary_key=True),
    Column("part", Integer, primary_key=True),
    Column("first_step", BigInteger, nullable=False),
    Column("step_count", Integer, nullable=False),
    Column("data", LargeBinary, nullable=False),
)

# The steps of a job's parent run assembled without some rank (it had sent nothing for
# --rank-timeout while others went on, or it closed early): `missing` is the JSON list of the
# ranks that had not sent the step when it was assembled. Once every one of them has stored the
# step it is assembled again and its row here goes (store/jobs.py).
partial_steps = Table(
    "partial_steps",
    metadata,
    _run_id(),
    Column("step", BigInteger, primary_key=True),
    Column("missing", Text, nullable=False),
    sqlite_with_rowid=False,
)

# A rank's summary of each of its steps (a row of about 100 bytes): its step time, time before
# backward, memory (the largest CUDA peak, else the resident memory) and local total gradient norm.
# Written by the job's assembly for every rank step it combined before migration 0010 (since then
# a rank step's summary is in its `rank_steps` row); the rows stay, read beside those.
rank_summaries = Table(
    "rank_summaries",
    metadata,
    _run_id(),
    Column("step", BigInteger, primary_key=True),
    Column("time", Double, nullable=False),
    Column("step_s", Double),
    Column("before_backward_s", Double),
    Column("memory_bytes", Double),
    Column("local_norm", Double),
    sqlite_with_rowid=False,
)

# A rank's step as one row (since migration 0010; store/rank_rows.py): what `steps`, `scalars`
# and `rank_summaries` held of it in about 20 rows. The summary in columns (as rank_summaries:
# kept for the whole job), and, for the Ranks view's recent window only (store/jobs.py RANK_WINDOW),
# the rank's scalars packed (`scalars`: float64 values in the order of its key set `key_set`, a
# rank_keys row) and a DDP replica's `grad_digest` (so that a comparison survives a restart and
# works across workers). Past the window those three are dropped: the row is its summary.
# Rows of ranks stored before 0010 stay in `steps`, `scalars` and `rank_summaries`, read as before.
rank_steps = Table(
    "rank_steps",
    metadata,
    _run_id(),
    Column("step", BigInteger, primary_key=True),
    Column("seq", BigInteger, nullable=False),
    Column("time", Double, nullable=False),
    Column("step_s", Double),
    Column("before_backward_s", Double),
    Column("memory_bytes", Double),
    Column("local_norm", Double),
    Column("digest", String(64)),
    Column("key_set", BigInteger),
    Column("scalars", LargeBinary),
    sqlite_with_rowid=False,
)

# The key sets of a rank's packed scalars (rank_steps.key_set): `id` is a hash of the keys in order
# (`keys`, a JSON list), so that any process stores the same set under the same id without
# coordinating; a rank has a few (its measured and unmeasured steps').
rank_keys = Table(
    "rank_keys",
    metadata,
    _run_id(),
    Column("id", BigInteger, primary_key=True),
    Column("keys", Text, nullable=False),
    sqlite_with_rowid=False,
)

# The spread of a per-rank figure across a job's ranks at each of its steps (what the Ranks
# section of a big job draws, GET /api/runs/{job}/ranks/spread): the finite values' count and
# quantiles (min, p5, p50, p95, max) of `metric` (store/spread.py METRICS) over the ranks'
# summaries of the step, written by the assembly with them (migration 0008). A window of 300
# steps of a 1,024-rank job is then 300 rows, not 307,200 summaries read and sorted per request.
rank_spread = Table(
    "rank_spread",
    metadata,
    _run_id(),
    Column("metric", String(32), primary_key=True),
    Column("step", BigInteger, primary_key=True),
    Column("count", Integer, nullable=False),
    Column("lo", Double),
    Column("p5", Double),
    Column("p50", Double),
    Column("p95", Double),
    Column("hi", Double),
    sqlite_with_rowid=False,
)

# The names of a run's series, so that listing them does not scan every stored value.
series_names = Table(
    "series_names",
    metadata,
    _run_id(),
    Column("kind", String(8), primary_key=True),  # scalar | param
    Column("name", String(128), primary_key=True),
    sqlite_with_rowid=False,
)

# A run's tags, set with PATCH /api/runs/{id}. A table of its own rather than a JSON column of
# `runs`: `GET /api/runs?tag=x` is then an exact, indexed match on both databases (a substring
# match on JSON text would find `x` inside another tag that holds `"x"`), and a run's tags go
# with it by ON DELETE CASCADE. `position` keeps the order the user gave.
run_tags = Table(
    "run_tags",
    metadata,
    _run_id(),
    Column("tag", String(64), primary_key=True, index=True),
    Column("position", Integer, nullable=False),
    sqlite_with_rowid=False,
)

# What the diagnostics engine found about a run (diagnostics/): one row per finding code, kept
# up to date while the run streams. `params` is a JSON list of parameter names, `figure` a JSON
# object ({label, value, unit, text}) or NULL.
findings = Table(
    "findings",
    metadata,
    _run_id(),
    Column("code", String(64), primary_key=True),
    Column("severity", String(16), nullable=False),  # error | warning | info
    Column("message", Text, nullable=False),
    Column("params", Text, nullable=False),
    Column("first_step", BigInteger),
    Column("figure", Text),
    Column("updated_at", Double, nullable=False),
    sqlite_with_rowid=False,
)

# How far the stored findings of a run go: they cover its first `steps` stored steps, derived by
# the rules of `version`. A run whose row is missing, behind its step count or of an older
# version is diagnosed again from its stored steps when its findings are asked for.
diagnoses = Table(
    "diagnoses",
    metadata,
    Column("run_id", String(64), ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
    Column("steps", Integer, nullable=False),
    Column("last_step", BigInteger),
    Column("version", Integer, nullable=False),
    Column("updated_at", Double, nullable=False),
    sqlite_with_rowid=False,
)

"""The per-step table of a run's export (`export?table=steps`): one row per stored step, one
column per scalar (loss, learning rates, total gradient norm, memory, user scalars...).

Columns are `step`, `time`, then every scalar the run has, sorted; a scalar a step lacks is an
empty CSV cell, null in JSON and Parquet. NaN and infinities are data: `nan`/`inf` in CSV,
"NaN"/"Infinity" in JSON lines, IEEE values in Parquet. Like the per-parameter table it is read
a chunk of steps at a time and streamed, and a distributed job's has its ranks' rows after its
own, with a last column `rank`, unless `ranks=False` (exporters.py).
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Iterator
from pathlib import Path

from .exporters import (
    RANK_COLUMN,
    Format,
    Progress,
    Source,
    csv_chunks,
    export_sources,
    parquet_metadata,
    rank_cell,
    ranked,
    ranked_chunks,
    safe_cell,
    series_union,
)
from .jsonvalues import word
from .store import Run, Store, StoredStep

#: Steps read at once: scalars only, a few dozen values a step.
CHUNK_STEPS = 2048


def step_columns(keys: list[str]) -> list[str]:
    """Header of the table: step, time, then the scalars, sorted."""
    return ["step", "time", *sorted(keys)]


def _chunks(store: Store, sources: list[Source]) -> Iterator[tuple[int | None, list[StoredStep]]]:
    return ranked_chunks(sources, lambda source: store.iter_steps(source.id, metrics=[], chunk=CHUNK_STEPS))


def _cell(value: float | None) -> str:
    if value is None:
        return ""
    return repr(value) if math.isfinite(value) else ("nan" if math.isnan(value) else ("inf" if value > 0 else "-inf"))


def steps_csv(store: Store, run: Run, progress: Progress | None = None, *, ranks: bool = True) -> Iterator[bytes]:
    sources = export_sources(store, run, ranks)
    keys = series_union(store, sources, "scalar")
    with_rank = ranked(run, ranks)

    def rows(rank: int | None, chunk: list[StoredStep]) -> Iterator[list[object]]:
        for r in chunk:
            row: list[object] = [r.step, repr(r.time), *(_cell(r.scalars.get(k)) for k in keys)]
            yield [*row, rank_cell(rank)] if with_rank else row

    header = [safe_cell(c) for c in step_columns(keys)] + ([RANK_COLUMN] if with_rank else [])
    return csv_chunks(header, _chunks(store, sources), rows, progress)


def steps_jsonl(store: Store, run: Run, progress: Progress | None = None, *, ranks: bool = True) -> Iterator[bytes]:
    """One JSON object a line: {"step", "time", then each scalar the step has}; a job's lines
    have `rank` after `time` (null on its global steps)."""
    with_rank = ranked(run, ranks)
    for rank, chunk in _chunks(store, export_sources(store, run, ranks)):
        field = {RANK_COLUMN: rank} if with_rank else {}
        lines = [
            json.dumps(
                {"step": r.step, "time": r.time, **field, **{k: word(v) for k, v in r.scalars.items()}},
                allow_nan=False,
                separators=(",", ":"),
            )
            for r in chunk
        ]
        yield ("\n".join(lines) + "\n").encode()
        if progress:
            progress(len(chunk))


def steps_parquet(store: Store, run: Run, progress: Progress | None = None, *, ranks: bool = True) -> Iterator[bytes]:
    """The table as Parquet (float64 scalars, null where a step lacks one; a job's `rank` int32,
    null on its global rows), the run's description in the file's metadata; streamed from a
    temporary file as the per-parameter Parquet is. pyarrow is imported here only, as in exporters."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    sources = export_sources(store, run, ranks)
    keys = series_union(store, sources, "scalar")
    with_rank = ranked(run, ranks)
    fields = [pa.field("step", pa.int64()), pa.field("time", pa.float64()), *(pa.field(k, pa.float64()) for k in keys)]
    if with_rank:
        fields.append(pa.field(RANK_COLUMN, pa.int32()))
    schema = pa.schema(fields, metadata=parquet_metadata(store, run))
    with tempfile.TemporaryDirectory(prefix="gradwatch-export-") as tmp:
        path = Path(tmp) / "steps.parquet"
        writer = pq.ParquetWriter(str(path), schema)
        with open(path, "rb") as landed:
            try:
                for rank, chunk in _chunks(store, sources):
                    data = {
                        "step": pa.array([r.step for r in chunk], pa.int64()),
                        "time": pa.array([r.time for r in chunk], pa.float64()),
                    }
                    for k in keys:
                        data[k] = pa.array([r.scalars.get(k) for r in chunk], pa.float64())
                    if with_rank:
                        data[RANK_COLUMN] = pa.array([rank] * len(chunk), pa.int32())
                    writer.write_table(pa.table(data, schema=schema))
                    if progress:
                        progress(len(chunk))
                    if landed_bytes := landed.read():
                        yield landed_bytes
            finally:
                writer.close()
            yield landed.read()


STEP_FORMATS: dict[str, Format] = {
    "csv": Format("csv", "text/csv; charset=utf-8", steps_csv),
    "json": Format("jsonl", "application/x-ndjson", steps_jsonl),
    "parquet": Format("parquet", "application/vnd.apache.parquet", steps_parquet),
}

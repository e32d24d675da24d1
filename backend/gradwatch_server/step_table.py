"""The per-step table of a run's export (`export?table=steps`): one row per stored step, one
column per scalar (loss, learning rates, total gradient norm, memory, user scalars...).

Columns are `step`, `time`, then every scalar the run has, sorted; a scalar a step lacks is an
empty CSV cell, null in JSON and Parquet. NaN and infinities are data: `nan`/`inf` in CSV,
"NaN"/"Infinity" in JSON lines, IEEE values in Parquet. Like the per-parameter table it is read
a chunk of steps at a time and streamed.
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from .exporters import Format, Progress, csv_chunks, parquet_metadata, safe_cell
from .jsonvalues import word
from .store import Run, StepRecord, Store

#: Steps read at once: scalars only, a few dozen values a step.
CHUNK_STEPS = 2048


def step_columns(keys: list[str]) -> list[str]:
    """Header of the table: step, time, then the scalars, sorted."""
    return ["step", "time", *sorted(keys)]


def _chunks(store: Store, run: Run) -> Iterator[list[StepRecord]]:
    return store.iter_steps(run.id, metrics=[], chunk=CHUNK_STEPS)


def _cell(value: float | None) -> str:
    if value is None:
        return ""
    return repr(value) if math.isfinite(value) else ("nan" if math.isnan(value) else ("inf" if value > 0 else "-inf"))


def steps_csv(store: Store, run: Run, progress: Progress | None = None) -> Iterator[bytes]:
    keys = sorted(store.series_names(run.id, "scalar"))

    def rows(chunk: list[StepRecord]) -> Iterator[list[object]]:
        for r in chunk:
            yield [r.step, repr(r.time), *(_cell(r.scalars.get(k)) for k in keys)]

    return csv_chunks([safe_cell(c) for c in step_columns(keys)], _chunks(store, run), rows, progress)


def steps_jsonl(store: Store, run: Run, progress: Progress | None = None) -> Iterator[bytes]:
    """One JSON object a line: {"step", "time", then each scalar the step has}."""
    for chunk in _chunks(store, run):
        lines = [
            json.dumps(
                {"step": r.step, "time": r.time, **{k: word(v) for k, v in r.scalars.items()}},
                allow_nan=False,
                separators=(",", ":"),
            )
            for r in chunk
        ]
        yield ("\n".join(lines) + "\n").encode()
        if progress:
            progress(len(chunk))


def steps_parquet(store: Store, run: Run, progress: Progress | None = None) -> Iterator[bytes]:
    """The table as Parquet (float64 scalars, null where a step lacks one), the run's description
    in the file's metadata; streamed from a temporary file as the per-parameter Parquet is."""
    keys = sorted(store.series_names(run.id, "scalar"))
    schema = pa.schema(
        [pa.field("step", pa.int64()), pa.field("time", pa.float64()), *(pa.field(k, pa.float64()) for k in keys)],
        metadata=parquet_metadata(store, run),
    )
    with tempfile.TemporaryDirectory(prefix="gradwatch-export-") as tmp:
        path = Path(tmp) / "steps.parquet"
        writer = pq.ParquetWriter(str(path), schema)
        with open(path, "rb") as landed:
            try:
                for chunk in _chunks(store, run):
                    data = {
                        "step": pa.array([r.step for r in chunk], pa.int64()),
                        "time": pa.array([r.time for r in chunk], pa.float64()),
                    }
                    for k in keys:
                        data[k] = pa.array([r.scalars.get(k) for r in chunk], pa.float64())
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

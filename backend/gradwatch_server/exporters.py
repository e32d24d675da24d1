"""Run exports as byte streams: CSV, JSON lines, Parquet (docs/api.md, Export).

Each exporter is a generator that reads the run a chunk of steps at a time (`Store.iter_steps`)
and yields encoded bytes, so neither the server nor the CLI ever holds a whole run in memory.
NaN and infinities are written as data: `nan`/`inf` in CSV, "NaN"/"Infinity" in JSON lines,
IEEE values in Parquet; ABSENT is an empty CSV cell, null in JSON, a null in Parquet.

A distributed job's run (`export_sources`) exports its global rows, then each rank's own rows
(its child run's, by rank), with a last column `rank`: empty (null) on the global rows, the
rank on the others. With `ranks=False` it exports its global rows alone, without the column, as
a single-process run's export is.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import re
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

import numpy as np

from .jobs.ranks import is_job
from .jsonvalues import metric_list, word
from .models import ParamPublic, RunPublic
from .protocol import GRAD_STATUS, GRAD_STATUS_NAMES, absent_mask
from .store import Param, Run, Store, StoredStep

if TYPE_CHECKING:
    # pyarrow is imported by the Parquet exports only: a server that never exports Parquet must
    # not pay for importing it at every start.
    import pyarrow as pa

#: The CSV's leading columns, in this order, whether or not the run has them (contract).
FIXED_METRICS = ("grad_norm", GRAD_STATUS, "param_norm", "exp_avg_norm", "exp_avg_sq_norm")

Progress = Callable[[int], None]
"""Called with the number of steps just written (for a progress bar)."""

#: The last column of a distributed job's export: the rank of the row's child run, empty on the
#: job's global rows.
RANK_COLUMN = "rank"

#: A run whose rows an export holds, and the rank they carry (None: the job's global rows, or
#: a single-process run's).
Source = tuple[Run, int | None]

T = TypeVar("T")


def export_sources(store: Store, run: Run, ranks: bool = True) -> list[Source]:
    """The runs an export of `run` reads, in order: the run itself; for a distributed job's run
    (unless `ranks` is False), then each rank's own run, by rank."""
    if not ranked(run, ranks):
        return [(run, None)]
    return [(run, None), *((child, child.rank) for child in store.rank_runs(run.id))]


def ranked(run: Run, ranks: bool) -> bool:
    """Whether an export of `run` has the `rank` column: a job's, unless its ranks are left out."""
    return ranks and is_job(run)


def export_steps(store: Store, run: Run, ranks: bool = True) -> int:
    """The steps an export of `run` writes (for a progress bar): its own and its ranks'."""
    return sum(source.steps for source, _ in export_sources(store, run, ranks))


def series_union(store: Store, sources: list[Source], kind: str) -> list[str]:
    """The names of the series (`kind` "scalar" or "param") any of `sources` has, sorted."""
    return sorted({name for source, _ in sources for name in store.series_names(source.id, kind)})


def rank_cell(rank: int | None) -> str:
    return "" if rank is None else str(rank)


#: (step, parameter) rows read and encoded at once: bounds an export's memory whatever the
#: model's width (a chunk of steps would grow with the number of parameters).
CHUNK_ROWS = 65536


def chunk_steps(params: int) -> int:
    """Steps per read of an export: about CHUNK_ROWS rows, 1 to 256 steps."""
    return max(1, min(256, CHUNK_ROWS // max(1, params)))


def csv_columns(metrics: list[str]) -> list[str]:
    """Header of the CSV and Parquet table: step, param, the fixed metrics, then the others sorted."""
    return ["step", "param", *FIXED_METRICS, *sorted(set(metrics) - set(FIXED_METRICS))]


def safe_filename(run: Run, suffix: str) -> str:
    """A download name made of [A-Za-z0-9._-] only, from the run's name (its id if nothing is left)."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", run.name).strip("._") or run.id
    return f"{stem[:100]}.{suffix}"


_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def safe_cell(text: str) -> str:
    """Defuse spreadsheet formulas: text starting with = + - @ gets a leading quote; numbers do not."""
    if text.startswith(_FORMULA_START):
        try:
            float(text)
        except ValueError:
            return "'" + text
    return text


def _text_column(values: np.ndarray | None, count: int) -> np.ndarray:
    """One metric of one step as CSV text: shortest float32 repr, nan/inf, '' for ABSENT."""
    if values is None:
        return np.full(count, "", dtype=object)
    if values.dtype.kind == "u":  # grad_status codes
        words: np.ndarray = np.array(GRAD_STATUS_NAMES, dtype=object)[values]
        return words
    # A metric that is one value across the step (backward passes, how .grad was cleared) is
    # written once: the float-to-text conversion is most of an export's time. Compared by bits,
    # so that 0.0 and -0.0, or two NaNs, are never taken for each other.
    bits = values.view(f"u{values.itemsize}")
    if len(bits) > 1 and bool((bits == bits[0]).all()):
        return np.repeat(_text_column(values[:1], 1), len(values))
    text: np.ndarray = values.astype(str).astype(object)
    text[absent_mask(values)] = ""
    return text


def csv_chunks(
    header: list[str],
    chunks: Iterable[tuple[int | None, list[T]]],
    rows: Callable[[int | None, list[T]], Iterable[Iterable[object]]],
    progress: Progress | None = None,
) -> Iterator[bytes]:
    """CSV bytes: the header, then `rows(rank, chunk)` for each chunk of steps (with the rank its
    rows carry), one piece per chunk."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    for rank, chunk in chunks:
        writer.writerows(rows(rank, chunk))
        yield buffer.getvalue().encode()
        buffer.seek(0)
        buffer.truncate()
        if progress:
            progress(len(chunk))
    if buffer.tell():
        yield buffer.getvalue().encode()


def ranked_chunks(
    sources: list[Source], read: Callable[[Run], Iterable[list[T]]]
) -> Iterator[tuple[int | None, list[T]]]:
    """Each source's chunks of steps (`read(run)`), in order, with the rank its rows carry."""
    for source, rank in sources:
        for chunk in read(source):
            yield rank, chunk


def export_csv(store: Store, run: Run, progress: Progress | None = None, *, ranks: bool = True) -> Iterator[bytes]:
    params = store.get_params(run.id)
    names = np.array([safe_cell(p.name) for p in params], dtype=object)
    sources = export_sources(store, run, ranks)
    columns = csv_columns(series_union(store, sources, "param"))
    with_rank = ranked(run, ranks)

    def step_rows(rank: int | None, record: StoredStep) -> Iterator[tuple[object, ...]]:
        cells = [np.full(len(params), str(record.step), dtype=object), names]
        cells += [_text_column(record.arrays.get(m), len(params)) for m in columns[2:]]
        if with_rank:
            cells.append(np.full(len(params), rank_cell(rank), dtype=object))
        return zip(*cells)

    def rows(rank: int | None, chunk: list[StoredStep]) -> Iterable[Iterable[object]]:
        # The rows are chained in C: a generator resumed once per row costs an export of a
        # million rows about a tenth of its time.
        return itertools.chain.from_iterable(step_rows(rank, record) for record in chunk)

    def read(source: Run) -> Iterator[list[StoredStep]]:
        return store.iter_steps(source.id, with_scalars=False, chunk=chunk_steps(len(params)))

    header = [*columns, RANK_COLUMN] if with_rank else columns
    return csv_chunks(header, ranked_chunks(sources, read), rows, progress)


def _json_line(obj: object) -> bytes:
    return json.dumps(obj, allow_nan=False, separators=(",", ":")).encode() + b"\n"


def _step_line(record: StoredStep, rank: dict[str, int | None]) -> dict[str, object]:
    status = record.arrays.get(GRAD_STATUS)
    return {
        "type": "step",
        **rank,
        "step": record.step,
        "seq": record.seq,
        "time": record.time,
        "scalars": {k: word(v) for k, v in record.scalars.items()},
        "params": {m: metric_list(v) for m, v in sorted(record.arrays.items()) if m != GRAD_STATUS},
        "grad_status": None if status is None else status.tolist(),
    }


def _run_line(store: Store, run: Run, params: list[Param]) -> dict[str, object]:
    return {
        "type": "run",
        # Not the findings counts: they are derived, and the importing server derives them again.
        "run": RunPublic.of(run).model_dump(exclude={"findings"}),
        "params": [ParamPublic.of(p).model_dump() for p in params],
        "groups": [asdict(g) for g in store.get_groups(run.id)],
    }


#: Key of the run's description in an exported Parquet file's metadata.
PARQUET_RUN_KEY = b"gradwatch.run"


def parquet_metadata(store: Store, run: Run) -> dict[bytes, bytes]:
    """The run as the JSON export's first line describes it (its config with the context the hook
    recorded, its param groups; not the parameter list, which the table's rows name), as
    Parquet key-value metadata: a Parquet file alone says which run, code and settings it holds."""
    line = _run_line(store, run, [])
    del line["params"]
    return {PARQUET_RUN_KEY: json.dumps(line, allow_nan=False, separators=(",", ":")).encode()}


def export_jsonl(store: Store, run: Run, progress: Progress | None = None, *, ranks: bool = True) -> Iterator[bytes]:
    """First a run line (run, params, groups), then one line per step; `gradwatch import` reads it.
    A job's step lines carry `rank` (null on its global steps), its ranks' steps after its own."""
    params = store.get_params(run.id)
    with_rank = ranked(run, ranks)
    yield _json_line(_run_line(store, run, params))
    for rank, chunk in ranked_chunks(
        export_sources(store, run, ranks), lambda source: store.iter_steps(source.id, chunk=chunk_steps(len(params)))
    ):
        field = {RANK_COLUMN: rank} if with_rank else {}
        yield b"".join(_json_line(_step_line(r, field)) for r in chunk)
        if progress:
            progress(len(chunk))


def _arrow_schema(columns: list[str], with_rank: bool) -> pa.Schema:
    import pyarrow as pa

    fields = [pa.field("step", pa.int64()), pa.field("param", pa.string())]
    fields += [pa.field(c, pa.string() if c == GRAD_STATUS else pa.float32()) for c in columns[2:]]
    if with_rank:
        fields.append(pa.field(RANK_COLUMN, pa.int32()))
    return pa.schema(fields)


def _arrow_chunk(schema: pa.Schema, params: list[Param], rank: int | None, chunk: list[StoredStep]) -> pa.Table:
    import pyarrow as pa

    n, p = len(chunk), len(params)
    data: dict[str, pa.Array] = {
        "step": pa.array(np.repeat([r.step for r in chunk], p).astype(np.int64)),
        "param": pa.array([param.name for param in params] * n, type=pa.string()),
    }
    if RANK_COLUMN in schema.names:
        data[RANK_COLUMN] = pa.array([rank] * (n * p), type=pa.int32())
    for name in schema.names[2:]:
        if name == RANK_COLUMN:
            continue
        present = [r.arrays.get(name) for r in chunk]
        if name == GRAD_STATUS:
            words = np.array(GRAD_STATUS_NAMES + (None,), dtype=object)
            codes = np.concatenate([a if a is not None else np.full(p, 4, "u1") for a in present])
            data[name] = pa.array(words[codes.astype(np.int64)].tolist(), type=pa.string())
        else:
            values = np.concatenate([a if a is not None else np.full(p, np.nan, "<f4") for a in present])
            missing = np.concatenate([absent_mask(a) if a is not None else np.ones(p, bool) for a in present])
            data[name] = pa.array(values, mask=missing, type=pa.float32())
    return pa.table(data, schema=schema)


def export_parquet(store: Store, run: Run, progress: Progress | None = None, *, ranks: bool = True) -> Iterator[bytes]:
    """The CSV's table as Parquet, one row group per chunk of steps, the run's description in the
    file's metadata (`parquet_metadata`).

    pyarrow writes to a temporary file, and the bytes are passed on as they land there:
    Parquet needs its footer last, and a native file keeps pyarrow off Python file objects.
    """
    import pyarrow.parquet as pq

    params = store.get_params(run.id)
    sources = export_sources(store, run, ranks)
    schema = _arrow_schema(csv_columns(series_union(store, sources, "param")), ranked(run, ranks))
    schema = schema.with_metadata(parquet_metadata(store, run))
    with tempfile.TemporaryDirectory(prefix="gradwatch-export-") as tmp:
        path = Path(tmp) / "run.parquet"
        writer = pq.ParquetWriter(str(path), schema)
        with open(path, "rb") as landed:
            try:
                chunks = ranked_chunks(
                    sources,
                    lambda source: store.iter_steps(source.id, with_scalars=False, chunk=chunk_steps(len(params))),
                )
                for rank, chunk in chunks:
                    writer.write_table(_arrow_chunk(schema, params, rank, chunk))
                    if progress:
                        progress(len(chunk))
                    if data := landed.read():
                        yield data
            finally:
                writer.close()
            yield landed.read()


class Writer(Protocol):
    """An exporter: the run's bytes, a chunk at a time; `ranks=False` leaves a job's ranks' rows out."""

    def __call__(
        self, store: Store, run: Run, progress: Progress | None = None, *, ranks: bool = True
    ) -> Iterator[bytes]: ...


@dataclass(frozen=True)
class Format:
    suffix: str
    media_type: str
    write: Writer


FORMATS: dict[str, Format] = {
    "csv": Format("csv", "text/csv; charset=utf-8", export_csv),
    "json": Format("jsonl", "application/x-ndjson", export_jsonl),
    "parquet": Format("parquet", "application/vnd.apache.parquet", export_parquet),
}

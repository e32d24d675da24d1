"""The SQL of step blocks (blocks.py): keep the closed blocks of every series up to date as steps
are stored, and read a series' summaries back from blocks and raw rows."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from sqlalchemy import Connection, bindparam, delete, func, or_, select

from .. import blocks
from ..protocol import absent_mask, array_dtype
from ..schema import metric_blocks, param_metrics, runs, series_names, steps
from ..schema import scalars as scalars_table
from ..tails import BlockRow, BlockRows, Closed, Computed, WrittenStep
from .rows import insert_plain, joined, metric_where, plain_rows
from .values import scalar_columns

#: Blocks of one size recomputed per query: bounds ingest's and the backfill's memory to this
#: many x 4 (or x 16 raw steps) x parameters x 40 bytes.
_BLOCK_BATCH = 64

#: The run's series, read at every stored batch: built once (its construction and cache key cost
#: more than SQLite's answer).
_SERIES_NAMES = select(series_names.c.kind, series_names.c.name).where(series_names.c.run_id == bindparam("run_id"))


def _ranges(numbers: Sequence[int]) -> list[tuple[int, int]]:
    """Sorted integers as ranges of consecutive ones: [1, 2, 3, 7] -> [(1, 3), (7, 7)]."""
    out: list[tuple[int, int]] = []
    for n in numbers:
        if out and n == out[-1][1] + 1:
            out[-1] = (out[-1][0], n)
        else:
            out.append((n, n))
    return out


def update_blocks(
    conn: Connection,
    run_id: str,
    new_steps: list[int],
    before: int | None,
    after: int,
    stored: Sequence[WrittenStep] | None = None,
    kinds: Sequence[str] = tuple(blocks.RECORDS),
    held: Mapping[int, Closed] | None = None,
) -> Computed:
    """Recompute the closed blocks that storing `new_steps` changed or closed (blocks.dirty),
    of every series of the run, in the caller's transaction: per kind and size, one query reads
    what they are made of (raw rows for the smallest size, blocks of the size below for the
    others), one deletes them and one inserts them, whatever the number of series. Returns what
    it computed (tails.next_closed keeps the blocks a larger one will be made of).

    `stored`: every stored step of the smallest blocks to recompute, when the store has them in
    memory (tails.py); then the raw rows are not read back. `held`: the closed blocks the store
    keeps in memory (tails.Closed, per size); a larger block made only of blocks it holds, or of
    blocks this write computed that were never stored before, is not read back either. Blocks
    never closed before (numbered from `closed(size, before)` on) were never written, so they
    need no delete. `kinds`: the kinds of series that get blocks."""
    todo = blocks.dirty(new_steps, before, after)
    if not todo[blocks.SIZES[0]]:
        return {}
    names = conn.execute(_SERIES_NAMES, {"run_id": run_id}).all()
    computed: Computed = {size: (todo[size], {}) for size in blocks.SIZES}
    for kind in kinds:
        mine = [name for k, name in names if k == kind]
        for i, size in enumerate(blocks.SIZES):
            numbers = todo[size] if mine else []
            for lo in range(0, len(numbers), _BLOCK_BATCH):
                ranges = _ranges(numbers[lo : lo + _BLOCK_BATCH])
                if i == 0:
                    spans = [(a * size, (b + 1) * size - 1) for a, b in ranges]
                    if stored is not None:
                        found = _memory_stretches_of(stored, kind, spans, size)
                    else:
                        found = (_raw_stretches_of if kind == "param" else _raw_scalar_stretches_of)(
                            conn, run_id, mine, spans, size
                        )
                else:
                    ratio = size // blocks.SIZES[i - 1]
                    smaller = blocks.SIZES[i - 1]
                    wanted = [(a * ratio, (b + 1) * ratio - 1) for a, b in ranges]
                    level = None if held is None else held.get(smaller)
                    start = level.start if level is not None else blocks.closed(smaller, before)
                    if wanted[0][0] >= start:  # every block below is in memory or was computed now
                        found = _kept_stretches_of(kind, mine, wanted, level, computed[smaller], blocks.RECORDS[kind])
                    else:
                        found = _block_stretches_of(conn, run_id, kind, mine, smaller, wanted)
                made = _put_blocks(
                    conn,
                    run_id,
                    kind,
                    mine,
                    size,
                    ranges,
                    # raw steps are read a stretch per block already (grouping them again
                    # changes nothing, at a few numpy calls per series)
                    found if i == 0 else _grouped(found, size),
                    blocks.closed(size, before),
                )
                rows = computed[size][1]
                for name, mine_rows in made.items():
                    rows.setdefault((kind, name), {}).update(mine_rows)
    return computed


def _kept_stretches_of(
    kind: str,
    names: list[str],
    ranges: list[tuple[int, int]],
    level: Closed | None,
    now: tuple[list[int], BlockRows],
    record: np.dtype,
) -> dict[str, blocks.Stretches]:
    """What `_block_stretches_of` reads, from the blocks kept in memory (`level`, numbered from its
    start on) and those this write computed (`now`: the numbers recomputed, and their rows)."""
    redone, made = set(now[0]), now[1]
    kept = level.rows if level is not None else {}
    found = {}
    for name in names:
        key = (kind, name)
        fresh, old = made.get(key, {}), kept.get(key, {})
        rows: list[BlockRow] = []
        for a, b in ranges:
            for n in range(a, b + 1):
                row = fresh.get(n) if n in redone else old.get(n)
                if row is not None:
                    rows.append(row)
        if rows:
            found[name] = blocks.from_records(
                np.array([r[0] for r in rows], dtype=np.int64),
                np.array([r[1] for r in rows], dtype=np.int64),
                np.stack([r[2] for r in rows]).astype(record, copy=False),
            )
    return found


def _grouped(found: Mapping[str, blocks.Stretches], size: int) -> dict[str, blocks.Stretches]:
    """`blocks.group(stretches, size)` of each series: in one call for all where they hold the
    same blocks (the usual case), a column each (the reductions run down the columns, so each
    series gets what it would alone, at the numpy calls of one)."""
    items = list(found.items())
    head = items[0][1] if items else None
    if (
        head is None
        or len(items) == 1
        or not all(
            np.array_equal(p.first, head.first) and np.array_equal(p.rows, head.rows) and p.low.dtype == head.low.dtype
            for _, p in items
        )
    ):
        return {m: blocks.group(p, size) for m, p in items}
    widths = np.cumsum([0] + [p.low.shape[1] for _, p in items])
    fields = ("low", "high", "total", "finite", "nan")
    together = blocks.group(
        blocks.Stretches(
            head.first, head.rows, *(np.concatenate([getattr(p, f) for _, p in items], axis=1) for f in fields)
        ),
        size,
    )
    return {
        m: blocks.Stretches(
            together.first, together.rows, *(getattr(together, f)[:, widths[j] : widths[j + 1]] for f in fields)
        )
        for j, (m, _) in enumerate(items)
    }


def _put_blocks(
    conn: Connection,
    run_id: str,
    kind: str,
    names: list[str],
    size: int,
    ranges: list[tuple[int, int]],
    found: Mapping[str, blocks.Stretches],
    fresh: int = 0,
) -> dict[str, dict[int, BlockRow]]:
    """Replace the stored blocks of a size numbered in `ranges` by `found` (per series, one
    stretch per block holding data); those numbered from `fresh` on are known not to be stored.
    Returns the blocks stored, per series and block number."""
    stale = [(a, b) for a, b in ranges if a < fresh]
    if stale:
        conn.execute(
            delete(metric_blocks).where(
                metric_blocks.c.run_id == run_id,
                metric_blocks.c.kind == kind,
                metric_blocks.c.metric.in_(names),
                metric_blocks.c.size == size,
                or_(*[metric_blocks.c.block.between(a, b) for a, b in stale]),
            )
        )
    rows = []
    made: dict[str, dict[int, BlockRow]] = {}
    for name, stretches in found.items():
        if not len(stretches):
            continue
        records = blocks.to_records(stretches, blocks.RECORDS[kind])
        made[name] = {
            first // size: (first, count, records[j].copy())  # not a view: the rest may go
            for j, (first, count) in enumerate(zip(stretches.first.tolist(), stretches.rows.tolist()))
        }
        parts = -(-records.shape[1] // blocks.PART)
        rows += [
            (
                run_id,
                kind,
                name,
                size,
                first // size,
                part,
                first,
                count,
                records[j, part * blocks.PART : (part + 1) * blocks.PART].tobytes(),
            )
            for j, (first, count) in enumerate(zip(stretches.first.tolist(), stretches.rows.tolist()))
            for part in range(parts)
        ]
    insert_plain(conn, metric_blocks, rows)
    return made


def _split(rows: list[Any]) -> Iterator[tuple[str, list[Any]]]:
    """Rows whose first column is a series name, ordered by it: (name, its rows) in turn."""
    lo = 0
    for hi in range(1, len(rows) + 1):
        if hi == len(rows) or rows[hi][0] != rows[lo][0]:
            yield rows[lo][0], rows[lo:hi]
            lo = hi


def _stretches_of_values(
    metric: str, steps_: list[int], raw: bytes, width: int, size: int | None = None
) -> blocks.Stretches:
    """Stretches of raw rows (their `data` joined): one per step, or per block of `size` steps."""
    dtype = np.dtype("<" + array_dtype(metric))
    values = np.frombuffer(raw, dtype=dtype).reshape(len(steps_), width)
    missing = absent_mask(values) if dtype.kind == "f" else None
    return blocks.from_values(np.array(steps_, dtype=np.int64), values, missing, size)


def _stretches_of_scalars(rows: list[Any], starts: np.ndarray | None = None) -> blocks.Stretches:
    """Stretches of (step, value, special) rows of scalars: one per row, or per group of rows
    beginning at the indices `starts`."""
    steps_, values = scalar_columns(rows)
    return blocks.from_values(steps_, values.reshape(-1, 1), None, dtype=np.float64, starts=starts)


def _raw_stretches_of(
    conn: Connection, run_id: str, metrics: list[str], spans: list[tuple[int, int]], size: int
) -> dict[str, blocks.Stretches]:
    """Per parameter metric, one stretch per block of `size` steps in the step ranges `spans`."""
    rows = plain_rows(
        conn,
        select(param_metrics.c.metric, param_metrics.c.step, param_metrics.c.data)
        .where(
            param_metrics.c.run_id == run_id,
            param_metrics.c.metric.in_(metrics),
            or_(*[param_metrics.c.step.between(a, b) for a, b in spans]),
        )
        .order_by(param_metrics.c.metric, param_metrics.c.step),
    )
    found = {}
    for metric, mine in _split(rows):
        width = len(mine[0][2]) // np.dtype(array_dtype(metric)).itemsize
        found[metric] = _stretches_of_values(metric, [r[1] for r in mine], b"".join(r[2] for r in mine), width, size)
    return found


def _raw_scalar_stretches_of(
    conn: Connection, run_id: str, keys: list[str], spans: list[tuple[int, int]], size: int
) -> dict[str, blocks.Stretches]:
    """Per scalar, one stretch per block of `size` steps in the step ranges `spans`: all scalars
    in one pass (a run logs a few dozen, a few values each per block)."""
    s = scalars_table.c
    rows = plain_rows(
        conn,
        select(s.key, s.step, s.value, s.special)
        .where(s.run_id == run_id, s.key.in_(keys), or_(*[s.step.between(a, b) for a, b in spans]))
        .order_by(s.key, s.step),
    )
    if not rows:
        return {}
    key_of = {k: i for i, k in enumerate(dict.fromkeys(r[0] for r in rows))}
    owner = np.array([key_of[r[0]] for r in rows], dtype=np.int64)
    block = np.array([r[1] for r in rows], dtype=np.int64) // size
    starts = np.flatnonzero((np.diff(owner, prepend=-1) != 0) | (np.diff(block, prepend=block[0] - 1) != 0))
    found = _stretches_of_scalars([r[1:] for r in rows], starts=starts)  # a stretch per (scalar, block)
    ends = np.append(np.flatnonzero(np.diff(owner[starts])) + 1, len(starts))
    out, lo = {}, 0
    for key, hi in zip(key_of, ends.tolist()):
        out[key] = blocks.Stretches(*(getattr(found, f)[lo:hi] for f in blocks.FIELDS))
        lo = hi
    return out


def _step_of(d: WrittenStep) -> int:
    return d.step


def _memory_stretches_of(
    stored: Sequence[WrittenStep], kind: str, spans: list[tuple[int, int]], size: int
) -> dict[str, blocks.Stretches]:
    """What `_raw_stretches_of` / `_raw_scalar_stretches_of` read for the steps in `spans`, from step
    messages in memory instead (every stored step of those spans).

    Series stored at the same steps are reduced together, a column each: reductions run down the
    columns, so each series gets the summaries it would alone, and one call for all of them costs
    about what one per series did."""
    numbers = {n for a, b in spans for n in range(a // size, b // size + 1)}  # spans are whole blocks
    inside = sorted([d for d in stored if d.step // size in numbers], key=_step_of)
    series: dict[str, tuple[list[int], list[Any]]] = {}
    held = [d.arrays if kind == "param" else d.scalars for d in inside]
    if held and all(h.keys() == held[0].keys() for h in held):  # every step has every series: by column
        every_step = [d.step for d in inside]
        series = {name: (every_step, [h[name] for h in held]) for name in held[0]}
    for d, values_of in zip(inside, held) if not series else ():
        for name, value in values_of.items():
            steps_, values = series.setdefault(name, ([], []))
            steps_.append(d.step)
            values.append(value)
    together: dict[tuple[tuple[int, ...], str, int], list[str]] = {}
    for name, (steps_, values) in series.items():
        dtype = np.dtype("<f8") if kind == "scalar" else np.dtype("<" + array_dtype(name))
        width = 1 if kind == "scalar" else len(values[0]) // dtype.itemsize
        together.setdefault((tuple(steps_), dtype.str, width), []).append(name)
    found: dict[str, blocks.Stretches] = {}
    for (at, code, width), names in together.items():
        dtype = np.dtype(code)
        if kind == "scalar":
            matrix = np.array([series[n][1] for n in names], dtype=np.float64).T
            stretches = blocks.from_values(np.array(at, dtype=np.int64), matrix, None, size, dtype=np.float64)
        else:
            matrix = np.concatenate(
                [np.frombuffer(b"".join(series[n][1]), dtype=dtype).reshape(len(at), width) for n in names], axis=1
            )
            missing = absent_mask(matrix) if dtype.kind == "f" else None
            stretches = blocks.from_values(np.array(at, dtype=np.int64), matrix, missing, size)
        for j, name in enumerate(names):
            cols = slice(j * width, (j + 1) * width)
            found[name] = blocks.Stretches(
                stretches.first,
                stretches.rows,
                stretches.low[:, cols],
                stretches.high[:, cols],
                stretches.total[:, cols],
                stretches.finite[:, cols],
                stretches.nan[:, cols],
            )
    return found


def _block_stretches_of(
    conn: Connection, run_id: str, kind: str, names: list[str], size: int, ranges: list[tuple[int, int]]
) -> dict[str, blocks.Stretches]:
    """Per series, its stored blocks of a size numbered in `ranges`, all parameters (each
    block's parts, in order, joined)."""
    b = metric_blocks.c
    rows = plain_rows(
        conn,
        select(b.metric, b.first_step, b.step_count, b.data)
        .where(
            b.run_id == run_id,
            b.kind == kind,
            b.metric.in_(names),
            b.size == size,
            or_(*[b.block.between(lo, hi) for lo, hi in ranges]),
        )
        .order_by(b.metric, b.block, b.part),
    )
    return {name: _joined_blocks([r[1:] for r in mine], blocks.RECORDS[kind]) for name, mine in _split(rows)}


def _joined_blocks(rows: list[Any], record: np.dtype) -> blocks.Stretches:
    """(first_step, step_count, data) rows of whole blocks, ordered by block and part."""
    heads = [i for i, r in enumerate(rows) if i == 0 or r[0] != rows[i - 1][0]]
    records = np.frombuffer(joined(rows, 2), dtype=record).reshape(len(heads), -1)
    return blocks.from_records(
        np.array([rows[i][0] for i in heads], dtype=np.int64),
        np.array([rows[i][1] for i in heads], dtype=np.int64),
        records,
    )


def raw_stretches(
    conn: Connection, run_id: str, kind: str, name: str, a: int, b: int, indices: Sequence[int] | None
) -> blocks.Stretches:
    """One stretch per stored step of a series in [a, b]: a scalar, or a parameter metric for the
    parameters `indices` (read as blob slices) or all of them."""
    if kind == "scalar":
        s = scalars_table.c
        return _stretches_of_scalars(
            plain_rows(
                conn,
                select(s.step, s.value, s.special)
                .where(s.run_id == run_id, s.key == name, s.step.between(a, b))
                .order_by(s.step),
            )
        )
    where = [*metric_where(run_id, name), param_metrics.c.step.between(a, b)]
    if indices is None:
        rows = plain_rows(
            conn, select(param_metrics.c.step, param_metrics.c.data).where(*where).order_by(param_metrics.c.step)
        )
        width = len(rows[0][1]) // np.dtype(array_dtype(name)).itemsize if rows else 0
    else:
        size = np.dtype(array_dtype(name)).itemsize
        rows = plain_rows(
            conn,
            select(param_metrics.c.step, *[func.substr(param_metrics.c.data, i * size + 1, size) for i in indices])
            .where(*where)
            .order_by(param_metrics.c.step),
        )
        width = len(indices)
    return _stretches_of_values(name, [r[0] for r in rows], joined(rows, 1), width)


def stored_stretches(
    conn: Connection, run_id: str, kind: str, name: str, size: int, a: int, b: int, indices: Sequence[int] | None
) -> blocks.Stretches:
    """The stored blocks of a series of a size numbered a..b, for the parameters `indices` (a
    query per part, reading record slices) or all of them (one query)."""
    c = metric_blocks.c
    where = [c.run_id == run_id, c.kind == kind, c.metric == name, c.size == size, c.block.between(a, b)]
    head = [c.first_step, c.step_count]
    record = blocks.RECORDS[kind]
    if indices is None:
        return _joined_blocks(plain_rows(conn, select(*head, c.data).where(*where).order_by(c.block, c.part)), record)
    wanted: dict[int, list[tuple[int, int]]] = {}  # part -> [(position asked, offset in the part)]
    for position, index in enumerate(indices):
        wanted.setdefault(index // blocks.PART, []).append((position, index % blocks.PART))
    rows: list[Any] = []
    columns, order = [], []
    for part, offsets in wanted.items():
        cells = [func.substr(c.data, o * record.itemsize + 1, record.itemsize) for _, o in offsets]
        rows = plain_rows(conn, select(*head, *cells).where(*where, c.part == part).order_by(c.block))
        raw = joined(rows, 2)
        columns.append(np.frombuffer(raw, dtype=record).reshape(len(rows), len(offsets)))
        order += [p for p, _ in offsets]
    if not columns:
        return blocks.empty(0)
    records = np.concatenate(columns, axis=1)[:, np.argsort(order)]
    return blocks.from_records(
        np.array([r[0] for r in rows], dtype=np.int64), np.array([r[1] for r in rows], dtype=np.int64), records
    )


def backfill_blocks(conn: Connection) -> None:
    """Compute the closed blocks of every stored run (migration 0004), a range of the largest
    block size at a time (into the table the migration just made: none is stored yet)."""
    top = blocks.SIZES[-1]
    for run_id, last_step in conn.execute(
        select(runs.c.id, runs.c.last_step).where(runs.c.last_step.is_not(None))
    ).all():
        ranges = (
            conn.execute(select((steps.c.step // top).label("r")).where(steps.c.run_id == run_id).distinct())
            .scalars()
            .all()
        )
        for r in sorted(int(r) for r in ranges):
            found = (
                conn.execute(
                    select(steps.c.step).where(
                        steps.c.run_id == run_id, steps.c.step.between(r * top, (r + 1) * top - 1)
                    )
                )
                .scalars()
                .all()
            )
            update_blocks(conn, run_id, list(found), None, last_step)

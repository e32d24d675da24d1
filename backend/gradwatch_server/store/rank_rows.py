"""A rank's steps as one row each (`rank_steps`, migration 0010): its summary in columns (kept for
the whole job), and, for the recent window only, its scalars packed and a DDP replica's
`grad_digest` (docs/distributed.md, "What the run holds").

One row, not a row per scalar: at a thousand ranks the rows a rank-step makes are the server's
cost, so each is one tuple in one executemany per group commit. The scalars are float64
values (bit for bit: NaN, -0.0) in the order of the frame's keys, a key set stored once per rank
(`rank_keys`, its id a hash of the keys: any worker stores the same set under the same id).

Ranks stored before 0010 keep their rows in `steps`, `scalars` and `rank_summaries`: every
reader here reads both (`legacy_ranks` says once per job whether it has any).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from sqlalchemy import Connection, Subquery, bindparam, delete, insert, select, union_all
from sqlalchemy.dialects import postgresql, sqlite

from ..schema import rank_keys, rank_steps, rank_summaries, steps
from .records import StepData, StoredStep
from .rows import insert_plain, plain_rows

#: What a rank's summary takes from its step's scalars (rank_steps' summary columns).
STEP_S, BEFORE_BACKWARD_S, RSS_BYTES, LOCAL_NORM = (
    "time/step_s",
    "time/before_backward_s",
    "mem/rss_bytes",
    "grad_norm_total",
)


@functools.lru_cache(maxsize=4096)
def keys_id(keys: tuple[str, ...]) -> int:
    """The id of a key set: 63 bits of a BLAKE2b hash of its JSON (the same set, the same id, in
    any process)."""
    raw = hashlib.blake2b(json.dumps(list(keys)).encode(), digest_size=8).digest()
    return int.from_bytes(raw, "little") >> 1


@functools.lru_cache(maxsize=4096)
def _keys_of(text: str) -> tuple[str, ...]:
    return tuple(json.loads(text))


def unpack(keys: Sequence[str], raw: bytes) -> dict[str, float]:
    return dict(zip(keys, struct.unpack(f"<{len(keys)}d", raw), strict=True))


@functools.lru_cache(maxsize=4096)
def _plan(keys: tuple[str, ...]) -> tuple[int | None, int | None, int | None, int | None]:
    """Where a key set holds the summary's four figures: step time, time before backward, memory
    (the allocated bytes of the rank's lowest CUDA device, else its resident memory) and local
    total gradient norm (None: not in the set). Once per key set, not per frame."""
    index = {k: i for i, k in enumerate(keys)}
    cuda = sorted(
        (int(k.split(":")[1].split("/")[0]), k)
        for k in keys
        if k.startswith("mem/cuda:") and k.endswith("/allocated") and k.split(":")[1].split("/")[0].isdigit()
    )
    memory = cuda[0][1] if cuda else RSS_BYTES
    return index.get(STEP_S), index.get(BEFORE_BACKWARD_S), index.get(memory), index.get(LOCAL_NORM)


Summary = tuple[float | None, float | None, float | None, float | None]


def _summary(keys: tuple[str, ...], values: tuple[float, ...]) -> Summary:
    a, b, c, d = (None if i is None or not math.isfinite(values[i]) else values[i] for i in _plan(keys))
    return a, b, c, d


def summary_values(scalars: Mapping[str, float]) -> Summary:
    """A rank step's summary: step time, time before backward, memory (`_plan`) and local total
    gradient norm (None where not sent or not finite: a summary is for spread and outliers, the
    rank's own scalars while kept and the job's step have the exact values)."""
    return _summary(tuple(scalars), tuple(scalars.values()))


def write(
    conn: Connection, new_by_run: Sequence[tuple[str, Sequence[StepData]]], known: set[tuple[str, str, str]]
) -> set[tuple[str, str, str]]:
    """Store the ranks' new steps, a row each (one executemany), and the key sets not stored yet
    (`known` holds `(run id, "keys", id)` of those stored); returns the key sets and scalar
    series names to know from now on (a rank's series are listed as any run's)."""
    rows: list[tuple[Any, ...]] = []
    sets: dict[tuple[str, int], tuple[str, ...]] = {}
    for run_id, new in new_by_run:
        for d in new:
            keys, values = tuple(d.scalars), tuple(d.scalars.values())
            kid = keys_id(keys)
            if (run_id, "keys", str(kid)) not in known:
                sets[(run_id, kid)] = keys
            raw = struct.pack(f"<{len(values)}d", *values)
            rows.append((run_id, d.step, d.seq, d.time, *_summary(keys, values), d.digest, kid, raw))
    insert_plain(conn, rank_steps, rows)
    if not sets:
        return set()
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    conn.execute(
        dialect.insert(rank_keys).on_conflict_do_nothing(),
        [{"run_id": r, "id": kid, "keys": json.dumps(list(keys))} for (r, kid), keys in sets.items()],
    )
    out = {(r, "keys", str(kid)) for r, kid in sets}
    return out | {(r, "scalar", k) for (r, _), keys in sets.items() for k in keys}


def legacy_ranks(conn: Connection, run_ids: Sequence[str]) -> bool:
    """Whether any of these ranks' runs has steps stored before migration 0010 (in `steps`)."""
    for lo in range(0, len(run_ids), 512):
        if conn.execute(select(steps.c.step).where(steps.c.run_id.in_(run_ids[lo : lo + 512])).limit(1)).first():
            return True
    return False


_STORED = select(rank_steps.c.run_id, rank_steps.c.step).where(
    rank_steps.c.run_id.in_(bindparam("run_ids", expanding=True)),
    rank_steps.c.step.in_(bindparam("steps", expanding=True)),
)


def stored(conn: Connection, keys: Iterable[tuple[str, int]], legacy: bool = True) -> set[tuple[str, int]]:
    """Which of these (rank's run, step) are stored (`legacy`: in the tables of before 0010 too)."""
    keys = set(keys)
    if not keys:
        return set()
    run_ids, wanted = sorted({r for r, _ in keys}), sorted({s for _, s in keys})
    found = {(r, s) for r, s in conn.execute(_STORED, {"run_ids": run_ids, "steps": wanted})}
    if legacy:
        found |= {
            (r, s)
            for r, s in conn.execute(
                select(steps.c.run_id, steps.c.step).where(steps.c.run_id.in_(run_ids), steps.c.step.in_(wanted))
            )
        }
    return found & keys


def keep_legacy_summaries(conn: Connection, rows: Sequence[Mapping[str, Any]]) -> None:
    """The summaries (`rows`, as `rank_summaries` rows) of rank steps stored before 0010 (a
    `steps` row, no `rank_steps` row) that are assembled now: their `rank_summaries` rows, as
    the assembly wrote them before 0010 (a step stored since has its summary in its rank_steps
    row). Without them such a step would have no summary once its scalars are pruned."""
    keys = {(r["run_id"], r["step"]) for r in rows}
    legacy = keys - stored(conn, keys, legacy=False)
    if not legacy:
        return
    s = rank_summaries.c
    runs_, steps_ = sorted({r for r, _ in legacy}), sorted({t for _, t in legacy})
    legacy -= {(r, t) for r, t in conn.execute(select(s.run_id, s.step).where(s.run_id.in_(runs_), s.step.in_(steps_)))}
    if legacy:
        conn.execute(insert(rank_summaries), [r for r in rows if (r["run_id"], r["step"]) in legacy])


def step_heads(legacy: bool = True) -> Subquery:
    """(run_id, step, seq, time) of every stored step of any run: `steps`' rows and the ranks'
    `rank_steps` (without `legacy`, those only)."""
    new = select(rank_steps.c.run_id, rank_steps.c.step, rank_steps.c.seq, rank_steps.c.time)
    if not legacy:
        return new.subquery("run_steps")
    return union_all(select(steps.c.run_id, steps.c.step, steps.c.seq, steps.c.time), new).subquery("run_steps")


def heads(
    conn: Connection,
    run_id: str,
    where: Callable[[Any], Sequence[Any]],
    limit: int | None = None,
) -> list[tuple[int, int, float]]:
    """(step, seq, time) of a run's stored steps that meet `where` (given a table's columns), by
    step, at most `limit`: its `steps` rows and its `rank_steps` rows (a rank's), each table read
    on its own key (a UNION sorted for a LIMIT would read a long run whole per chunk)."""
    out: list[tuple[int, int, float]] = []
    for table in (steps, rank_steps):
        c = table.c
        query = select(c.step, c.seq, c.time).where(c.run_id == run_id, *where(c)).order_by(c.step)
        out += [
            (int(a), int(b), float(t)) for a, b, t in plain_rows(conn, query if limit is None else query.limit(limit))
        ]
    out.sort()
    return out if limit is None else out[:limit]


def summaries() -> Subquery:
    """Every rank step's summary (run_id, step, time, step_s, before_backward_s, memory_bytes,
    local_norm): `rank_steps`' and, from before 0010, `rank_summaries`'."""
    s, r = rank_summaries.c, rank_steps.c
    return union_all(
        select(s.run_id, s.step, s.time, s.step_s, s.before_backward_s, s.memory_bytes, s.local_norm),
        select(r.run_id, r.step, r.time, r.step_s, r.before_backward_s, r.memory_bytes, r.local_norm),
    ).subquery("summaries")


def _key_sets(conn: Connection, pairs: Iterable[tuple[str, int]]) -> dict[int, tuple[str, ...]]:
    """The keys of these (run, key set id) pairs, by id (an id is its keys' hash: one per set)."""
    pairs = set(pairs)
    if not pairs:
        return {}
    k = rank_keys.c
    rows = conn.execute(
        select(k.id, k["keys"]).where(
            k.run_id.in_(sorted({r for r, _ in pairs})), k.id.in_(sorted({i for _, i in pairs}))
        )
    )
    return {int(i): _keys_of(text) for i, text in rows}


def fill(
    conn: Connection, run_id: str, records: dict[int, StoredStep], lo: int, hi: int, keys: Sequence[str] | None = None
) -> None:
    """Read the packed scalars (`keys` only, None: all) and digest of a rank's steps lo..hi into
    `records` (those it holds only)."""
    r = rank_steps.c
    rows = plain_rows(
        conn,
        select(r.step, r.key_set, r.scalars, r.digest).where(
            r.run_id == run_id, r.step.between(lo, hi), r.key_set.is_not(None)
        ),
    )
    if not rows:
        return
    sets = _key_sets(conn, {(run_id, int(row[1])) for row in rows})
    wanted = None if keys is None else set(keys)
    for step, kid, raw, digest in rows:
        record = records.get(step)
        if record is None or kid not in sets:
            continue
        values = unpack(sets[kid], raw)
        record.scalars.update(values if wanted is None else {k: v for k, v in values.items() if k in wanted})
        record.digest = digest


def fill_runs(
    conn: Connection, run_ids: Sequence[str], records: Mapping[str, dict[int, StoredStep]], lo: int, hi: int
) -> None:
    """`fill` for several ranks' runs at once (run -> step -> record): one query for their rows,
    one for their key sets."""
    r = rank_steps.c
    rows = plain_rows(
        conn,
        select(r.run_id, r.step, r.key_set, r.scalars, r.digest).where(
            r.run_id.in_(run_ids), r.step.between(lo, hi), r.key_set.is_not(None)
        ),
    )
    if not rows:
        return
    sets = _key_sets(conn, {(row[0], int(row[2])) for row in rows})
    for run_id, step, kid, raw, digest in rows:
        record = records.get(run_id, {}).get(step)
        if record is None or kid not in sets:
            continue
        record.scalars.update(unpack(sets[kid], raw))
        record.digest = digest


def scalar_series(conn: Connection, run_id: str, key: str, where: Sequence[Any]) -> tuple[list[int], list[float]]:
    """(steps, values) of one scalar of a rank's run from its packed rows (`where`: conditions on
    rank_steps.c.step), by step."""
    r = rank_steps.c
    rows = plain_rows(
        conn,
        select(r.step, r.key_set, r.scalars).where(r.run_id == run_id, r.key_set.is_not(None), *where).order_by(r.step),
    )
    if not rows:
        return [], []
    sets = _key_sets(conn, {(run_id, int(row[1])) for row in rows})
    out_steps, out_values = [], []
    for step, kid, raw in rows:
        keys = sets.get(kid)
        if keys is None or key not in keys:
            continue
        i = keys.index(key)
        out_steps.append(int(step))
        out_values.append(struct.unpack_from("<d", raw, 8 * i)[0])
    return out_steps, out_values


def merge_series(
    steps_a: np.ndarray, values_a: np.ndarray, steps_b: list[int], values_b: list[float]
) -> tuple[np.ndarray, np.ndarray]:
    """Two series by step (the legacy rows and the packed ones), as one."""
    if not steps_b:
        return steps_a, values_a
    s = np.concatenate([steps_a, np.array(steps_b, np.int64)])
    v = np.concatenate([values_a, np.array(values_b, np.float64)])
    order = np.argsort(s, kind="stable")
    return s[order], v[order]


def prune(conn: Connection, run_ids: Sequence[str], lo: int, hi: int, keep: Sequence[Any]) -> None:
    """Drop the packed scalars and digests of these ranks' steps lo+1..hi but those whose step is
    in one of `keep` (selects of steps): each row is deleted and inserted again as its summary alone.
    Not an UPDATE: on SQLite a row shrunk in place leaves its page as full as it was, while a
    deleted range frees whole pages to reuse."""
    r = rank_steps.c
    where = [
        r.run_id.in_(run_ids),
        r.step > lo,
        r.step <= hi,
        r.key_set.is_not(None),
        *(r.step.not_in(k) for k in keep),
    ]
    rows = plain_rows(
        conn,
        select(r.run_id, r.step, r.seq, r.time, r.step_s, r.before_backward_s, r.memory_bytes, r.local_norm).where(
            *where
        ),
    )
    if not rows:
        return
    conn.execute(delete(rank_steps).where(*where))
    insert_plain(conn, rank_steps, [(*row, None, None, None) for row in rows])

"""A rank's step as one row (store/rank_rows.py, `rank_steps`): what the readers give back (a
rank's scalars, its series, its summaries, a replica's digest) is what the rank sent, bit for bit;
one row a rank-step, none in the tables that held it before (`steps`, `scalars`,
`rank_summaries`); the recent window's packed scalars dropped beyond it, the summaries kept; and
ranks stored before migration 0010 (rows in the old tables) read and assembled as before."""

from __future__ import annotations

import hashlib
import json
import math
import struct
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import func, select

from gradwatch_server.jobs.memory import JobMemory
from gradwatch_server.protocol import Hello, parse_message
from gradwatch_server.schema import param_metrics, rank_steps, rank_summaries, runs, scalars, series_names, steps
from gradwatch_server.store import StepData, Store, open_store
from gradwatch_server.store import jobs as store_jobs
from gradwatch_server.store.values import encode_scalar
from support.wiremsg import f32, rank_hello

pytestmark = pytest.mark.unit

JOB = "j-rows"


def digest_oracle(grad_norm: bytes, grad_status: bytes) -> str:
    """docs/protocol.md, version 2: BLAKE2b-16 of the float32 bytes, 0xFF, the uint8 codes."""
    return hashlib.blake2b(grad_norm + b"\xff" + grad_status, digest_size=16).hexdigest()


def bits(x: float) -> bytes:
    return struct.pack("<d", x)


def sent_steps(rank: int, count: int) -> list[StepData]:
    """Rank `rank`'s steps 1..count: odd steps measured (arrays; on rank 1 a digest instead),
    scalars that SQLite cannot keep in a REAL as such (NaN, -0.0) and infinities, the memory
    of two CUDA devices (the summary takes the lowest's allocated bytes) or else the RSS."""
    out = []
    for s in range(1, count + 1):
        measured = s % 2 == 1
        scalars_sent = {
            "loss": [1.0 / s, math.nan, -0.0, math.inf][s % 4],
            "time/step_s": 0.1 * (rank + 1) + 0.001 * s,
            "time/before_backward_s": math.nan if s == 2 else 0.01 * s,
            "mem/rss_bytes": 1000.0 * (rank + 1) + s,
            **({f"mem/cuda:{d}/allocated": 1e9 * (d + 1) + s for d in (1, 0)} if rank == 0 else {}),
            **({"grad_norm_total": float(s + rank)} if measured else {}),
        }
        arrays = {"backward_passes": f32(1, 1).tobytes()}
        grads = {"grad_norm": f32(0.5 * s, 0.25).tobytes(), "grad_status": bytes([2, 2])}
        digest = None
        if measured and rank == 0:
            arrays |= grads
        elif measured:  # a replica in sync with rank 0
            digest = digest_oracle(grads["grad_norm"], grads["grad_status"])
        out.append(StepData(s, s, 1_700_000_000.0 + s, scalars_sent, arrays, digest=digest))
    return out


def summary_oracle(d: StepData) -> tuple[float, float, float, float]:
    """Step time, time before backward, memory (lowest CUDA device's allocated, else RSS), local
    norm; NaN where not sent or not finite."""
    cuda = sorted((int(k.split(":")[1].split("/")[0]), v) for k, v in d.scalars.items() if k.endswith("/allocated"))
    memory = cuda[0][1] if cuda else d.scalars["mem/rss_bytes"]

    def f(x: float | None) -> float:
        return math.nan if x is None or not math.isfinite(x) else x

    return (
        f(d.scalars["time/step_s"]),
        f(d.scalars["time/before_backward_s"]),
        f(memory),
        f(d.scalars.get("grad_norm_total")),
    )


def opened(path: Path) -> Store:
    store = open_store(f"sqlite:///{path}")
    for rank in range(2):
        message = parse_message(json.dumps(rank_hello(JOB, rank, 2, counted=[True, rank == 0])))
        assert isinstance(message, Hello)
        store.open_rank(message)
    return store


def count(store: Store, table: object, run_ids: list[str]) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(select(func.count()).where(table.c.run_id.in_(run_ids))).scalar_one())  # type: ignore[attr-defined]


def test_a_rank_step_is_one_row_and_every_reader_gives_back_what_the_rank_sent(tmp_path: Path) -> None:
    store = opened(tmp_path / "rows.db")
    sent = {rank: sent_steps(rank, 6) for rank in range(2)}
    done = store.write_rank_steps([(f"{JOB}.r{rank}", sent[rank], None) for rank in range(2)])
    assert done == [[True] * 6, [True] * 6]
    ids = [f"{JOB}.r0", f"{JOB}.r1"]
    assert count(store, rank_steps, ids) == 12  # one row a rank-step ...
    assert [count(store, t, ids) for t in (steps, scalars, rank_summaries)] == [0, 0, 0]  # ... and no other
    assert count(store, param_metrics, ids) == 2 * 6 + 3 * 2  # passes on every step, rank 0's measured arrays
    # resent: nothing stored again
    assert store.write_rank_steps([(ids[1], sent[1][:2], None)]) == [[False, False]]
    for rank in range(2):
        got = {r.step: r for chunk in store.iter_steps(ids[rank]) for r in chunk}
        assert sorted(got) == list(range(1, 7))
        for d in sent[rank]:
            assert got[d.step].time == d.time and got[d.step].seq == d.seq
            assert {k: bits(v) for k, v in got[d.step].scalars.items()} == {k: bits(v) for k, v in d.scalars.items()}
            assert {m: a.tobytes() for m, a in got[d.step].arrays.items()} == dict(d.arrays)
            assert got[d.step].digest == d.digest
        # a rank's series, as the Ranks view reads it
        found, values = store.scalar_series(ids[rank], "loss", 2, 5)
        assert found.tolist() == [2, 3, 4, 5]
        assert [bits(v) for v in values.tolist()] == [bits(d.scalars["loss"]) for d in sent[rank][1:5]]
        assert set(store.series_names(ids[rank], "scalar")) == {k for d in sent[rank] for k in d.scalars}
    summaries = store.rank_summaries(JOB)
    expected = [(rank, d.step, d.time, *summary_oracle(d)) for rank in range(2) for d in sent[rank]]
    got_rows = list(
        zip(
            summaries.rank.tolist(),
            summaries.step.tolist(),
            summaries.time.tolist(),
            summaries.step_s.tolist(),
            summaries.before_backward_s.tolist(),
            summaries.memory_bytes.tolist(),
            summaries.local_norm.tolist(),
        )
    )
    assert [tuple(bits(v) for v in row) for row in got_rows] == [tuple(bits(v) for v in row) for row in expected]
    store.close()


def test_beyond_the_window_a_rank_step_keeps_its_summary_and_drops_its_scalars_and_digest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_jobs, "RANK_WINDOW", 4)
    monkeypatch.setattr(store_jobs, "PRUNE_EVERY", 2)
    store = opened(tmp_path / "window.db")
    sent = {rank: sent_steps(rank, 12) for rank in range(2)}
    ids = [f"{JOB}.r0", f"{JOB}.r1"]
    store.write_rank_steps([(ids[rank], sent[rank], None) for rank in range(2)])
    done = store.assemble(JOB, 30.0, 0.0, memory=JobMemory())
    assert [d.step for d in done.steps] == list(range(1, 13))
    with store.engine.connect() as conn:
        rows = conn.execute(
            select(rank_steps.c.run_id, rank_steps.c.step, rank_steps.c.key_set, rank_steps.c.digest)
        ).all()
    kept = {(r.run_id, r.step) for r in rows if r.key_set is not None}
    assert kept == {(i, s) for i in ids for s in range(9, 13)}  # the last 4 steps' scalars
    assert {(r.run_id, r.step) for r in rows if r.digest is not None} == {(ids[1], 9), (ids[1], 11)}
    assert len(rows) == 24  # every summary stays
    assert store.rank_summaries(JOB).step.tolist() == list(range(1, 13)) * 2
    found, _ = store.scalar_series(ids[0], "time/step_s")
    assert found.tolist() == [9, 10, 11, 12]
    store.close()


def legacy_write(store: Store, run_id: str, batch: list[StepData]) -> None:
    """Store a rank's steps as gradwatch-server stored them before migration 0010: a `steps` row,
    a `scalars` row per scalar, the arrays, the series names, and the assembly's summary row."""
    with store.engine.begin() as conn:
        for d in batch:
            conn.execute(steps.insert().values(run_id=run_id, step=d.step, seq=d.seq, time=d.time))
            for k, x in d.scalars.items():
                value, special = encode_scalar(x)
                conn.execute(scalars.insert().values(run_id=run_id, key=k, step=d.step, value=value, special=special))
            for m, raw in d.arrays.items():
                dtype = "u1" if m == "grad_status" else "f4"
                conn.execute(param_metrics.insert().values(run_id=run_id, metric=m, step=d.step, data=raw, dtype=dtype))
            values = summary_oracle(d)
            conn.execute(
                rank_summaries.insert().values(
                    run_id=run_id,
                    step=d.step,
                    time=d.time,
                    **{
                        c: None if math.isnan(v) else v
                        for c, v in zip(("step_s", "before_backward_s", "memory_bytes", "local_norm"), values)
                    },
                )
            )
        names = {("scalar", k) for d in batch for k in d.scalars} | {("param", m) for d in batch for m in d.arrays}
        conn.execute(series_names.insert(), [{"run_id": run_id, "kind": k, "name": n} for k, n in sorted(names)])
        conn.execute(
            runs.update()
            .where(runs.c.id == run_id)
            .values(last_seq=batch[-1].seq, steps=len(batch), last_step=batch[-1].step)
        )


def test_ranks_stored_before_0010_are_read_and_assembled_as_before(tmp_path: Path) -> None:
    """Steps 1-3 in the old tables, 4-6 in rank_steps (a job that ran across the upgrade): the
    readers give both, and the job's rows equal those of a job stored all in the new way."""
    sent = {rank: [d for d in sent_steps(rank, 6)] for rank in range(2)}
    ids = [f"{JOB}.r0", f"{JOB}.r1"]
    mixed, new = opened(tmp_path / "mixed.db"), opened(tmp_path / "new.db")
    for rank in range(2):
        old = [StepData(d.seq, d.step, d.time, d.scalars, d.arrays) for d in sent[rank][:3]]  # no digest then
        legacy_write(mixed, ids[rank], old)
        mixed.write_steps(ids[rank], sent[rank][3:])
        new.write_steps(ids[rank], [*old, *sent[rank][3:]])
    for rank in range(2):
        a = [(r.step, r.seq, r.time, r.scalars) for chunk in mixed.iter_steps(ids[rank]) for r in chunk]
        b = [(r.step, r.seq, r.time, r.scalars) for chunk in new.iter_steps(ids[rank]) for r in chunk]
        assert json.dumps(a) == json.dumps(b) and len(a) == 6
        sa, va = mixed.scalar_series(ids[rank], "time/step_s")
        sb, vb = new.scalar_series(ids[rank], "time/step_s")
        assert sa.tolist() == sb.tolist() == list(range(1, 7)) and va.tolist() == vb.tolist()
    for store in (mixed, new):
        done = store.assemble(JOB, 30.0, 0.0, memory=JobMemory())
        assert [d.step for d in done.steps] == list(range(1, 7))
    jobs = [
        [
            (r.step, {k: bits(v) for k, v in r.scalars.items()}, {m: a.tobytes() for m, a in r.arrays.items()})
            for chunk in s.iter_steps(JOB)
            for r in chunk
        ]
        for s in (mixed, new)
    ]
    assert jobs[0] == jobs[1] and len(jobs[0]) == 6
    summaries = [mixed.rank_summaries(JOB), new.rank_summaries(JOB)]
    assert summaries[0].step.tolist() == summaries[1].step.tolist() == list(range(1, 7)) * 2
    np.testing.assert_array_equal(summaries[0].step_s, summaries[1].step_s)
    for store in (mixed, new):
        store.close()

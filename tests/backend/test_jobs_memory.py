"""A job's assembly from the ranks' steps kept in memory (store/jobs.py, jobs/memory.py `JobMemory`): the same
global rows as the assembly that reads the ranks' stored rows back, without reading them; and the
memory's bound. Two SQLite stores get the same ranks and steps; one assembles with the batches in
its memory, the other with an empty memory (as after a restart)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import event

from gradwatch_server.jobs import memory as job_memory
from gradwatch_server.jobs.memory import JobMemory
from gradwatch_server.protocol import Hello, Step, parse_message
from gradwatch_server.store import StepData, Store, open_store
from gradwatch_server.store import jobs as store_jobs
from support.wiremsg import f32, rank_hello, step

pytestmark = pytest.mark.unit

JOB = "j-mem"
#: fc.weight sharded (both pieces count), fc.bias a DDP replica (rank 0's counts).
PIECES = [{"local_numel": [3, 3], "counted": [True, True]}, {"local_numel": [3, 3], "counted": [True, False]}]


def batches(steps: int, desync_at: int = 0) -> list[list[StepData]]:
    """Per rank, its steps 1..`steps` as its connection stores them (measured, then unmeasured):
    its own shard of fc.weight, fc.bias the same on both ranks (a replica) but at `desync_at`."""
    out: list[list[StepData]] = []
    rng = np.random.default_rng(3)
    values = rng.random((steps + 1, 2, 3)).astype("<f4")  # step, rank, (weight shard, bias, param)
    for rank in range(2):
        batch = []
        for s in range(1, steps + 1):
            measured = s % 2 == 1
            arrays = {"backward_passes": f32(1, 1)}
            if measured:
                bias = values[s, 0, 1] * (2 if rank == 1 and s == desync_at else 1)
                arrays |= {"grad_norm": f32(values[s, rank, 0], bias), "param_norm": f32(values[s, rank, 2], 1.0)}
            message = parse_message(
                json.dumps(
                    step(
                        s,
                        s,
                        scalars={
                            "loss": 1.0 / s,
                            "time/step_s": 0.1 * (rank + 1),
                            "time/before_backward_s": 0.01 * s,
                            "mem/params_bytes": 10.0,
                            "mem/rss_bytes": 1000.0 * (rank + 1) + s,
                            **({"grad_norm_total": float(s + rank)} if measured else {}),
                        },
                        arrays=arrays,
                        grad_status=[2, 2] if measured else None,
                    )
                ),
                2,
            )
            assert isinstance(message, Step)
            batch.append(StepData(message.seq, message.step, message.time, message.scalars, message.arrays()))
        out.append(batch)
    return out


def seeded(path: Path, steps: int, desync_at: int = 0) -> tuple[Store, list[list[StepData]]]:
    store = open_store(f"sqlite:///{path}")
    sent = batches(steps, desync_at)
    for rank in range(2):
        hello = parse_message(json.dumps(rank_hello(JOB, rank, 2, **PIECES[rank])))
        assert isinstance(hello, Hello)
        store.open_rank(hello)
        store.write_steps(f"{JOB}.r{rank}", sent[rank])
    return store, sent


def job_rows(store: Store) -> list[tuple[int, dict[str, float], dict[str, bytes]]]:
    return [
        (r.step, r.scalars, {m: np.asarray(a).tobytes() for m, a in r.arrays.items()})
        for chunk in store.iter_steps(JOB)
        for r in chunk
    ]


def test_the_assembly_from_memory_reads_no_rank_rows_and_stores_what_the_read_back_one_does(tmp_path: Path) -> None:
    kept, sent = seeded(tmp_path / "kept.db", 6)
    read, _ = seeded(tmp_path / "read.db", 6)
    memory = JobMemory()
    for rank in range(2):
        memory.add(rank, sent[rank])
    selects: dict[str, list[str]] = {"kept": [], "read": []}
    for name, store in (("kept", kept), ("read", read)):

        def log(conn: Any, cursor: Any, statement: str, parameters: Any, *args: Any, _name: str = name) -> None:
            ranks_rows = any(isinstance(p, str) and p.startswith(f"{JOB}.r") for p in parameters or ())
            if statement.lstrip().upper().startswith("SELECT") and "param_metrics" in statement and ranks_rows:
                selects[_name].append(statement)

        event.listen(store.engine, "before_cursor_execute", log)
    done_kept = kept.assemble(JOB, 30.0, 0.0, memory=memory)
    done_read = read.assemble(JOB, 30.0, 0.0, memory=JobMemory())
    assert [d.step for d in done_kept.steps] == [d.step for d in done_read.steps] == list(range(1, 7))
    assert job_rows(kept) == job_rows(read)
    assert selects["read"], "the assembly without memory reads the ranks' rows back"
    # (the job's own rows may be read: its blocks summarise them)
    assert selects["kept"] == []
    # the global values themselves: fc.weight from both ranks, fc.bias from rank 0 alone
    first = job_rows(kept)[0]
    grad = np.frombuffer(first[2]["grad_norm"], "<f4")
    g0, g1 = (np.frombuffer(sent[r][0].arrays["grad_norm"], "<f4").astype(np.float64) for r in range(2))
    assert grad[0] == pytest.approx(np.sqrt(g0[0] ** 2 + g1[0] ** 2), rel=1e-6)
    assert grad[1] == pytest.approx(g0[1], rel=1e-6)
    assert "grad_norm" not in job_rows(kept)[1][2]  # step 2 measured nowhere: cheap facts only


def test_the_memory_keeps_the_oldest_steps_within_its_bound_and_frees_what_is_assembled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent = batches(6)[0]
    size = sum(len(raw) for raw in sent[0].arrays.values())
    monkeypatch.setattr(job_memory, "MEMORY_BYTES", 3 * size)
    memory = JobMemory()
    memory.add(0, sent)
    kept = [s for s in range(1, 7) if memory.take(0, s) is not None]
    assert kept[0] == 1 and kept == list(range(1, len(kept) + 1)) and len(kept) < 6
    memory.forget_through(kept[-1])
    assert all(memory.take(0, s) is None for s in range(1, 7))
    memory.add(0, sent[4:])  # room again once assembled steps are forgotten
    assert memory.take(0, 5) is not None


def test_ranks_keep_their_measured_per_parameter_rows_in_the_recent_window_and_where_they_desynced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_jobs, "RANK_WINDOW", 4)
    monkeypatch.setattr(store_jobs, "PRUNE_EVERY", 2)
    store, sent = seeded(tmp_path / "prune.db", 12, desync_at=3)
    memory = JobMemory()
    for rank in range(2):
        memory.add(rank, sent[rank])
    before = job_rows(store)
    assert before == []
    done = store.assemble(JOB, 30.0, 0.0, memory=memory)
    assert [d.step for d in done.steps] == list(range(1, 13))
    assert done.steps[2].scalars.get("dist/desync/r1") == 1.0  # step 3: rank 1's fc.bias differs
    for rank in range(2):
        kept = {r.step for chunk in store.iter_steps(f"{JOB}.r{rank}") for r in chunk if r.arrays}
        # the desync evidence, and the last 4 steps' measured ones (an unmeasured step's passes
        # and clears are in the job's row: the rank keeps its summary, and its scalars for the window)
        assert kept == {3, 9, 11}
        scalars = {r.step for chunk in store.iter_steps(f"{JOB}.r{rank}") for r in chunk if "time/step_s" in r.scalars}
        assert scalars == {3, 9, 10, 11, 12}  # its scalars: the window's, and the evidence's
    # every rank step's summary stays, as the rank sent it (NaN: no norm on an unmeasured step)
    summaries = store.rank_summaries(JOB)
    expected = [
        (rank, d.step, d.scalars["time/step_s"], d.scalars["time/before_backward_s"], d.scalars["mem/rss_bytes"])
        for rank in range(2)
        for d in sent[rank]
    ]
    got = list(
        zip(
            summaries.rank.tolist(),
            summaries.step.tolist(),
            summaries.step_s.tolist(),
            summaries.before_backward_s.tolist(),
            summaries.memory_bytes.tolist(),
        )
    )
    assert got == expected
    norms = [d.scalars.get("grad_norm_total", np.nan) for rank in range(2) for d in sent[rank]]
    np.testing.assert_array_equal(summaries.local_norm, np.array(norms))
    assert store.rank_summaries(JOB, 5, 6).step.tolist() == [5, 6, 5, 6]
    # the job's own rows are whole, as assembled from the rows now pruned
    fresh, _ = seeded(tmp_path / "whole.db", 12, desync_at=3)
    fresh.assemble(JOB, 30.0, 0.0, memory=JobMemory())
    assert job_rows(store) == job_rows(fresh)


def test_a_job_behind_is_assembled_a_bounded_range_at_a_time_up_to_its_slowest_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole, _ = seeded(tmp_path / "whole.db", 12)
    whole.assemble(JOB, 30.0, 0.0, memory=JobMemory())  # 12 steps at once: within LOOKAHEAD
    monkeypatch.setattr(store_jobs, "LOOKAHEAD", 4)
    store = open_store(f"sqlite:///{tmp_path / 'bounded.db'}")
    sent = batches(12)
    for rank in range(2):
        hello = parse_message(json.dumps(rank_hello(JOB, rank, 2, **PIECES[rank])))
        assert isinstance(hello, Hello)
        store.open_rank(hello)
    store.write_steps(f"{JOB}.r0", sent[0])
    store.write_steps(f"{JOB}.r1", sent[1][:9])  # rank 1, the slowest, stored steps 1..9 so far
    calls = []
    done = store.assemble(JOB, 30.0, 0.0, memory=JobMemory())
    calls.append(([d.step for d in done.steps], done.more))
    while done.more:
        done = store.assemble(JOB, 30.0, 0.0, memory=JobMemory())
        calls.append(([d.step for d in done.steps], done.more))
    # LOOKAHEAD steps of the slowest rank per call, and nothing beyond its last step
    assert calls == [([1, 2, 3, 4], True), ([5, 6, 7, 8], True), ([9], False)]
    store.write_steps(f"{JOB}.r1", sent[1][9:])
    done = store.assemble(JOB, 30.0, 0.0, memory=JobMemory())
    assert ([d.step for d in done.steps], done.more) == ([10, 11, 12], False)
    assert job_rows(store) == job_rows(whole)

"""Group commits of ranks' frames (jobs/commits.py, Store.write_rank_steps): several ranks'
batches in one transaction store what each stored alone would; a deleted run fails alone."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import event

from gradwatch_server.jobs.commits import GroupCommits
from gradwatch_server.protocol import Hello, parse_message
from gradwatch_server.store import StepData, Store, UnknownRun, open_store
from support.wiremsg import f32, rank_hello

pytestmark = pytest.mark.unit


JOB = "j-group"


def sent(rank: int, first: int, last: int) -> list[StepData]:
    """A rank's steps first..last as its connection stores them (its scalars, its arrays' bytes)."""
    return [
        StepData(s, s, 100.0 + s, {"loss": rank + 1 / s}, {"grad_norm": f32(rank, s).tobytes()})
        for s in range(first, last + 1)
    ]


def opened(path: Path, ranks: int = 2) -> Store:
    store = open_store(f"sqlite:///{path}")
    for rank in range(ranks):
        hello = parse_message(json.dumps(rank_hello(JOB, rank, ranks)))
        assert isinstance(hello, Hello)
        store.open_rank(hello)
    return store


def rows(store: Store, run_id: str) -> list[tuple[int, int, dict[str, float], dict[str, bytes]]]:
    return [
        (r.step, r.seq, r.scalars, {m: np.asarray(a).tobytes() for m, a in r.arrays.items()})
        for chunk in store.iter_steps(run_id)
        for r in chunk
    ]


def commits(store: Store) -> list[int]:
    count = [0]

    def counted(conn: Any) -> None:
        count[0] += 1

    event.listen(store.engine, "commit", counted)
    return count


def test_a_group_stores_what_each_batch_alone_does_and_a_deleted_run_fails_alone(tmp_path: Path) -> None:
    alone, grouped = opened(tmp_path / "alone.db"), opened(tmp_path / "grouped.db")
    for rank in range(2):
        alone.write_steps(f"{JOB}.r{rank}", sent(rank, 1, 3), rank_run=True)
    count = commits(grouped)
    results = grouped.write_rank_steps([(f"{JOB}.r{rank}", sent(rank, 1, 3), None) for rank in range(2)])
    assert results == [[True] * 3, [True] * 3] and count == [1]
    for rank in range(2):
        assert rows(grouped, f"{JOB}.r{rank}") == rows(alone, f"{JOB}.r{rank}")
    # a resend stores nothing again; a run deleted meanwhile fails, and only it
    grouped.delete_run(f"{JOB}.r1")
    again = grouped.write_rank_steps([(f"{JOB}.r0", sent(0, 3, 4), None), (f"{JOB}.r1", sent(1, 3, 4), None)])
    assert again[0] == [False, True]
    assert isinstance(again[1], UnknownRun)
    assert [r[0] for r in rows(grouped, f"{JOB}.r0")] == [1, 2, 3, 4]


def test_connections_writing_at_once_share_commits_and_each_gets_its_own_answer(tmp_path: Path) -> None:
    ranks = 6
    store = opened(tmp_path / "g.db", ranks)
    count = commits(store)

    async def main() -> list[Any]:
        group = GroupCommits(store)

        async def rank(r: int) -> list[bool]:
            out: list[bool] = []
            for s in range(1, 4):  # a connection writes its next batch once the last is stored
                out += await group.write(f"{JOB}.r{r}", sent(r, s, s), None)
            return out

        return await asyncio.gather(rank(0), *(rank(r) for r in range(1, ranks)), return_exceptions=True)

    store.delete_run(f"{JOB}.r5")
    answers = asyncio.run(main())
    assert answers[:5] == [[True] * 3] * 5
    assert isinstance(answers[5], UnknownRun)
    assert count[0] < 5 * 3  # shared: fewer commits than batches
    for r in range(5):
        got = rows(store, f"{JOB}.r{r}")
        assert [(s, scalars["loss"]) for s, _, scalars, _ in got] == [(s, r + 1 / s) for s in range(1, 4)]
        assert [np.frombuffer(a["grad_norm"], "<f4").tolist() for *_, a in got] == [[r, s] for s in range(1, 4)]


def test_a_job_knows_nothing_is_ready_as_the_full_rule_does_while_its_ranks_report() -> None:
    """The assembler's `nothing_ready` (a scan resumed frame after frame) against the rule it
    stands for, over random frames, closes and losses: it never answers True where the rule
    answers False (that would skip a ready step)."""
    from gradwatch_server.jobs.assembler import _Job

    rng = np.random.default_rng(7)
    ranks = 12
    job = _Job(first_seen=0.0, touched=0.0, world_size=ranks, assembled=0)
    agree = 0
    for _ in range(2000):
        r = int(rng.integers(ranks))
        event = rng.random()
        if event < 0.8:
            job.frontier[r] = max(job.frontier.get(r, 0), (job.assembled or 0) + int(rng.integers(0, 3)))
            job.lost.discard(r)
        elif event < 0.85:
            job.lost.add(r)
        elif event < 0.9:
            job.closed.add(r)
        elif event < 0.93:
            job.closed.discard(r)
        else:  # an assembly took the steps every waited rank has
            job.assembled = (job.assembled or 0) + 1
        waited = [x for x in range(ranks) if x not in job.closed and x not in job.lost]
        rule = all(x in job.frontier for x in waited) and any(job.frontier[x] <= job.assembled for x in waited)
        got = job.nothing_ready([])
        assert not got or rule
        agree += got == rule
    assert agree > 1900  # False where the rule says True only just after a rank is waited for again

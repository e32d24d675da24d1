"""A job's partial steps assembled again once the rank they missed stores them late (store/jobs.py,
`_complete`): a dead rank's spool replayed by `gradwatch sync`, a rank that was only slow.

Two stores on one database play two server workers, with one clock: the ranks' steps are written
and the job assembled as ingest does (after each batch, with its new steps as `late`). The job's
stored values are checked step by step against the combination computed here, and its blocks
against a recomputation from scratch; on SQLite and on PostgreSQL (`db_url`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator

import numpy as np
import pytest

from gradwatch_server.protocol import Hello, parse_message
from gradwatch_server.store import StepData, Store, backfill_blocks, open_store
from support.databases import Clock
from support.jobs import partial_steps
from support.wiremsg import rank_hello

pytestmark = pytest.mark.unit

JOB = "late"
P = 5
PARAMS = tuple(f"layer{i}.weight" for i in range(P))
TIMEOUT_S = 10.0


@pytest.fixture
def workers(db_url: str) -> Iterator[tuple[Store, Store, Clock]]:
    clock = Clock()
    one, two = open_store(db_url, clock=clock), open_store(db_url, clock=clock)
    yield one, two, clock
    one.close()
    two.close()


def local_norms(rank: int, step: int) -> np.ndarray:
    """What rank `rank` measured of its shard at `step` (every piece counted: FSDP-like)."""
    return np.random.default_rng(1000 * rank + step).uniform(0.1, 3.0, P).astype("<f4")


def oracle(step: int, ranks: tuple[int, ...]) -> list[float]:
    """The job's grad norms: sqrt of the sum of the ranks' squared local norms, float64, as float32."""
    return [float(np.float32(math.sqrt(sum(float(local_norms(r, step)[i]) ** 2 for r in ranks)))) for i in range(P)]


def local_total(rank: int, step: int) -> float:
    """The local `grad_norm_total` rank `rank` sends at `step` (its summary's, the spread's)."""
    return 10.0 * rank + step


def send(store: Store, rank: int, steps: range, seq0: int) -> None:
    """A batch of rank `rank`'s steps, stored and then assembled, as ingest does (asking again
    while more may be ready, as the assembler does)."""
    batch = [
        StepData(
            seq0 + k,
            s,
            1_700_000_000.0 + s,
            {"loss": float(s), "grad_norm_total": local_total(rank, s)},
            {"grad_norm": local_norms(rank, s).tobytes()},
        )
        for k, s in enumerate(steps)
    ]
    stored = store.write_steps(f"{JOB}.r{rank}", batch)
    done = store.assemble(JOB, TIMEOUT_S, 0.0, late=[d.step for d, new in zip(batch, stored) if new])
    while done.more:
        done = store.assemble(JOB, TIMEOUT_S, 0.0)


def job_grad_norms(store: Store) -> dict[int, list[float]]:
    return {
        r.step: [float(v) for v in r.arrays["grad_norm"]]
        for chunk in store.iter_steps(JOB, metrics=["grad_norm"])
        for r in chunk
    }


def spread_edges(store: Store, steps: int) -> dict[int, tuple[float, float, float]]:
    """The stored spread of the local total norm across the ranks at each of the job's last
    `steps` steps: (min, median, max)."""
    found = store.rank_spread(JOB, "grad_norm_total", steps)
    lo, _, mid, _, hi = found.quantiles.tolist()
    return {int(s): (lo[i], mid[i], hi[i]) for i, s in enumerate(found.steps.tolist())}


def both(step: int) -> tuple[float, float, float]:
    """The spread of ranks 0 and 1 at `step` (oracle: the two values sent, their mean)."""
    a, b = local_total(0, step), local_total(1, step)
    return (a, (a + b) / 2, b)


def blocks(store: Store) -> list[tuple[object, ...]]:
    with store.engine.connect() as conn:
        return [
            tuple(bytes(c) if isinstance(c, (bytes, memoryview)) else c for c in r)
            for r in conn.exec_driver_sql(
                "SELECT kind, metric, size, block, part, first_step, step_count, data FROM metric_blocks "
                f"WHERE run_id = '{JOB}' ORDER BY kind, metric, size, block, part"
            ).all()
        ]


def test_a_lost_ranks_late_steps_make_its_partial_steps_exact(workers: tuple[Store, Store, Clock]) -> None:
    one, two, clock = workers
    for rank in (0, 1):
        hello = parse_message(json.dumps(rank_hello(JOB, rank, 2, PARAMS)))
        assert isinstance(hello, Hello)
        one.open_rank(hello)
    send(one, 0, range(1, 21), 1)
    send(one, 1, range(1, 21), 1)
    assert sorted(job_grad_norms(one)) == list(range(1, 21))
    # rank 1 falls silent; rank 0 goes on through the other worker, which keeps the job's tail
    clock.now += TIMEOUT_S + 1
    for lo in range(21, 51, 10):
        send(two, 0, range(lo, lo + 10), lo)
    assert two.lost_ranks(JOB, TIMEOUT_S, since=0.0) == [1]
    partial = job_grad_norms(one)
    assert sorted(partial) == list(range(1, 51))
    assert partial_steps(two, JOB) == [(s, [1]) for s in range(21, 51)]
    assert all(partial[s] == oracle(s, (0,)) for s in range(21, 51))  # rank 0's pieces alone
    alone = {s: (local_total(0, s),) * 3 for s in range(21, 51)}  # the spread too: rank 0's alone
    assert spread_edges(two, 50) == {**{s: both(s) for s in range(1, 21)}, **alone}
    # rank 1's spool replays, in batches: each step it completes is assembled again, in place
    send(one, 1, range(21, 41), 21)
    assert partial_steps(one, JOB) == [(s, [1]) for s in range(41, 51)]
    send(one, 1, range(41, 51), 41)
    assert partial_steps(one, JOB) == []
    # the completed steps' spread is written again with both ranks; and where a job has no
    # stored spread (assembled before migration 0008), it is computed from the summaries
    assert spread_edges(one, 50) == {s: both(s) for s in range(1, 51)}
    with one.engine.begin() as conn:
        conn.exec_driver_sql("DELETE FROM rank_spread")
    assert spread_edges(one, 50) == {s: both(s) for s in range(1, 51)}
    # both ranks go on through the other worker: its tail of the job holds steps 48-50 as they
    # were before; the block 48-63 they close must be made of the steps as they are now
    for lo in range(51, 71, 10):
        send(two, 0, range(lo, lo + 10), lo)
        send(two, 1, range(lo, lo + 10), lo)
    stored = job_grad_norms(one)
    assert sorted(stored) == list(range(1, 71))
    assert [s for s in stored if stored[s] != oracle(s, (0, 1))] == []
    run = one.get_run(JOB)
    assert run is not None and (run.steps, run.last_step) == (70, 70)
    kept = blocks(one)
    assert kept
    with one.engine.begin() as conn:
        conn.exec_driver_sql("DELETE FROM metric_blocks")
        backfill_blocks(conn)
    assert blocks(one) == kept


def test_a_late_step_completes_nothing_while_another_missing_rank_lacks_it(db_url: str) -> None:
    """World size 3, ranks 1 and 2 lost: rank 1's late step leaves it partial (rank 2 still
    missing), and rank 2's then makes it exact."""
    clock = Clock()
    store = open_store(db_url, clock=clock)
    try:
        for rank in (0, 1, 2):
            hello = parse_message(json.dumps(rank_hello(JOB, rank, 3, PARAMS)))
            assert isinstance(hello, Hello)
            store.open_rank(hello)
        for rank in (0, 1, 2):
            send(store, rank, range(1, 3), 1)
        clock.now += TIMEOUT_S + 1
        send(store, 0, range(3, 6), 3)
        assert partial_steps(store, JOB) == [(s, [1, 2]) for s in (3, 4, 5)]
        send(store, 1, range(3, 5), 3)
        assert partial_steps(store, JOB) == [(s, [1, 2]) for s in (3, 4, 5)]
        assert job_grad_norms(store)[3] == oracle(3, (0,))
        send(store, 2, range(3, 4), 3)
        assert partial_steps(store, JOB) == [(4, [1, 2]), (5, [1, 2])]
        stored = job_grad_norms(store)
        assert stored[3] == oracle(3, (0, 1, 2)) and stored[4] == oracle(4, (0,))
    finally:
        store.close()

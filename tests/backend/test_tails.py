"""The open blocks kept in memory (tails.py): ingest computes the blocks a batch closes without
reading back the raw steps earlier batches stored, and the blocks it stores stay exactly those a
recomputation from the database gives, whoever else writes the run meanwhile.

Run on an SQLite file and on a real PostgreSQL database (tests/conftest.py).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator

import numpy as np
import pytest
from sqlalchemy import event
from sqlalchemy.engine import Engine

from gradwatch_server import tails
from gradwatch_server.protocol import Hello, parse_message
from gradwatch_server.store import StepData, Store, backfill_blocks, open_store
from support.wiremsg import hello

pytestmark = pytest.mark.unit

P = 70
PARAMS = tuple(f"p{i}" for i in range(P))


def _open(db_url: str, run_id: str = "t") -> Store:
    store = open_store(db_url)
    message = parse_message(json.dumps(hello(run_id, params=PARAMS)))
    assert isinstance(message, Hello)
    store.open_run(message)
    return store


def _step(rng: np.random.Generator, seq: int, step: int) -> StepData:
    """A step as a hook sends it between measured ones (backward passes, clear codes, a few
    scalars), with a measured one every 10 steps, and special values now and then."""
    passes = rng.integers(1, 3, P).astype("<f4")
    arrays = {"backward_passes": passes.tobytes(), "grad_clear": np.ones(P, "<f4").tobytes()}
    if step % 10 == 1:
        grad = rng.lognormal(-2, 1, P).astype("<f4")
        grad[rng.random(P) < 0.05] = np.nan
        grad[rng.random(P) < 0.05] = -0.0
        arrays["grad_norm"] = grad.tobytes()
        arrays["grad_status"] = rng.integers(0, 4, P, dtype=np.uint8).tobytes()
    lr = float(rng.choice([1e-3, math.nan, math.inf, -0.0])) if rng.random() < 0.05 else 1e-3
    return StepData(seq, step, float(step), {"lr/0": lr, "backward_passes": float(passes.max())}, arrays)


def _blocks(store: Store) -> list[tuple[object, ...]]:
    with store.engine.connect() as conn:
        return [
            tuple(bytes(c) if isinstance(c, (bytes, memoryview)) else c for c in r)
            for r in conn.exec_driver_sql(
                "SELECT run_id, kind, metric, size, block, part, first_step, step_count, data FROM metric_blocks "
                "ORDER BY run_id, kind, metric, size, block, part"
            ).all()
        ]


def _recomputed(store: Store) -> list[tuple[object, ...]]:
    """The blocks as computed from scratch out of the stored rows (migration 0004's way)."""
    with store.engine.begin() as conn:
        conn.exec_driver_sql("DELETE FROM metric_blocks")
        backfill_blocks(conn)
    return _blocks(store)


def _reads(*tables: str) -> Iterator[list[str]]:
    """The statements that read any of `tables` while the test runs."""
    seen: list[str] = []

    def record(conn: object, cursor: object, statement: str, *args: object) -> None:
        text = statement.upper()
        if text.lstrip().startswith("SELECT") and any(f"FROM {t}" in text for t in tables):
            seen.append(statement)

    event.listen(Engine, "before_cursor_execute", record)
    yield seen
    event.remove(Engine, "before_cursor_execute", record)


@pytest.fixture
def raw_reads() -> Iterator[list[str]]:
    """The statements that read stored raw values (param_metrics, scalars) while the test runs."""
    yield from _reads("PARAM_METRICS", "SCALARS")


@pytest.fixture
def block_reads() -> Iterator[list[str]]:
    """The statements that read stored blocks back while the test runs."""
    yield from _reads("METRIC_BLOCKS")


def test_small_batches_close_blocks_from_memory_exactly(
    db_url: str, raw_reads: list[str], block_reads: list[str]
) -> None:
    store = _open(db_url)
    rng = np.random.default_rng(3)
    sizes = rng.integers(1, 40, 240)
    step = seq = 0
    try:
        for size in sizes:
            seq += 1
            batch = []
            for _ in range(size):
                step += 1
                batch.append(_step(rng, seq, step))
            store.write_steps("t", batch)
        assert step > 4 * 1024
        assert raw_reads == []  # every closed block came from memory
        assert block_reads == []  # the larger ones too: from the smaller blocks kept
        kept = _blocks(store)
        assert {r[3] for r in kept} >= {16, 64, 256, 1024, 4096}
        assert kept == _recomputed(store)
    finally:
        store.close()


def test_a_restarted_store_reads_back_until_each_open_block_is_its_own(
    db_url: str, raw_reads: list[str], block_reads: list[str]
) -> None:
    """A server restarted mid-run (a new store on the same database, nothing in memory) reads the
    smaller blocks of each open larger block back, stores the same blocks as a recomputation,
    and stops reading once every open block began after the restart."""
    store = _open(db_url)
    rng = np.random.default_rng(7)
    step = seq = 0

    def write(target: Store, until: int) -> None:
        nonlocal step, seq
        while step < until:
            seq += 1
            batch = []
            for _ in range(min(int(rng.integers(1, 40)), until - step)):
                step += 1
                batch.append(_step(rng, seq, step))
            target.write_steps("t", batch)

    try:
        write(store, 1500)
        store.close()
        store = open_store(db_url)
        write(store, 4200)  # the blocks open at the restart closed at 1,504 ... 2,048 and 4,096
        assert raw_reads and block_reads
        raw_reads.clear()
        block_reads.clear()
        write(store, 5300)  # every open block began after the restart
        assert raw_reads == [] and block_reads == []
        assert _blocks(store) == _recomputed(store)
    finally:
        store.close()


def test_another_writer_makes_the_store_read_back(db_url: str, raw_reads: list[str]) -> None:
    """Two stores on one database write the same run in turns (two workers, or a server and
    `gradwatch import`): neither may trust what it kept of the other's steps."""
    first, second = _open(db_url), open_store(db_url)
    rng = np.random.default_rng(4)
    step = seq = 0
    try:
        for turn in range(60):
            batch = []
            seq += 1
            for _ in range(int(rng.integers(1, 12))):
                step += 1
                batch.append(_step(rng, seq, step))
            (first if turn % 3 else second).write_steps("t", batch)
        assert raw_reads  # the writer after the other one read the open block back
        assert _blocks(first) == _recomputed(first)
    finally:
        first.close()
        second.close()


def test_a_step_into_a_closed_block_is_read_back(db_url: str, raw_reads: list[str]) -> None:
    """A spooled step delivered late lands behind the kept tail: its block is recomputed from
    the database, and the tail starts again at the next block."""
    store = _open(db_url)
    rng = np.random.default_rng(5)
    try:
        steps = [*range(1, 40), *range(41, 100)]
        for seq, lo in enumerate(range(0, len(steps), 9), start=1):
            store.write_steps("t", [_step(rng, seq, s) for s in steps[lo : lo + 9]])
        assert raw_reads == []
        store.write_steps("t", [_step(rng, 50, 40)])  # block 2 of 16 closed long ago
        assert len(raw_reads) == 2  # its raw values and scalars, once
        raw_reads.clear()
        for seq, lo in enumerate(range(100, 140, 7), start=51):
            store.write_steps("t", [_step(rng, seq, s) for s in range(lo, lo + 7)])
        assert len(raw_reads) == 2  # the open block 96..111 held steps it had not kept; then none
        assert _blocks(store) == _recomputed(store)
    finally:
        store.close()


def test_a_failed_write_leaves_no_tail_behind(db_url: str) -> None:
    """A tail is kept only once its write has committed: a batch that fails (here a step message
    whose arrays do not fit the run) changes nothing, and the next batch still builds on the last
    committed one."""
    store = _open(db_url)
    rng = np.random.default_rng(6)
    try:
        store.write_steps("t", [_step(rng, 1, s) for s in range(1, 10)])
        bad = StepData(2, 14, 14.0, {"lr/0": 1.0}, {"grad_norm": b"\x00" * 3})  # not a whole float32
        with pytest.raises(ValueError):  # found when block 0 closes, in the batch's transaction
            store.write_steps(
                "t", [*(_step(rng, 2, s) for s in range(10, 14)), bad, *(_step(rng, 2, s) for s in range(15, 18))]
            )
        assert store.get_run("t").steps == 9
        store.write_steps("t", [_step(rng, 3, s) for s in range(10, 40)])
        assert _blocks(store) == _recomputed(store)
    finally:
        store.close()


# -- pure functions --------------------------------------------------------------------------


def _s(step: int) -> StepData:
    return StepData(step, step, float(step), {}, {})


def test_next_tail_keeps_the_open_block_and_knows_what_it_does_not_hold() -> None:
    kept = tails.next_tail(None, [_s(1), _s(2)], None, 2, (2, 2))
    assert kept is not None and kept.start == 0 and [s.step for s in kept.steps] == [1, 2]
    kept = tails.next_tail(kept, [_s(s) for s in range(3, 20)], 2, 19, (19, 19))
    assert kept is not None and kept.start == 16 and [s.step for s in kept.steps] == [16, 17, 18, 19]
    assert tails.covers(kept, [_s(20)]) and not tails.covers(kept, [_s(15), _s(20)])
    # without a tail, the open block is known only when it starts after the last step before
    unknown = tails.next_tail(None, [_s(20)], 19, 20, (20, 20))
    assert unknown is not None and unknown.start is None and not tails.covers(unknown, [_s(21)])
    fresh = tails.next_tail(None, [_s(31), _s(32)], 30, 32, (21, 32))
    assert fresh is not None and fresh.start == 32 and [s.step for s in fresh.steps] == [32]


def test_tails_are_found_only_at_their_token_and_at_most_capacity_kept() -> None:
    kept = tails.Tails(capacity=2)
    for run in ("a", "b", "c"):
        kept.keep(run, tails.Tail((1, 1), 0, (_s(1),)))
    assert kept.get("a", (1, 1)) is None  # the oldest went
    assert kept.get("b", (1, 1)) is not None and kept.get("b", (2, 1)) is None
    kept.keep("b", None)
    assert kept.get("b", (1, 1)) is None


def test_tails_are_kept_within_their_byte_budget_the_latest_always() -> None:
    def tail(values: int) -> tails.Tail:
        step = StepData(1, 1, 1.0, {}, {"grad_norm": bytes(4 * values)})
        rows = {("param", "grad_norm"): {0: (0, 16, np.zeros(values, dtype=np.float64))}}
        return tails.Tail((1, 1), 0, (step,), {16: tails.Closed(0, rows)})

    assert tails.tail_nbytes(tail(100)) == 4 * 100 + 8 * 100
    kept = tails.Tails(budget=3_000)
    kept.keep("a", tail(100))  # 1,200 bytes
    kept.keep("b", tail(100))
    assert kept.nbytes == 2_400 and kept.get("a", (1, 1)) is not None
    kept.keep("c", tail(100))  # 3,600: the oldest goes
    assert kept.get("a", (1, 1)) is None and kept.get("b", (1, 1)) is not None and kept.nbytes == 2_400
    kept.keep("d", tail(1_000))  # alone over the budget: kept, every other one goes
    assert kept.nbytes == 12_000 and kept.get("d", (1, 1)) is not None
    assert kept.get("b", (1, 1)) is None and kept.get("c", (1, 1)) is None
    kept.keep("d", None)
    assert kept.nbytes == 0

"""The store on real databases: exact round trips, idempotency, runs, and the migrations.

The tests taking `store` or `db_url` run twice: on an SQLite file, and on an empty database of
a real PostgreSQL server (the `postgres` fixture of tests/conftest.py).
"""

from __future__ import annotations

import json
import math
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import event, text

from gradwatch_server.protocol import Hello, parse_message
from gradwatch_server.schema import metadata
from gradwatch_server.store import (
    DiagnosisMark,
    ParamsMismatch,
    StepData,
    Store,
    StoredFinding,
    StoreError,
    UnknownRun,
    create_db_engine,
    open_store,
)
from support.databases import Clock, new_database
from support.server import server_env
from support.wiremsg import ABSENT_BITS, f32, hello, with_absent

pytestmark = pytest.mark.unit

SPECIAL = [math.nan, math.inf, -math.inf, -0.0, 0.0, 5e-324, 1.7976931348623157e308, -1.5, 1e20]


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(db_url: str, clock: Clock) -> Iterator[Store]:
    s = open_store(db_url, clock=clock)
    yield s
    s.close()


@pytest.fixture
def sqlite_store(tmp_path: Path, clock: Clock) -> Iterator[Store]:
    s = open_store(f"sqlite:///{tmp_path / 'store.db'}", clock=clock)
    yield s
    s.close()


def open_hello(store: Store, run_id: str = "r", params: tuple[str, ...] = ("a.weight", "b.bias")) -> None:
    message = parse_message(json.dumps(hello(run_id, params=params)))
    assert isinstance(message, Hello)
    store.open_run(message)


def write(
    store: Store,
    run_id: str,
    seq: int,
    step: int,
    scalars: dict[str, float] | None = None,
    arrays: dict[str, bytes] | None = None,
) -> bool:
    """Store one step message; True if it was new."""
    return store.write_steps(run_id, [StepData(seq, step, float(step), scalars or {}, arrays or {})])[0]


def same_float(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))


def test_scalars_round_trip_exactly(store: Store) -> None:
    open_hello(store)
    for i, value in enumerate(SPECIAL, start=1):
        assert write(store, "r", i, i, scalars={"x": value}, arrays={})
    steps, values = store.scalar_series("r", "x")
    assert steps.tolist() == list(range(1, len(SPECIAL) + 1))
    assert all(same_float(a, b) for a, b in zip(values.tolist(), SPECIAL)), values
    chunk = next(store.iter_steps("r"))
    assert all(same_float(r.scalars["x"], v) for r, v in zip(chunk, SPECIAL))


def test_nan_is_not_matched_by_comparisons_in_sql(store: Store) -> None:
    open_hello(store)
    write(store, "r", 1, 1, scalars={"loss": math.nan}, arrays={})
    write(store, "r", 2, 2, scalars={"loss": 0.05}, arrays={})
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT step FROM scalars WHERE value < 0.1").all() == [(2,)]


def test_param_arrays_round_trip_bit_for_bit(store: Store) -> None:
    open_hello(store, params=("a", "b", "c", "d"))
    grad = with_absent(f32(np.nan, np.inf, -0.0, 1e-45), 0)
    other_nan = grad.copy()
    other_nan.view("<u4")[0] = 0x7FC00001  # a measured NaN with a payload, not ABSENT
    status = bytes([0, 1, 2, 3])
    write(
        store,
        "r",
        1,
        1,
        arrays={"grad_norm": grad.tobytes(), "exp_avg_norm": other_nan.tobytes(), "grad_status": status},
    )
    steps, rows = store.metric_rows("r", "grad_norm")
    assert steps.tolist() == [1] and rows.tobytes() == grad.tobytes()
    assert rows.view("<u4")[0, 0] == ABSENT_BITS
    assert store.metric_rows("r", "exp_avg_norm")[1].tobytes() == other_nan.tobytes()
    assert store.metric_rows("r", "grad_status")[1].tobytes() == status
    _, columns = store.metric_columns("r", "grad_norm", [3, 0, 2])
    assert columns.tobytes() == grad[[3, 0, 2]].tobytes()
    assert store.metric_columns("r", "grad_status", [3, 1])[1].tolist() == [[3, 1]]
    record = next(store.iter_steps("r"))[0]
    assert record.arrays["grad_norm"].tobytes() == grad.tobytes()
    assert record.arrays["grad_status"].dtype == np.uint8


def test_a_batch_is_stored_once_in_order(store: Store) -> None:
    open_hello(store)
    batch = [
        StepData(1, 1, 0.0, {"loss": 1.0}, {}),
        StepData(2, 2, 0.0, {"loss": 2.0}, {}),
        StepData(2, 2, 0.0, {"loss": 9.0}, {}),
        StepData(3, 2, 0.0, {"loss": 8.0}, {}),
        StepData(4, 4, 0.0, {"loss": 4.0}, {}),
    ]
    assert store.write_steps("r", batch) == [True, True, False, False, True]
    assert store.write_steps("r", batch) == [False] * 5
    assert store.scalar_series("r", "loss")[1].tolist() == [1.0, 2.0, 4.0]
    run = store.get_run("r")
    assert run is not None and (run.last_seq, run.steps, run.last_step) == (4, 3, 4)


def test_a_batch_is_stored_now_only_where_it_need_not_wait(store: Store, db_url: str) -> None:
    """`try_write_steps`: SQLite stores at once, as `write_steps` does; with the file's write lock
    held by another process's connection it answers None at once (not after the 10 s busy wait)
    and stores nothing, then stores once the lock is gone. PostgreSQL: always None (the caller's
    thread stores)."""
    open_hello(store)
    batch = [StepData(1, 1, 1.0, {"loss": 1.0}, {}), StepData(2, 2, 2.0, {"loss": 2.0}, {})]
    if not db_url.startswith("sqlite"):
        assert store.try_write_steps("r", batch) is None
        assert store.scalar_series("r", "loss")[0].tolist() == []
        return
    other = sqlite3.connect(db_url.removeprefix("sqlite:///"), isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # another writer holds the file
        began = time.monotonic()
        assert store.try_write_steps("r", batch) is None
        assert time.monotonic() - began < 2.0
        other.execute("ROLLBACK")
    finally:
        other.close()
    assert store.scalar_series("r", "loss")[0].tolist() == []
    assert store.try_write_steps("r", batch) == [True, True]
    assert store.try_write_steps("r", batch) == [False, False]  # as write_steps: stored once
    steps, values = store.scalar_series("r", "loss")
    assert (steps.tolist(), values.tolist()) == ([1, 2], [1.0, 2.0])
    later = [StepData(3, 3, 3.0, {"loss": 3.0}, {})]
    with ThreadPoolExecutor(1) as pool:  # the busy wait is back for the store's other writes
        other = sqlite3.connect(db_url.removeprefix("sqlite:///"), isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        waiting = pool.submit(store.write_steps, "r", later)
        time.sleep(0.5)
        assert not waiting.done()
        other.execute("ROLLBACK")
        other.close()
        assert waiting.result(timeout=10) == [True]


def test_writes_are_idempotent_and_update_the_run(store: Store, clock: Clock) -> None:
    open_hello(store)
    arrays = {"grad_norm": f32(1, 2).tobytes()}
    clock.now = 2000.0
    assert write(store, "r", 1, 5, scalars={"loss": 1.0}, arrays=arrays)
    assert not write(store, "r", 1, 6, scalars={"loss": 2.0}, arrays=arrays)
    assert not write(store, "r", 2, 5, scalars={"loss": 3.0}, arrays=arrays)
    assert write(store, "r", 3, 3, scalars={"loss": 4.0}, arrays=arrays)
    run = store.get_run("r")
    assert run is not None
    assert (run.last_seq, run.steps, run.last_step, run.updated_at) == (3, 2, 5, 2000.0)
    assert store.scalar_series("r", "loss")[1].tolist() == [4.0, 1.0]
    assert store.series_names("r", "scalar") == ["loss"] and store.series_names("r", "param") == ["grad_norm"]
    assert store.close_run("r", seq=4, status="finished")
    assert not store.close_run("r", seq=4, status="finished")
    run = store.get_run("r")
    assert run is not None and run.status == "finished" and run.finished_at == 2000.0


def test_a_close_resent_after_its_run_was_resumed_finishes_it_again(store: Store) -> None:
    """A hook whose close was committed but not acknowledged (the server was killed) reconnects:
    its hello resumes the run, and the close it sends again (the same seq) applies again."""
    open_hello(store)
    assert store.close_run("r", seq=1, status="finished")
    open_hello(store)  # resumed: running again, last seq 1
    assert store.close_run("r", seq=1, status="finished")
    run = store.get_run("r")
    assert run is not None and run.status == "finished"
    assert not store.close_run("r", seq=1, status="finished")  # a duplicate now


def test_series_names_are_in_code_point_order_on_every_database(store: Store) -> None:
    open_hello(store)
    write(store, "r", 1, 1, scalars={"alpha": 1.0, "Zeta": 2.0, "lr_max": 3.0, "lr/0": 4.0})
    assert store.series_names("r", "scalar") == ["Zeta", "alpha", "lr/0", "lr_max"]


def test_resume_checks_the_parameters(store: Store) -> None:
    open_hello(store)
    store.close_run("r", seq=1, status="finished")
    open_hello(store)  # same parameters: resumed
    run = store.get_run("r")
    assert run is not None and run.status == "running" and run.finished_at is None and run.last_seq == 1
    with pytest.raises(ParamsMismatch, match="parameter 1 is 'b.bias', the hello says 'c.bias'"):
        open_hello(store, params=("a.weight", "c.bias"))
    with pytest.raises(ParamsMismatch, match="it has 2 parameters, the hello lists 1"):
        open_hello(store, params=("a.weight",))


def test_concurrent_hellos_of_a_new_run_create_it_once(store: Store) -> None:
    """Writers take turns on SQLite but not on PostgreSQL: racing inserts must still resume."""
    for round_ in range(5):
        message = parse_message(json.dumps(hello(f"race{round_}")))
        assert isinstance(message, Hello)
        barrier = threading.Barrier(8)

        def open_it(_: int, message: Hello = message, barrier: threading.Barrier = barrier) -> bool:
            barrier.wait()
            return store.open_run(message).created

        with ThreadPoolExecutor(8) as pool:
            created = list(pool.map(open_it, range(8)))
        assert created.count(True) == 1


def test_writes_to_an_unknown_run_fail(store: Store) -> None:
    with pytest.raises(UnknownRun):
        write(store, "ghost", 1, 1, scalars={}, arrays={})


def test_mark_crashed_only_when_idle_and_running(store: Store, clock: Clock) -> None:
    open_hello(store)
    clock.now = 1500.0
    write(store, "r", 1, 1, scalars={}, arrays={})
    assert not store.mark_crashed("r", idle_since=1400.0)  # written after the timer started
    assert store.mark_crashed("r", idle_since=1500.0)
    assert not store.mark_crashed("r", idle_since=9999.0)  # not running any more
    run = store.get_run("r")
    assert run is not None and run.status == "crashed"


def test_list_runs_filters_and_orders(store: Store) -> None:
    for i, (run_id, project) in enumerate([("a", "p1"), ("b", "p2"), ("c", "p1")]):
        message = parse_message(json.dumps(hello(run_id, project=project, name=f"name_{i}%", started_at=100.0 + i)))
        assert isinstance(message, Hello)
        store.open_run(message)
    runs, count = store.list_runs()
    assert [r.id for r in runs] == ["c", "b", "a"] and count == 3
    assert [r.id for r in store.list_runs(project="p1")[0]] == ["c", "a"]
    assert [r.id for r in store.list_runs(q="NAME_1%")[0]] == ["b"]
    assert store.list_runs(q="_")[1] == 3 and store.list_runs(q="x%")[1] == 0
    assert [r.id for r in store.list_runs(limit=1, offset=1)[0]] == ["b"]


def test_thousands_of_runs_list_filtered_and_paged_exactly(store: Store) -> None:
    """1,100 runs (more than the largest page, 1,000) in 3 projects with many equal creation
    times: with a filter, pages of any size add up to the matching runs newest first (ties by
    id), each once, and `count` is theirs."""
    rng = np.random.default_rng(4)
    made = []
    for i in range(1100):  # storing the runs is most of the time: 1,100 keep every page size's seams
        run_id, project = f"r{i:04d}", ("alpha", "beta", "gamma")[i % 3]
        created = 1_700_000_000.0 + int(rng.integers(0, 150))  # about 7 runs a creation time, as before
        message = parse_message(json.dumps(hello(run_id, project=project, name=f"run {i}", started_at=created)))
        assert isinstance(message, Hello)
        store.open_run(message)
        status = "crashed" if i % 7 == 0 else "running"
        if status == "crashed":
            store.set_status(run_id, status, None)
        made.append((run_id, project, created, status))
    for where, keep in [
        ({"project": "beta", "status": "crashed"}, lambda m: m[1] == "beta" and m[3] == "crashed"),
        ({"q": "RUN 1"}, lambda m: f"run {int(m[0][1:])}".startswith("run 1")),
        ({}, lambda m: True),
    ]:
        expected = [m[0] for m in sorted((m for m in made if keep(m)), key=lambda m: (-m[2], m[0]))]
        for size in (1, 7, 250, 1000):
            if size == 1 and len(expected) > 200:
                continue
            seen: list[str] = []
            while True:
                page, count = store.list_runs(**where, limit=size, offset=len(seen))  # type: ignore[arg-type]
                assert count == len(expected)
                if not page:
                    break
                seen += [r.id for r in page]
            assert seen == expected, (where, size)


def test_delete_removes_everything(store: Store) -> None:
    open_hello(store)
    write(store, "r", 1, 1, scalars={"loss": 1.0}, arrays={"g": f32(1, 2).tobytes()})
    assert store.delete_run("r") and not store.delete_run("r")
    with store.engine.connect() as conn:
        for table in ("runs", "params", "groups", "steps", "scalars", "param_metrics", "series_names", "metric_blocks"):
            assert conn.exec_driver_sql(f'SELECT COUNT(*) FROM "{table}"').scalar() == 0, table
    open_hello(store)  # the id can be used again, names cache included
    write(store, "r", 1, 1, scalars={"loss": 1.0}, arrays={})
    assert store.series_names("r", "scalar") == ["loss"]


def test_a_deleted_run_is_told_from_one_never_stored(store: Store, clock: Clock) -> None:
    open_hello(store)
    assert store.deleted_at("r") is None  # stored now
    clock.now += 7
    deleted = clock.now
    assert store.delete_run("r")
    assert store.deleted_at("r") == deleted
    assert store.deleted_at("never") is None and store.deleted_at("nul\x00") is None
    assert not store.delete_run("never") and store.deleted_at("never") is None  # deleting nothing leaves no mark
    open_hello(store)  # the same id arrives again (a replayed spool): it is stored, not deleted
    assert store.get_run("r") is not None and store.deleted_at("r") is None


def test_tags_round_trip_filter_and_go_with_the_run(store: Store, clock: Clock) -> None:
    open_hello(store, "a")
    open_hello(store, "b")
    updated = store.get_run("a").updated_at  # type: ignore[union-attr]
    clock.now += 50
    assert store.update_run("a", tags=["x", "y", '"x"', "x"])
    assert store.update_run("b", name="bee", tags=["y"])
    a, b = store.get_run("a"), store.get_run("b")
    assert a is not None and b is not None
    assert a.tags == ["x", "y", '"x"'] and (b.name, b.tags) == ("bee", ["y"])
    assert a.updated_at == updated  # a label is not data: durations and crash timers stay
    assert {r.id for r in store.list_runs(tag="y")[0]} == {"a", "b"}
    assert [r.id for r in store.list_runs(tag="x")[0]] == ["a"]
    assert [r.id for r in store.list_runs(tag='"x"')[0]] == ["a"]
    assert store.list_runs(tag="X") == ([], 0) and store.list_runs(tag="x\x00") == ([], 0)
    assert store.update_run("a", name="renamed") and store.get_run("a").tags == ["x", "y", '"x"']  # type: ignore[union-attr]
    assert store.update_run("a", tags=["z"]) and store.get_run("a").tags == ["z"]  # type: ignore[union-attr]
    assert not store.update_run("nope", tags=["z"])
    assert store.delete_run("a")
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT COUNT(*) FROM run_tags WHERE run_id = 'a'").scalar() == 0
    assert [r.tags for r in store.list_runs()[0]] == [["y"]]


@pytest.mark.parametrize("with_findings", [False, True], ids=["mark only", "findings and mark"])
def test_two_transactions_diagnosing_a_new_run_at_once_both_succeed_on_postgresql(
    request: pytest.FixtureRequest, postgres: object, tmp_path: Path, with_findings: bool
) -> None:
    """The race of a job's start with `--workers 2`: two ranks' hellos, on two workers, each
    store the job's first diagnosis. The first transaction writes its rows and has not committed
    when the second looks for rows to replace (it finds none, and its insert waits on the first's
    key); once the first commits, the second must replace the rows, not fail on the primary key
    (it did: duplicate key on `diagnoses_pkey`, on `findings_pkey` with findings)."""
    from gradwatch_server.store import findings as stored_findings

    def found(message: str) -> list[StoredFinding]:
        if not with_findings:
            return []
        return [
            StoredFinding(
                code="nonfinite_grad", severity="error", message=message, params=[], first_step=1, figure=None
            )
        ]

    with new_database(request, "postgresql", tmp_path) as url:
        store = open_store(url)
        try:
            open_hello(store, "job")
            errors: list[BaseException] = []

            def second() -> None:
                try:
                    store.save_findings("job", found("second"), DiagnosisMark(steps=2, last_step=2, version=1))
                except BaseException as exc:
                    errors.append(exc)

            with store.engine.connect() as conn:
                first = conn.begin()
                stored_findings.save_findings(conn, "job", found("first"), DiagnosisMark(1, 1, 1), False, 1.0)
                thread = threading.Thread(target=second)
                thread.start()
                with store.engine.connect() as watch:  # until the second waits on the first's key
                    deadline = time.monotonic() + 30
                    waiting = 0
                    while not waiting:
                        assert time.monotonic() < deadline, "the second transaction never waited on the first"
                        assert thread.is_alive(), f"the second transaction ended without waiting: {errors}"
                        time.sleep(0.02)
                        waiting = watch.execute(
                            text(
                                "SELECT count(*) FROM pg_stat_activity "
                                "WHERE wait_event_type = 'Lock' AND datname = current_database()"
                            )
                        ).scalar()
                        watch.rollback()  # pg_stat_activity is a snapshot per transaction: a new one each time
                first.commit()
            thread.join(30)
            assert not thread.is_alive()
            assert errors == []
            assert store.get_diagnosis("job") == DiagnosisMark(steps=2, last_step=2, version=1)
            assert [f.message for f in store.get_findings("job")] == (["second"] if with_findings else [])
        finally:
            store.close()


def test_run_list_counts_findings_in_a_fixed_number_of_queries(store: Store) -> None:
    """Tags and findings counts of a page of runs cost two queries in all, not two per run."""

    def finding(code: str, severity: str) -> StoredFinding:
        return StoredFinding(code=code, severity=severity, message="m", params=[], first_step=1, figure=None)

    for i in range(6):
        open_hello(store, f"r{i}")
    store.save_findings(
        "r0",
        [
            finding("nonfinite_grad", "error"),
            finding("step_without_grad", "error"),
            finding("exploding_grad", "warning"),
            finding("grad_accumulation", "info"),
        ],
    )
    store.save_findings("r1", [finding("param_never_gets_grad", "warning")])
    store.update_run("r1", tags=["t"])
    statements: list[str] = []

    def count(*args: object) -> None:
        statements.append(str(args[2]))

    event.listen(store.engine, "before_cursor_execute", count)
    try:
        runs, _ = store.list_runs()
        many = len(statements)
        statements.clear()
        store.list_runs(limit=1)
        one = len(statements)
    finally:
        event.remove(store.engine, "before_cursor_execute", count)
    assert many == one == 4  # count, page, tags, findings
    by_id = {r.id: r for r in runs}
    assert by_id["r0"].findings == {"error": 2, "warning": 1, "info": 1}
    assert by_id["r1"].findings == {"error": 0, "warning": 1, "info": 0} and by_id["r1"].tags == ["t"]
    assert by_id["r2"].findings == {"error": 0, "warning": 0, "info": 0} and by_id["r2"].tags == []
    assert store.get_run("r0").findings == by_id["r0"].findings  # type: ignore[union-attr]


def test_step_times(store: Store) -> None:
    open_hello(store)
    store.write_steps("r", [StepData(i, step, 100.0 + step / 2, {}, {}) for i, step in enumerate((2, 3, 5, 9), 1)])
    times, first = store.step_times("r", [3, 4, 9])
    assert first == 101.0 and times[0] == 101.5 and np.isnan(times[1]) and times[2] == 104.5
    assert store.step_times("r", [])[1] == 101.0
    open_hello(store, "empty")
    assert store.step_times("empty", [1])[1] is None


def test_sqlite_pragmas(sqlite_store: Store) -> None:
    with sqlite_store.engine.connect() as conn:
        values = {
            name: conn.exec_driver_sql(f"PRAGMA {name}").scalar()
            for name in ("journal_mode", "synchronous", "foreign_keys", "busy_timeout")
        }
    assert values == {"journal_mode": "wal", "synchronous": 1, "foreign_keys": 1, "busy_timeout": 10000}


def test_migrations_create_exactly_the_schema(store: Store) -> None:
    with store.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), metadata)
        if conn.dialect.name == "sqlite":
            # Migration 0006 adds runs.parent_id with an inline REFERENCES (SQLite cannot add a
            # table constraint to a table it keeps); SQLAlchemy reflects ON DELETE only from the
            # FOREIGN KEY (...) form, so the database itself is asked for the rule.
            diff = [d for d in diff if not _parent_fk(d)]
            rules = {(r[3], r[2], r[4], r[6]) for r in conn.exec_driver_sql("PRAGMA foreign_key_list(runs)").fetchall()}
            assert rules == {("parent_id", "runs", "id", "CASCADE")}
    assert diff == []


def _parent_fk(change: object) -> bool:
    """A (remove_fk | add_fk, constraint) pair of runs.parent_id -> runs.id, as compare_metadata gives it."""
    if not isinstance(change, tuple) or change[0] not in ("remove_fk", "add_fk"):
        return False
    fk = change[1]
    return bool(fk.table.name == "runs" and [c.name for c in fk.columns] == ["parent_id"])


def test_reopening_is_a_no_op(db_url: str) -> None:
    first = open_store(db_url)
    open_hello(first)
    first.close()
    second = open_store(db_url)
    assert second.get_run("r") is not None
    second.close()


def test_processes_starting_together_on_a_new_database_all_open_it(db_url: str) -> None:
    """Two servers, or a server and `gradwatch import`: one creates the schema, the others wait."""
    # Each child says when it has imported gradwatch_server, then waits for the word to open
    # the store: all three open it at once, and nobody waits out a fixed delay.
    code = (
        "import sys; from gradwatch_server.store import open_store; "
        "print('ready', flush=True); sys.stdin.readline(); open_store(sys.argv[1]).close()"
    )
    children = [
        subprocess.Popen(
            [sys.executable, "-c", code, db_url],
            env=server_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(3)
    ]
    for child in children:
        assert child.stdout is not None
        assert child.stdout.readline() == "ready\n", child.communicate(timeout=60)[0]
    for child in children:
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
    outputs = [child.communicate(timeout=60)[0] for child in children]
    assert [child.returncode for child in children] == [0] * 3, outputs
    store = open_store(db_url)
    assert store.list_runs() == ([], 0)
    store.close()


def test_a_schema_from_a_newer_version_is_refused(db_url: str) -> None:
    open_store(db_url).close()
    engine = create_db_engine(db_url)
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE alembic_version SET version_num = '9999'")
    engine.dispose()
    with pytest.raises(StoreError, match="newer gradwatch-server"):
        open_store(db_url)


def test_unusable_databases_give_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="does not exist"):
        open_store(f"sqlite:///{tmp_path / 'missing' / 'x.db'}")
    with pytest.raises(StoreError, match="cannot open database") as refused:
        open_store("postgresql://user:s3cret@127.0.0.1:1/db")
    assert "s3cret" not in str(refused.value)  # the message may reach logs: no password in it

"""Schema migrations (gradwatch_server/migrations): a database written by an older version opens,
is upgraded in place, and keeps what it held."""

from __future__ import annotations

import json
from importlib import resources

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import text

from gradwatch_server.protocol import Hello, parse_message
from gradwatch_server.store import StepData, create_db_engine, open_store
from support.wiremsg import hello, rank_hello

pytestmark = pytest.mark.unit


def _at_revision(url: str, revision: str) -> None:
    """Create the schema of `revision` only, as that version of gradwatch-server left it."""
    config = Config()
    config.set_main_option("script_location", str(resources.files("gradwatch_server.migrations")))
    engine = create_db_engine(url)
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, revision)
    engine.dispose()


def _run_row(run_id: str, parent_id: str | None, rank: int | None, world_size: int | None) -> dict[str, object]:
    return {
        "id": run_id,
        "name": run_id,
        "project": "p",
        "status": "finished",
        "created_at": 1.0,
        "updated_at": 2.0,
        "last_seq": 0,
        "steps": 0,
        "param_count": 0,
        "param_numel": 0,
        "config": "{}",
        "parent_id": parent_id,
        "rank": rank,
        "world_size": world_size,
    }


def test_a_0006_database_gets_each_runs_kind_and_the_rank_summaries(db_url: str) -> None:
    """Before 0007 a run's kind was guessed from parent_id and world_size; the upgrade stores it."""
    _at_revision(db_url, "0006")
    engine = create_db_engine(db_url)
    with engine.begin() as conn:
        for row in (
            _run_row("solo", None, None, None),
            _run_row("job", None, None, 2),
            _run_row("job.r0", "job", 0, 2),
            _run_row("job.r1", "job", 1, 2),
        ):
            conn.execute(
                text(
                    "INSERT INTO runs (id, name, project, status, created_at, updated_at, last_seq, steps, "
                    "param_count, param_numel, config, parent_id, rank, world_size) VALUES (:id, :name, "
                    ":project, :status, :created_at, :updated_at, :last_seq, :steps, :param_count, "
                    ":param_numel, :config, :parent_id, :rank, :world_size)"
                ),
                row,
            )
    engine.dispose()
    store = open_store(db_url)
    try:
        kinds = {r: run.kind for r in ("solo", "job", "job.r0", "job.r1") if (run := store.get_run(r)) is not None}
        assert kinds == {"solo": "run", "job": "job", "job.r0": "rank", "job.r1": "rank"}
        assert [run.id for run in store.rank_runs("job")] == ["job.r0", "job.r1"]
        assert sorted(run.id for run in store.list_runs()[0]) == ["job", "solo"]  # a rank's run is never listed
        assert store.rank_summaries("job").step.tolist() == []  # the new table, empty
    finally:
        store.close()


def test_a_new_run_is_stored_with_its_kind(db_url: str) -> None:
    store = open_store(db_url)
    try:
        for message in (hello("solo", ["w"]), rank_hello("job", 1, 2)):
            parsed = parse_message(json.dumps(message))
            assert isinstance(parsed, Hello)
            if parsed.dist is None:
                store.open_run(parsed)
            else:
                store.open_rank(parsed)
        kinds = {r: run.kind for r in ("solo", "job", "job.r1") if (run := store.get_run(r)) is not None}
        assert kinds == {"solo": "run", "job": "job", "job.r1": "rank"}
    finally:
        store.close()


def test_a_downgrade_below_0009_gives_a_rank_that_shares_its_jobs_list_its_rows_back(db_url: str) -> None:
    """A rank's run opened since 0009 keeps its pieces, not rows; going back to 0008 (whose
    readers expect rows) writes the job's rows with the rank's pieces."""
    store = open_store(db_url)
    for rank in (0, 1):
        parsed = parse_message(json.dumps(rank_hello("j", rank, 2, local_numel=[3, 3], counted=[True, rank == 0])))
        assert isinstance(parsed, Hello)
        store.open_rank(parsed)
    assert store.get_params("j.r1")[1].counted is False
    store.close()
    config = Config()
    config.set_main_option("script_location", str(resources.files("gradwatch_server.migrations")))
    engine = create_db_engine(db_url)
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "0008")
        rows = conn.execute(
            text("SELECT name, local_numel, counted FROM params WHERE run_id = 'j.r1' ORDER BY idx")
        ).all()
    engine.dispose()
    assert [(r.name, r.local_numel, bool(r.counted)) for r in rows] == [("fc.weight", 3, True), ("fc.bias", 3, False)]


def test_a_0009_database_keeps_reading_its_ranks_rows_and_stores_new_ones_as_rank_steps(db_url: str) -> None:
    """0010 adds tables only: a rank's steps stored before (a `steps` row, a `scalars` row per
    scalar, a `rank_summaries` row) are read as before, beside those stored since (one
    `rank_steps` row each)."""
    _at_revision(db_url, "0009")
    engine = create_db_engine(db_url)
    with engine.begin() as conn:
        for row in (_run_row("job", None, None, 2), _run_row("job.r0", "job", 0, 2)):
            kind = "job" if row["parent_id"] is None else "rank"
            conn.execute(
                text(
                    "INSERT INTO runs (id, name, project, status, created_at, updated_at, last_seq, steps, "
                    "param_count, param_numel, config, parent_id, rank, world_size, kind) VALUES (:id, :name, "
                    ":project, :status, :created_at, :updated_at, 1, 1, :param_count, :param_numel, :config, "
                    ":parent_id, :rank, :world_size, :kind)"
                ),
                {**row, "kind": kind},
            )
        conn.execute(text("INSERT INTO steps (run_id, step, seq, time) VALUES ('job.r0', 1, 1, 10.0)"))
        conn.execute(text("INSERT INTO scalars (run_id, key, step, value) VALUES ('job.r0', 'time/step_s', 1, 0.5)"))
        conn.execute(text("INSERT INTO series_names (run_id, kind, name) VALUES ('job.r0', 'scalar', 'time/step_s')"))
        conn.execute(
            text(
                "INSERT INTO rank_summaries (run_id, step, time, step_s, memory_bytes) "
                "VALUES ('job.r0', 1, 10.0, 0.5, 100.0)"
            )
        )
    engine.dispose()
    store = open_store(db_url)
    try:
        assert store.write_steps("job.r0", [StepData(2, 2, 11.0, {"time/step_s": 0.25, "mem/rss_bytes": 200.0}, {})])
        found, values = store.scalar_series("job.r0", "time/step_s")
        assert (found.tolist(), values.tolist()) == ([1, 2], [0.5, 0.25])
        summaries = store.rank_summaries("job")
        assert (summaries.step.tolist(), summaries.step_s.tolist(), summaries.memory_bytes.tolist()) == (
            [1, 2],
            [0.5, 0.25],
            [100.0, 200.0],
        )
        assert [s.step for chunk in store.iter_steps("job.r0") for s in chunk] == [1, 2]
        assert store.get_run("job") is not None and [r.id for r in store.rank_runs("job")] == ["job.r0"]
    finally:
        store.close()


def test_a_ranks_step_stored_before_0010_and_assembled_after_keeps_its_summary(db_url: str) -> None:
    """A running job's rank step stored before 0010 (a `steps` row and its scalars, no summary
    yet: the job's assembly wrote the summary) and assembled after the upgrade gets its summary
    (a `rank_summaries` row, as the assembly wrote before 0010), read by the Ranks view beside
    those of the steps stored since; the summary outlives the rank's scalars, pruned later."""
    _at_revision(db_url, "0009")
    engine = create_db_engine(db_url)
    with engine.begin() as conn:
        for row in (_run_row("job", None, None, 1), _run_row("job.r0", "job", 0, 1)):
            kind = "job" if row["parent_id"] is None else "rank"
            conn.execute(
                text(
                    "INSERT INTO runs (id, name, project, status, created_at, updated_at, last_seq, steps, "
                    "param_count, param_numel, config, parent_id, rank, world_size, kind, last_step) VALUES "
                    "(:id, :name, :project, 'running', :created_at, :updated_at, :seq, :steps, :param_count, "
                    ":param_numel, :config, :parent_id, :rank, :world_size, :kind, :last_step)"
                ),
                {
                    **row,
                    "kind": kind,
                    "seq": 0 if kind == "job" else 1,
                    "steps": 0 if kind == "job" else 1,
                    "last_step": None if kind == "job" else 1,
                },
            )
        for run_id in ("job", "job.r0"):
            conn.execute(
                text(
                    "INSERT INTO params (run_id, idx, name, shape, numel, dtype, group_idx, optimizer_idx, "
                    "local_numel, counted) VALUES (:run_id, 0, 'w', '[2]', 2, 'float32', 0, 0, :local, :counted)"
                ),
                {
                    "run_id": run_id,
                    "local": None if run_id == "job" else 2,
                    "counted": None if run_id == "job" else True,
                },
            )
        conn.execute(text("INSERT INTO steps (run_id, step, seq, time) VALUES ('job.r0', 1, 1, 10.0)"))
        for key, value in (("time/step_s", 0.5), ("mem/rss_bytes", 100.0)):
            conn.execute(
                text("INSERT INTO scalars (run_id, key, step, value) VALUES ('job.r0', :key, 1, :value)"),
                {"key": key, "value": value},
            )
            conn.execute(
                text("INSERT INTO series_names (run_id, kind, name) VALUES ('job.r0', 'scalar', :key)"), {"key": key}
            )
    engine.dispose()
    store = open_store(db_url)
    try:
        assert store.write_steps("job.r0", [StepData(2, 2, 11.0, {"time/step_s": 0.25, "mem/rss_bytes": 200.0}, {})])
        done = store.assemble("job", rank_timeout=60.0, since=0.0)
        assert [d.step for d in done.steps] == [1, 2] and not done.partial
        summaries = store.rank_summaries("job")
        assert (summaries.step.tolist(), summaries.step_s.tolist(), summaries.memory_bytes.tolist()) == (
            [1, 2],
            [0.5, 0.25],
            [100.0, 200.0],
        )
    finally:
        store.close()

"""The `gradwatch` command as users run it: help, exit codes, runs, export, import and gc."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError

from gradwatch_server import cli
from gradwatch_server.settings import Settings
from support.scripts import Done, run_main
from support.server import find_free_port, server_command, server_env, start_server
from support.wiremsg import Hook, close, f32, hello, step, with_absent

pytestmark = pytest.mark.unit  # a test that starts a server says so (@pytest.mark.server)


def gradwatch(*args: str, cwd: Path | None = None, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*server_command(), *args], capture_output=True, text=True, timeout=120, cwd=cwd, env=server_env(), input=stdin
    )


def parsed(*args: str) -> Done:
    """`gradwatch *args` in this process, for what the argument handling decides (help, usage
    errors) before a command does anything, and for a command's refusals of bad input: the tests
    below run each command as a process too."""
    return run_main(cli.main, Path("gradwatch"), list(args))


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database with one finished run, written through a real server."""
    server = start_server(tmp_path_factory.mktemp("cli"))
    try:
        with Hook(server.ws_url) as hook:
            hook.call(hello("cli-run", params=("w", "b"), name="cli run"))
            for i in range(1, 6):
                hook.call(
                    step(
                        i,
                        i,
                        scalars={"loss": "Infinity" if i == 2 else 1.0 / i},
                        arrays={"grad_norm": with_absent(f32(i, -0.0), 1) if i == 1 else f32(i, np.nan)},
                        grad_status=[2, 3],
                    )
                )
            hook.call(close(6))
    finally:
        server.stop()
    return server.db_path


@pytest.fixture(scope="module")
def exported(db: Path) -> str:
    """The run of `db` as `gradwatch export --format json` writes it, once for the tests that import it."""
    result = gradwatch("export", "cli-run", "--format", "json", "--db", str(db))
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize("command", [[], ["serve"], ["runs"], ["export"], ["import"], ["sync"], ["gc"]])
def test_every_command_has_help(command: list[str]) -> None:
    result = parsed(*command, "--help")
    assert result.returncode == 0 and result.stdout.startswith("usage: gradwatch")


def test_usage_errors_exit_2() -> None:
    assert parsed().returncode == 2
    result = parsed("export", "r", "--format", "xml")
    assert result.returncode == 2 and "invalid choice: 'xml'" in result.stderr
    result = gradwatch("serve", "--port", "70000")
    assert result.returncode == 2 and "port" in result.stderr


@pytest.mark.server
def test_runs_lists_the_database(db: Path) -> None:
    result = gradwatch("runs", "--db", str(db))
    assert result.returncode == 0
    header, row = result.stdout.splitlines()
    assert header.split() == ["ID", "NAME", "PROJECT", "STATUS", "STEPS", "CREATED"]
    assert row.split()[:6] == ["cli-run", "cli", "run", "tests", "finished", "5"]


@pytest.mark.server
def test_export_csv_to_stdout_and_by_name(db: Path) -> None:
    by_id = gradwatch("export", "cli-run", "--db", f"sqlite:///{db}")
    by_name = gradwatch("export", "cli run", "--db", str(db))
    assert by_id.returncode == 0 and by_id.stdout == by_name.stdout
    rows = list(csv.DictReader(io.StringIO(by_id.stdout)))
    assert len(rows) == 10 and rows[1]["grad_norm"] == "" and rows[3]["grad_norm"] == "nan"


@pytest.mark.server
def test_export_parquet_to_a_file(db: Path, tmp_path: Path) -> None:
    out = tmp_path / "run.parquet"
    result = gradwatch("export", "cli-run", "--format", "parquet", "-o", str(out), "--db", str(db))
    assert result.returncode == 0 and f"wrote run cli-run to {out}" in result.stderr
    assert pq.read_table(out).num_rows == 10


@pytest.mark.server
def test_export_of_an_unknown_run_fails_with_a_hint(db: Path) -> None:
    result = parsed("export", "nope", "--db", str(db))  # in this process: `export` runs as one above
    assert result.returncode == 1 and "gradwatch runs" in result.stderr and not result.stdout


def test_missing_database_folder_fails_clearly(tmp_path: Path) -> None:
    result = parsed("runs", "--db", str(tmp_path / "no" / "such.db"))  # `runs` runs as a process above
    assert result.returncode == 1 and "does not exist" in result.stderr


@pytest.mark.server
def test_json_export_imports_back_identically(exported: str, tmp_path: Path, db_url: str) -> None:
    """From SQLite into another SQLite file, or into PostgreSQL: runs move between servers."""
    dump = tmp_path / "run.jsonl"
    dump.write_text(exported)
    copy = db_url
    first = gradwatch("import", str(dump), "--db", str(copy))
    assert first.returncode == 0 and "5 steps stored, 0 already there" in first.stdout
    again = gradwatch("import", "-", "--db", str(copy), stdin=exported)
    assert again.returncode == 0 and "0 steps stored, 5 already there" in again.stdout
    reexported = gradwatch("export", "cli-run", "--format", "json", "--db", str(copy)).stdout

    def comparable(text: str) -> list[dict[str, object]]:
        lines = [json.loads(line) for line in text.splitlines()]
        lines[0]["run"].pop("updated_at")
        return lines

    assert comparable(reexported) == comparable(exported)


@pytest.mark.server
def test_import_keeps_the_tags_and_refuses_bad_ones(exported: str, tmp_path: Path) -> None:
    lines = exported.splitlines()
    head = json.loads(lines[0])
    assert head["run"]["tags"] == [] and "findings" not in head["run"]  # findings are derived again
    head["run"]["tags"] = ["imported", "<b>x</b>"]
    dump = tmp_path / "tagged.jsonl"
    dump.write_text("\n".join([json.dumps(head), *lines[1:]]) + "\n")
    copy = tmp_path / "copy.db"
    imported = gradwatch("import", str(dump), "--db", str(copy))
    assert imported.returncode == 0, imported.stderr
    exported = gradwatch("export", "cli-run", "--format", "json", "--db", str(copy))
    assert exported.returncode == 0, exported.stderr
    again = json.loads(exported.stdout.splitlines()[0])
    assert again["run"]["tags"] == ["imported", "<b>x</b>"]
    head["run"]["tags"] = ["a,b"]
    dump.write_text("\n".join([json.dumps(head), *lines[1:]]) + "\n")
    refused = parsed("import", str(dump), "--db", str(tmp_path / "other.db"))  # in this process
    assert refused.returncode != 0 and "line 1" in refused.stderr and "comma" in refused.stderr


def test_an_unreachable_postgres_fails_clearly_without_showing_the_password() -> None:
    result = gradwatch("serve", "--db", "postgresql://me:s3cret@127.0.0.1:1/gradwatch")
    assert result.returncode == 1 and "cannot open database" in result.stderr
    assert "s3cret" not in result.stdout + result.stderr and "me:***@" in result.stderr


def test_import_refuses_what_is_not_an_export(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"type": "step"}\n')
    # in this process: `import` runs as a process in the tests above
    result = parsed("import", str(bad), "--db", str(tmp_path / "x.db"))
    assert result.returncode == 1 and "line 1" in result.stderr
    result = parsed("import", str(tmp_path / "missing.jsonl"), "--db", str(tmp_path / "x.db"))
    assert result.returncode == 1 and "cannot read" in result.stderr


#: Rank timeouts refused alike on the command line and in the environment: not finite, or so
#: small that the timer looking for lost ranks would spin.
BAD_RANK_TIMEOUTS = ("0", "-1", "inf", "-inf", "nan", "1e-9", "0.099")


def test_serve_takes_a_rank_timeout() -> None:
    help_text = " ".join(parsed("serve", "--help").stdout.split())
    assert "--rank-timeout SECONDS" in help_text and "then 30" in help_text and "partial" in help_text
    for bad in BAD_RANK_TIMEOUTS:
        result = parsed("serve", f"--rank-timeout={bad}")
        assert result.returncode == 2 and "--rank-timeout" in result.stderr, result.stderr
        assert "finite number of seconds of at least 0.1" in result.stderr and "pass e.g. 30" in result.stderr
    result = parsed("serve", "--rank-timeout", "soon")
    assert result.returncode == 2 and "not a number of seconds: 'soon'" in result.stderr, result.stderr
    assert Settings.from_env({}).rank_timeout_s == 30.0
    assert Settings.from_env({"GRADWATCH_RANK_TIMEOUT_S": "2.5"}).rank_timeout_s == 2.5
    assert Settings.from_env({"GRADWATCH_RANK_TIMEOUT_S": "0.1"}).rank_timeout_s == 0.1
    assert Settings.from_env({"GRADWATCH_RANK_TIMEOUT_S": "2.5"}, rank_timeout_s=4.0).rank_timeout_s == 4.0


@pytest.mark.parametrize("bad", BAD_RANK_TIMEOUTS)
def test_serve_refuses_a_bad_rank_timeout_from_the_environment(bad: str, tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="finite number of seconds of at least 0.1"):
        Settings.from_env({"GRADWATCH_RANK_TIMEOUT_S": bad})
    try:
        result = subprocess.run(
            [*server_command(), "serve", "--db", str(tmp_path / "x.db"), "--port", str(find_free_port())],
            capture_output=True,
            text=True,
            timeout=30,
            env=server_env({"GRADWATCH_RANK_TIMEOUT_S": bad}),
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"gradwatch serve started with GRADWATCH_RANK_TIMEOUT_S={bad}")
    assert result.returncode == 2, result.stderr
    assert "invalid setting: rank_timeout_s" in result.stderr and "pass e.g. 30" in result.stderr, result.stderr


def test_settings_come_from_an_injected_environment() -> None:
    settings = Settings.from_env(
        {"GRADWATCH_DB": "runs.db", "GRADWATCH_PORT": "9000", "GRADWATCH_TOKEN": ""}, host="0.0.0.0"
    )
    assert settings.db_url == "sqlite:///runs.db" and settings.port == 9000
    assert settings.token is None and settings.host == "0.0.0.0"
    assert Settings.from_env({}, db_url="sqlite:///x.db").db_url == "sqlite:///x.db"


@pytest.mark.server
def test_serve_on_a_port_in_use_exits_1(tmp_path: Path) -> None:
    # One server on SQLite holds the port: the second `serve` opens only its own database and then
    # fails on the port, so the first server's database (once also PostgreSQL) plays no part.
    server = start_server(tmp_path)
    try:
        port = server.url.rsplit(":", 1)[1]
        result = gradwatch("serve", "--db", str(tmp_path / "second.db"), "--port", port)
        assert result.returncode == 1 and "pass --port" in result.stderr
    finally:
        server.stop()


# -- gc ----------------------------------------------------------------------------------------

GC_RUNS = [
    ("old-done", 100, "finished"),
    ("old-crash", 100, "crashed"),
    ("new-crash", 0, "crashed"),
    ("new-done", 0, "finished"),
    ("old-live", 100, "running"),
]
TABLES = ("runs", "params", "groups", "steps", "scalars", "param_metrics", "metric_blocks", "series_names")


def gc_database(db_url: str) -> None:
    """The runs of GC_RUNS (id, age in days, status), written through the store; old-done is the big one."""
    from gradwatch_server.protocol import Hello, parse_message
    from gradwatch_server.store import StepData, open_store

    store = open_store(db_url)
    now, rng = time.time(), np.random.default_rng(0)
    for run_id, days, status in GC_RUNS:
        message = parse_message(
            json.dumps(
                hello(
                    run_id,
                    params=tuple(f"p{i}.weight" for i in range(64)),
                    project="gc",
                    started_at=now - days * 86400 - 60,
                )
            )
        )
        assert isinstance(message, Hello)
        store.open_run(message)
        count = 600 if run_id == "old-done" else 20
        store.write_steps(
            run_id,
            [
                StepData(i, i, now, {"loss": 1.0 / i}, {"grad_norm": rng.random(64).astype("<f4").tobytes()})
                for i in range(1, count + 1)
            ],
        )
        if status != "running":
            store.set_status(run_id, status, now)
    store.close()


def rows_of(db_url: str) -> dict[str, set[str]]:
    """Per table, the run ids it has rows of."""
    from gradwatch_server.store import create_db_engine

    engine = create_db_engine(db_url)
    with engine.connect() as conn:
        found = {
            t: {r[0] for r in conn.exec_driver_sql(f"SELECT DISTINCT {'id' if t == 'runs' else 'run_id'} FROM {t}")}
            for t in TABLES
        }
    engine.dispose()
    return found


def sqlite_bytes(db_url: str) -> int:
    path = db_url.removeprefix("sqlite:///")
    return sum(Path(path + s).stat().st_size for s in ("", "-wal") if Path(path + s).exists())


def test_gc_dry_run_changes_nothing_then_gc_deletes_the_chosen_runs_with_all_their_data_and_compacts(
    db_url: str,
) -> None:
    """The dry run and the deletions on one database of GC_RUNS (writing it is most of the time)."""
    gc_database(db_url)
    before = rows_of(db_url)
    result = gradwatch("gc", "--older-than", "30", "--dry-run", "--db", db_url)
    assert result.returncode == 0, result.stderr
    listed = [line.split()[0] for line in result.stdout.splitlines() if line.startswith(("old-", "new-"))]
    assert listed == ["old-done", "old-crash"] or listed == ["old-crash", "old-done"]  # never the running one
    assert "would delete 2 runs (620 steps)" in result.stdout and "nothing changed" in result.stdout
    assert rows_of(db_url) == before
    refused = gradwatch("gc", "--older-than", "30", "--db", db_url)  # no terminal to ask, no --yes
    assert refused.returncode == 2 and "--yes" in refused.stderr
    assert rows_of(db_url)["runs"] == {r for r, _, _ in GC_RUNS}
    size = sqlite_bytes(db_url) if db_url.startswith("sqlite") else 0
    done = gradwatch("gc", "--older-than", "30", "--yes", "--db", db_url)
    assert done.returncode == 0, done.stderr
    assert "deleted 2 runs" in done.stdout and "compacted:" in done.stdout
    left = rows_of(db_url)
    assert left["runs"] == {"new-crash", "new-done", "old-live"}
    for table in TABLES:  # every row of the deleted runs is gone
        assert not left[table] & {"old-done", "old-crash"}, table
    if size:
        assert sqlite_bytes(db_url) < size * 0.6  # VACUUM gave the big run's pages back
    crashed = gradwatch("gc", "--crashed", "-y", "--no-vacuum", "--db", db_url)
    assert crashed.returncode == 0 and "deleted 1 runs" in crashed.stdout and "compact" not in crashed.stdout
    assert rows_of(db_url)["runs"] == {"new-done", "old-live"}
    only = gradwatch("gc", "--db", db_url)  # no selection: compacts only
    assert only.returncode == 0 and "deleted" not in only.stdout and "compacted:" in only.stdout
    assert rows_of(db_url)["runs"] == {"new-done", "old-live"}


def test_gc_usage_errors_exit_2(tmp_path: Path) -> None:
    db = str(tmp_path / "gc.db")
    for args, says in [
        (["--project", "p"], "narrows"),
        (["--older-than", "-1"], "0 or more"),
        (["--older-than", "x"], "not a number"),
        (["--crashed", "--dry-run", "--yes"], "not allowed"),
    ]:
        result = parsed("gc", *args, "--db", db)
        assert result.returncode == 2 and says in result.stderr, (args, result.stderr)


def test_sync_without_the_hook_installed_says_to_install_it(tmp_path: Path) -> None:
    """`gradwatch sync` runs the hook's command; where the hook is missing it says what to install."""
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['gradwatch'] = None  # not installed\n")
    env = server_env()
    env["PYTHONPATH"] = f"{tmp_path}:{env.get('PYTHONPATH', '')}"
    out = subprocess.run([*server_command(), "sync"], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 1
    assert "pip install gradwatch" in out.stderr and "Traceback" not in out.stderr


def test_sync_passes_the_hooks_exit_status_on(tmp_path: Path) -> None:
    out = gradwatch("sync", "--spool", str(tmp_path / "missing"))
    assert out.returncode == 2 and "no spool folder" in out.stderr


def test_sync_runs_without_loading_the_store(tmp_path: Path) -> None:
    """`gradwatch sync` only starts the hook's command: the database layer (SQLAlchemy, Alembic,
    the store) is never imported for it, so the command starts in a fraction of the time."""
    code = (
        "import sys\n"
        "from gradwatch_server.cli import main\n"
        "code = main(['sync', '--spool', sys.argv[1]])\n"
        "print(code, sorted(m for m in sys.modules if m.split('.')[0] in ('sqlalchemy', 'alembic')"
        " or m.startswith('gradwatch_server.store')))\n"
    )
    out = subprocess.run(
        [server_command()[0], "-c", code, str(tmp_path / "missing")],
        capture_output=True,
        text=True,
        timeout=120,
        env=server_env(),
    )
    assert out.stdout.split(maxsplit=1) == ["2", "[]\n"], out.stdout + out.stderr

"""The `gradwatch` command as users run it: help, exit codes, runs, export and import."""
from __future__ import annotations

import csv
import io
import json
import subprocess
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import ServerProcess, server_command, server_env, start_server
from gradwatch_server.settings import Settings
from wiremsg import Hook, close, f32, hello, step, with_absent


def gradwatch(*args: str, cwd: Path | None = None, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*server_command(), *args], capture_output=True, text=True, timeout=120, cwd=cwd,
                          env=server_env(), input=stdin)


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database with one finished run, written through a real server."""
    server = start_server(tmp_path_factory.mktemp("cli"))
    try:
        with Hook(server.ws_url) as hook:
            hook.call(hello("cli-run", params=("w", "b"), name="cli run"))
            for i in range(1, 6):
                hook.call(step(i, i, scalars={"loss": "Infinity" if i == 2 else 1.0 / i},
                               arrays={"grad_norm": with_absent(f32(i, -0.0), 1) if i == 1 else f32(i, np.nan)},
                               grad_status=[2, 3]))
            hook.call(close(6))
    finally:
        server.stop()
    return server.db_path


@pytest.mark.parametrize("command", [[], ["serve"], ["runs"], ["export"], ["import"], ["sync"]])
def test_every_command_has_help(command: list[str]) -> None:
    result = gradwatch(*command, "--help")
    assert result.returncode == 0 and result.stdout.startswith("usage: gradwatch")


def test_usage_errors_exit_2() -> None:
    assert gradwatch().returncode == 2
    result = gradwatch("export", "r", "--format", "xml")
    assert result.returncode == 2 and "invalid choice: 'xml'" in result.stderr
    result = gradwatch("serve", "--port", "70000")
    assert result.returncode == 2 and "port" in result.stderr


def test_runs_lists_the_database(db: Path) -> None:
    result = gradwatch("runs", "--db", str(db))
    assert result.returncode == 0
    header, row = result.stdout.splitlines()
    assert header.split() == ["ID", "NAME", "PROJECT", "STATUS", "STEPS", "CREATED"]
    assert row.split()[:6] == ["cli-run", "cli", "run", "tests", "finished", "5"]


def test_export_csv_to_stdout_and_by_name(db: Path) -> None:
    by_id = gradwatch("export", "cli-run", "--db", f"sqlite:///{db}")
    by_name = gradwatch("export", "cli run", "--db", str(db))
    assert by_id.returncode == 0 and by_id.stdout == by_name.stdout
    rows = list(csv.DictReader(io.StringIO(by_id.stdout)))
    assert len(rows) == 10 and rows[1]["grad_norm"] == "" and rows[3]["grad_norm"] == "nan"


def test_export_parquet_to_a_file(db: Path, tmp_path: Path) -> None:
    out = tmp_path / "run.parquet"
    result = gradwatch("export", "cli-run", "--format", "parquet", "-o", str(out), "--db", str(db))
    assert result.returncode == 0 and f"wrote run cli-run to {out}" in result.stderr
    assert pq.read_table(out).num_rows == 10


def test_export_of_an_unknown_run_fails_with_a_hint(db: Path) -> None:
    result = gradwatch("export", "nope", "--db", str(db))
    assert result.returncode == 1 and "gradwatch runs" in result.stderr and not result.stdout


def test_missing_database_folder_fails_clearly(tmp_path: Path) -> None:
    result = gradwatch("runs", "--db", str(tmp_path / "no" / "such.db"))
    assert result.returncode == 1 and "does not exist" in result.stderr


def test_json_export_imports_back_identically(db: Path, tmp_path: Path, db_url: str) -> None:
    """From SQLite into another SQLite file, or into PostgreSQL: runs move between servers."""
    exported = gradwatch("export", "cli-run", "--format", "json", "--db", str(db)).stdout
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


def test_an_unreachable_postgres_fails_clearly_without_showing_the_password() -> None:
    result = gradwatch("serve", "--db", "postgresql://me:s3cret@127.0.0.1:1/gradwatch")
    assert result.returncode == 1 and "cannot open database" in result.stderr
    assert "s3cret" not in result.stdout + result.stderr and "me:***@" in result.stderr


def test_import_refuses_what_is_not_an_export(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"type": "step"}\n')
    result = gradwatch("import", str(bad), "--db", str(tmp_path / "x.db"))
    assert result.returncode == 1 and "line 1" in result.stderr
    result = gradwatch("import", str(tmp_path / "missing.jsonl"), "--db", str(tmp_path / "x.db"))
    assert result.returncode == 1 and "cannot read" in result.stderr


def test_settings_come_from_an_injected_environment() -> None:
    settings = Settings.from_env({"GRADWATCH_DB": "runs.db", "GRADWATCH_PORT": "9000", "GRADWATCH_TOKEN": ""},
                                 host="0.0.0.0")
    assert settings.db_url == "sqlite:///runs.db" and settings.port == 9000
    assert settings.token is None and settings.host == "0.0.0.0"
    assert Settings.from_env({}, db_url="sqlite:///x.db").db_url == "sqlite:///x.db"


def test_serve_on_a_port_in_use_exits_1(server: ServerProcess, tmp_path: Path) -> None:
    port = server.url.rsplit(":", 1)[1]
    result = gradwatch("serve", "--db", str(tmp_path / "second.db"), "--port", port)
    assert result.returncode == 1 and "pass --port" in result.stderr

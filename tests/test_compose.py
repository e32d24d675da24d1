"""docker-compose.yml is valid (checked by Debian's docker-compose; no Docker engine needed)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def compose(*args: str, env: dict[str, str] | None = None) -> str:
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.fail("docker-compose is missing: `make test` installs it (scripts/install-system-deps.sh)")
    out = subprocess.run([exe, *args], cwd=ROOT, capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin", **(env or {})})
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_server_runs_on_sqlite_in_a_volume_bound_to_loopback() -> None:
    config = yaml.safe_load(compose("config"))
    server = config["services"]["gradwatch"]
    assert "sqlite:////data/gradwatch.db" in server["command"]
    assert any(str(v).startswith("gradwatch-data:/data") for v in server["volumes"])
    assert all(str(p).startswith("127.0.0.1:") for p in server["ports"])
    assert "gradwatch-data" in config["volumes"]


def test_postgres_sits_behind_a_profile_with_a_healthcheck() -> None:
    config = yaml.safe_load(compose("config"))
    postgres = config["services"]["postgres"]
    assert postgres["profiles"] == ["postgres"]
    assert "pg_isready" in " ".join(postgres["healthcheck"]["test"])
    assert "postgres" in compose("config", "--profiles").split()


def test_database_url_can_point_the_server_at_postgres() -> None:
    url = "postgresql://gradwatch:gradwatch@postgres:5432/gradwatch"
    config = yaml.safe_load(compose("config", env={"GRADWATCH_DB": url}))
    assert url in config["services"]["gradwatch"]["command"]


def test_workers_can_be_set_for_postgres_and_default_to_one_process() -> None:
    url = "postgresql://gradwatch:gradwatch@postgres:5432/gradwatch"
    config = yaml.safe_load(compose("config", env={"GRADWATCH_DB": url, "GRADWATCH_WORKERS": "4"}))
    assert config["services"]["gradwatch"]["environment"]["GRADWATCH_WORKERS"] == "4"
    config = yaml.safe_load(compose("config"))
    assert not config["services"]["gradwatch"]["environment"]["GRADWATCH_WORKERS"]  # empty: one process


def test_the_image_has_the_postgres_driver() -> None:
    """The postgres profile points the server at PostgreSQL: the image needs psycopg (the extra)."""
    assert '"./backend[postgres]"' in (ROOT / "Dockerfile").read_text()

"""docker-compose.yml is valid (checked by Debian's docker-compose; no Docker engine needed)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]


def compose(*args: str, env: dict[str, str] | None = None) -> str:
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.fail("docker-compose is missing: `make test` installs it (scripts/install-system-deps.sh)")
    out = subprocess.run(
        [exe, *args], cwd=ROOT, capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin", **(env or {})}
    )
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


# -- the image's build context -------------------------------------------------------------------


def dockerignore_excludes(patterns: list[str], path: str) -> bool:
    """Whether Docker leaves `path` (relative, with /) out of the build context: the last pattern
    matching it or one of its parent folders decides; `!` re-includes; `**` spans folders."""

    def regex(pattern: str) -> re.Pattern[str]:
        out, i = "", 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                out, i = out + "(?:.*/)?", i + 3
            elif pattern.startswith("**", i):
                out, i = out + ".*", i + 2
            else:
                out += {"*": "[^/]*", "?": "[^/]"}.get(pattern[i], re.escape(pattern[i]))
                i += 1
        return re.compile(out)

    parts = path.split("/")
    candidates = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    excluded = False
    for line in patterns:
        negate = line.startswith("!")
        compiled = regex(line.removeprefix("!").strip("/"))
        if any(compiled.fullmatch(c) for c in candidates):
            excluded = not negate
    return excluded


def dockerignore() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def copy_sources() -> list[str]:
    """The build-context sources of every COPY of the Dockerfile (not those copied from a stage)."""
    sources = []
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not any(w.startswith("--from=") for w in words):
            sources += [w for w in words[1:-1] if not w.startswith("--")]
    return sources


def tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    return out.stdout.splitlines()


def test_the_dockerignore_matcher_follows_dockers_rules() -> None:
    patterns = ["tests", "**/__pycache__", "frontend/vendor", "*.md", "!README.md"]
    assert dockerignore_excludes(patterns, "tests/test_x.py")
    assert dockerignore_excludes(patterns, "backend/gradwatch_server/__pycache__/a.pyc")
    assert dockerignore_excludes(patterns, "frontend/vendor/plotly.min.js")
    assert dockerignore_excludes(patterns, "NOTES.md") and not dockerignore_excludes(patterns, "README.md")
    assert not dockerignore_excludes(patterns, "frontend/index.html")
    assert not dockerignore_excludes(patterns, "backend/README.md")  # *.md: the top folder only


def test_every_file_the_image_copies_is_in_the_build_context() -> None:
    """A clean clone has each COPY's source (its tracked files), and .dockerignore keeps them."""
    sources, patterns, files = copy_sources(), dockerignore(), tracked_files()
    assert {
        "backend",
        "frontend",
        "vendor/package.json",
        "vendor/package-lock.json",
        "scripts/install-vendor-js.sh",
    } <= set(sources)
    for source in sources:
        mine = [f for f in files if f == source or f.startswith(source.rstrip("/") + "/")]
        assert mine, f"the Dockerfile copies {source}, which the repository does not have"
        left_out = [f for f in mine if dockerignore_excludes(patterns, f)]
        assert not left_out, f".dockerignore leaves out what the Dockerfile copies: {left_out[:5]}"


def test_the_image_serves_the_basic_plotly_bundle_built_from_the_lock() -> None:
    """A build stage runs `make setup`'s script on the pinned lock file; the final stage copies its
    bundle into frontend/vendor before installing the server (the wheel carries frontend/); a
    bundle built on this machine never enters the context."""
    text = (ROOT / "Dockerfile").read_text()
    stage = re.search(r"^FROM node:\S+ AS (\w+)$", text, re.M)
    assert stage, "no node build stage"
    builder, final = text[stage.start() :].split("\nFROM ", 1)
    assert "COPY vendor/package.json vendor/package-lock.json ./vendor/" in builder
    assert "RUN ./scripts/install-vendor-js.sh" in builder
    assert "npm ci" in (ROOT / "scripts" / "install-vendor-js.sh").read_text()  # the lock, exactly
    copy = f"COPY --from={stage.group(1)} /src/frontend/vendor/plotly.min.js ./frontend/vendor/plotly.min.js"
    assert copy in final and final.index(copy) < final.index("pip install")
    assert dockerignore_excludes(dockerignore(), "frontend/vendor/plotly.min.js")
    assert dockerignore_excludes(dockerignore(), "vendor/node_modules/plotly.js-basic-dist-min/package.json")

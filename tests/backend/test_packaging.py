"""The wheel users install carries the dashboard and the migrations, and needs no torch."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from support.server import REPO

pytestmark = pytest.mark.unit


@pytest.mark.slow
def test_wheel_serves_the_packaged_dashboard(tmp_path: Path) -> None:
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(REPO / "backend"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr
    wheel = next(tmp_path.glob("gradwatch_server-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    frontend = REPO / "frontend"
    frontend_files = [p.relative_to(frontend).as_posix() for p in frontend.rglob("*") if p.is_file()]
    assert frontend_files, "the repository's frontend/ is empty"
    # Plotly's basic bundle, installed by `make setup` (scripts/install-vendor-js.sh).
    plotly = frontend / "vendor" / "plotly.min.js"
    assert plotly.is_file(), "frontend/vendor/plotly.min.js is missing: run make setup"
    assert "plotly.js" in plotly.read_text()[:200] and plotly.stat().st_size < 2_500_000
    for rel in frontend_files:
        assert f"gradwatch_server/frontend/{rel}" in names
    assert "gradwatch_server/migrations/versions/0001_initial.py" in names
    assert "gradwatch_server/migrations/env.py" in names
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("METADATA"))).decode()
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    assert requires and not any("torch" in line for line in requires)

    site = tmp_path / "site"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stderr
    probe = subprocess.run(
        [sys.executable, "-c", "from gradwatch_server.views import find_frontend; print(find_frontend())"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(site)},
    )
    assert probe.returncode == 0, probe.stderr
    assert Path(probe.stdout.strip()) == site / "gradwatch_server" / "frontend"

"""The dashboard's pure JavaScript (trace and layout building, filters, sorting, names), unit
tested with Node's built-in runner: every `*.test.mjs` here runs under `node --test`.

The modules are the ones the browser loads (frontend/js, ES modules: frontend/js/package.json
says so to Node); importing them runs nothing, since each page starts from its `init()`.
Node comes from Debian's `nodejs` (scripts/install-system-deps.sh, run by `make test`).
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
MIN_NODE = 18  # with `node --test` and --test-reporter (18.15 on)


def node() -> str:
    path = shutil.which("node") or shutil.which("nodejs")
    if not path:
        pytest.skip("no Node.js: `make test` installs it (apt-get install nodejs)")
    version = subprocess.run([path, "--version"], capture_output=True, text=True, check=True).stdout
    major = int(re.match(r"v(\d+)", version).group(1))  # type: ignore[union-attr]
    if major < MIN_NODE:
        pytest.skip(f"Node.js {version.strip()} has no test runner: {MIN_NODE} or later is needed")
    return path


@pytest.mark.parametrize("suite", sorted(p.name for p in HERE.glob("*.test.mjs")))
def test_javascript_unit_tests_pass(suite: str) -> None:
    result = subprocess.run([node(), "--test", "--test-reporter=tap", str(HERE / suite)],
                            capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-4000:]
    passed = re.search(r"^# pass (\d+)$", result.stdout, re.M)
    assert passed and int(passed.group(1)) > 0, result.stdout[-4000:]

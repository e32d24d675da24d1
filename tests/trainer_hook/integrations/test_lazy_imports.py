"""`import gradwatch` (and its integration modules) imports no framework: each integration
imports its framework when its callback is first used. Checked in one fresh interpreter, step by
step (each framework import is slow: one interpreter keeps this test short)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.unit

FRAMEWORKS = ("transformers", "accelerate", "lightning", "pytorch_lightning")

STEPS = {
    "import gradwatch": """
        import gradwatch
        gradwatch.watch  # the hook itself, torch included
        import gradwatch.integrations
        import gradwatch.integrations.lightning
        import gradwatch.integrations.pytorch_lightning""",
    "the pytorch_lightning callback": "from gradwatch.integrations.pytorch_lightning import GradwatchCallback",
    "the transformers callback": "from gradwatch.integrations.transformers import GradwatchCallback",
    "the lightning callback": "from gradwatch.integrations.lightning import GradwatchCallback",
}


def test_frameworks_are_imported_only_by_their_callback() -> None:
    lines = ["import json, sys", "loaded = {}"]
    for name, code in STEPS.items():
        lines += [
            textwrap.dedent(code).strip(),
            f"loaded[{name!r}] = sorted(m for m in {FRAMEWORKS!r} if m in sys.modules)",
        ]
    lines.append("print(json.dumps(loaded))")
    out = subprocess.run([sys.executable, "-c", "\n".join(lines)], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    loaded = {k: set(v) for k, v in json.loads(out.stdout.strip().splitlines()[-1]).items()}
    assert loaded["import gradwatch"] == set()
    assert "pytorch_lightning" in loaded["the pytorch_lightning callback"]
    assert "lightning" not in loaded["the pytorch_lightning callback"]
    assert "transformers" in loaded["the transformers callback"]
    assert "lightning" not in loaded["the transformers callback"]
    assert "lightning" in loaded["the lightning callback"]

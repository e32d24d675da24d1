"""`import gradwatch` (and its integration modules) imports no framework: each integration
imports its framework when its callback is first used. Checked in a fresh interpreter."""
from __future__ import annotations

import subprocess
import sys
import textwrap

FRAMEWORKS = ("transformers", "accelerate", "lightning", "pytorch_lightning")


def loaded_after(code: str) -> set[str]:
    """The FRAMEWORKS in sys.modules after running `code` in a new interpreter."""
    probe = textwrap.dedent(code) + textwrap.dedent(f"""
        import sys
        print(sorted(m for m in {FRAMEWORKS!r} if m in sys.modules))
    """)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return set(eval(out.stdout.strip().splitlines()[-1]))


def test_import_gradwatch_imports_no_framework() -> None:
    assert loaded_after("""
        import gradwatch
        gradwatch.watch  # the hook itself, torch included
        import gradwatch.integrations
        import gradwatch.integrations.lightning
        import gradwatch.integrations.pytorch_lightning
    """) == set()


def test_each_callback_imports_its_own_framework() -> None:
    """Each callback brings in its framework (and whatever that framework imports itself), never
    the other Lightning package."""
    lightning = loaded_after("from gradwatch.integrations.lightning import GradwatchCallback")
    assert "lightning" in lightning and "pytorch_lightning" not in lightning
    older = loaded_after("from gradwatch.integrations.pytorch_lightning import GradwatchCallback")
    assert "pytorch_lightning" in older and "lightning" not in older
    hf = loaded_after("from gradwatch.integrations.transformers import GradwatchCallback")
    assert "transformers" in hf and not {"lightning", "pytorch_lightning"} & hf

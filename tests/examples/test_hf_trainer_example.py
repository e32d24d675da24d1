"""examples/hf_trainer.py against a real server: a tiny GPT-2 trained by the Hugging Face Trainer
with accumulation over 2 micro-batches, every optimizer step stored, no error or warning finding."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.examples import findings, run_example
from support.server import start_server

pytestmark = pytest.mark.server

pytest.importorskip("transformers", reason="needs transformers (pip install gradwatch[transformers])")


def test_the_hf_trainer_example_runs_clean(tmp_path: Path) -> None:
    server = start_server(tmp_path)
    try:
        run_id, run = run_example(
            "hf_trainer.py", server, tmp_path, "--steps", "6", "--output-dir", str(tmp_path / "out")
        )
        assert run["steps"] == 6 and run["name"] == "hf-tiny-gpt2"
        found = findings(server, run_id)
        assert [(f["code"], f["severity"]) for f in found if f["severity"] != "info"] == []
        assert "grad_accumulation" in {f["code"] for f in found}
    finally:
        server.stop()

"""examples/lightning_trainer.py against a real server: the Lightning Trainer with accumulation
over 2 batches and clipping, every optimizer step stored, the module's self.log scalars with them,
no error or warning finding."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.examples import findings, run_example, series
from support.server import start_server

pytestmark = pytest.mark.server

pytest.importorskip("lightning", reason="needs Lightning (pip install gradwatch[lightning])")


def test_the_lightning_example_runs_clean(tmp_path: Path) -> None:
    server = start_server(tmp_path)
    try:
        run_id, run = run_example("lightning_trainer.py", server, tmp_path, "--steps", "6")
        assert run["steps"] == 6 and run["name"] == "lightning-regressor"
        found = findings(server, run_id)
        assert [(f["code"], f["severity"]) for f in found if f["severity"] != "info"] == []
        assert "grad_accumulation" in {f["code"] for f in found}
        assert len(series(server, run_id, "train_loss")) == 6
    finally:
        server.stop()

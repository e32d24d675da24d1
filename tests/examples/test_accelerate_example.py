"""examples/accelerate_accumulation.py against a real server: one stored step per optimizer step of 4
micro-batches, the accumulation reported as intended (info), no error or warning finding."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.examples import findings, run_example, series
from support.server import start_server

pytestmark = pytest.mark.server

pytest.importorskip("accelerate", reason="accelerate is installed by requirements-test.txt")


def test_the_accelerate_example_runs_clean(tmp_path: Path) -> None:
    server = start_server(tmp_path)
    try:
        run_id, run = run_example(
            "accelerate_accumulation.py", server, tmp_path, "--cpu", "--batches", "48", "--accumulate", "4"
        )
        assert run["steps"] == 12 and run["optimizer"] == "AdamW"
        assert run["config"]["wrappers"] == [["accelerate.optimizer.AcceleratedOptimizer"]]
        found = findings(server, run_id)
        assert [(f["code"], f["severity"]) for f in found] == [("grad_accumulation", "info")], found
        assert found[0]["figure"]["value"] == 4.0
        assert series(server, run_id, "backward_passes") == [4.0] * 12
    finally:
        server.stop()

"""examples/lbfgs.py against a real server: every step stored with this step's gradients, the
closure's evaluations counted, and no error or warning finding on a correct LBFGS loop."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.examples import findings, run_example, series
from support.server import start_server

pytestmark = pytest.mark.server


def test_the_lbfgs_example_runs_clean(tmp_path: Path) -> None:
    server = start_server(tmp_path)
    try:
        run_id, run = run_example("lbfgs.py", server, tmp_path, "--steps", "12")
        assert run["steps"] == 12 and run["optimizer"] == "LBFGS"
        assert [(f["code"], f["severity"]) for f in findings(server, run_id) if f["severity"] != "info"] == []
        calls = series(server, run_id, "closure_calls")
        assert len(calls) == 12 and all(c >= 1 for c in calls) and max(calls) > 1
        assert series(server, run_id, "backward_passes") == [1.0] * 12
        assert all(v > 0 for v in series(server, run_id, "grad_norm_total"))  # every step had gradients
        loss = series(server, run_id, "loss")
        assert loss[-1] < 0.5 * loss[0], loss
    finally:
        server.stop()

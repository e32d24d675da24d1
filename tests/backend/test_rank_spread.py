"""A job's spread across its ranks as the store reads it (store/spread.py): the quantiles stored
per step over the whole window, and the ranks' values over the window's last steps only, for the
outliers (at most `outlier_values` of them), on a job written through the store
(support/bigjob.py: rank 7 the straggler, the last rank gone for the last 2 steps).
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from gradwatch_server.jobs.rank_spread import spread
from gradwatch_server.store import open_store
from gradwatch_server.store.spread import read_spread
from support.bigjob import STRAGGLER, fill_job, rank_scalars

pytestmark = pytest.mark.unit

JOB, RANKS, STEPS, LOST = "spreadjob", 16, 10, 2


def test_the_quantiles_cover_the_window_and_the_outliers_its_last_steps(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'spread.db'}")
    try:
        fill_job(store, JOB, RANKS, [("fc.weight", [2, 2])], STEPS, rank_rows=1, lost=LOST)
        key = "time/before_backward_s"
        with store.engine.connect() as conn:
            rows = read_spread(conn, JOB, key, 6, outlier_values=3 * RANKS)  # 3 steps of 16 ranks
    finally:
        store.close()
    assert rows.steps.tolist() == list(range(STEPS - 5, STEPS + 1))
    for i, step in enumerate(rows.steps.tolist()):
        present = RANKS - (1 if step > STEPS - LOST else 0)
        sent = sorted(rank_scalars(r, step)[key] for r in range(present))
        cuts = statistics.quantiles(sent, n=20, method="inclusive")
        assert rows.quantiles[:, i].tolist() == pytest.approx([sent[0], cuts[0], cuts[9], cuts[18], sent[-1]])
    # the outliers' values: the last 3 steps, every rank that sent one there (the lost rank's step 8)
    assert sorted(set(rows.step.tolist())) == [STEPS - 2, STEPS - 1, STEPS]
    found = spread(rows.steps, rows.quantiles, rows.rank, rows.value)
    assert found.ranks == RANKS
    (outlier,) = found.outliers
    assert (outlier.rank, outlier.high) == (STRAGGLER, True)
    assert outlier.median == pytest.approx(rank_scalars(STRAGGLER, STEPS)[key])

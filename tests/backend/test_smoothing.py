"""smoothing.ema against TensorBoard's EMA written out step by step, across chunk boundaries."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gradwatch_server.smoothing import ema, ema_columns
from support.ema import reference_ema

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("weight", [0.0, 0.01, 0.3, 0.6, 0.9, 0.99, 0.999])
def test_ema_matches_the_step_by_step_reference_ema(weight: float) -> None:
    rng = np.random.default_rng(1)
    values = np.exp(rng.normal(size=9000)) * np.where(rng.random(9000) < 0.1, -1, 1)
    values[[3, 4000, 8999]] = [math.nan, math.inf, -math.inf]
    got = ema(values, weight)
    want = np.array(reference_ema(values.tolist(), weight))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(got[~finite], values[~finite])  # shown as they are


def test_missing_values_stay_out_and_columns_are_independent() -> None:
    columns = np.array([[1.0, 10.0], [2.0, 20.0], [3.0, 30.0], [4.0, 40.0]])
    missing = np.array([[False, True], [False, False], [True, False], [False, False]])
    got = ema_columns(columns, 0.5, missing)
    for j in range(2):
        np.testing.assert_allclose(got[:, j], reference_ema(columns[:, j].tolist(), 0.5, missing[:, j].tolist()))
    assert ema(np.array([]), 0.5).shape == (0,)


@pytest.mark.parametrize("weight", [-0.1, 1.0, math.nan])
def test_a_weight_outside_0_1_is_refused(weight: float) -> None:
    with pytest.raises(ValueError, match="smoothing weight must be in"):
        ema(np.ones(3), weight)

"""Downsampling against naive per-bucket loops: spikes and non-finite values survive."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gradwatch_server.downsample import bucket_starts, extreme, highest_code, peak, summarize

pytestmark = pytest.mark.unit


def naive_ranges(n: int, buckets: int) -> list[range]:
    edges = [j * n // buckets for j in range(buckets)] + [n]
    return [range(edges[j], edges[j + 1]) for j in range(buckets)]


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


@pytest.mark.parametrize(("n", "buckets"), [(10, 3), (7, 7), (5, 10), (1000, 7), (1, 1)])
def test_bucket_starts(n: int, buckets: int) -> None:
    starts = bucket_starts(n, buckets)
    expected = [r.start for r in naive_ranges(n, buckets)] if n > buckets else list(range(n))
    assert starts.tolist() == expected
    assert len(starts) == min(n, buckets)


def test_bucket_starts_rejects_zero_buckets() -> None:
    with pytest.raises(ValueError):
        bucket_starts(5, 0)


def test_summarize_matches_a_naive_loop_with_non_finite_values() -> None:
    rng = np.random.default_rng(0)
    values = rng.normal(size=1000)
    values[[17, 500]] = [1e6, np.nan]
    values[[250, 251]] = [np.inf, -np.inf]
    values[600:700] = np.nan  # a whole bucket of NaN
    s = summarize(values, bucket_starts(1000, 10))
    for j, bucket in enumerate(naive_ranges(1000, 10)):
        chunk = [values[k] for k in bucket]
        finite = [v for v in chunk if math.isfinite(v)]
        ordered = [v for v in chunk if not math.isnan(v)]
        if finite:
            assert s.mean[j] == pytest.approx(sum(finite) / len(finite))
        else:
            assert math.isnan(s.mean[j])
        assert same(s.max[j], math.nan if any(math.isnan(v) for v in chunk) else max(ordered))
        assert same(s.min[j], min(ordered) if ordered else math.nan)
        assert not s.empty[j]
    assert s.max[0] == 1e6 and s.max[2] == np.inf and s.min[2] == -np.inf and math.isnan(s.max[5])


def test_summarize_two_dimensional_with_missing_values() -> None:
    values = np.array([[1.0, 5.0], [2.0, np.nan], [3.0, 7.0], [4.0, 8.0]])
    missing = np.array([[False, True], [False, True], [False, False], [False, False]])
    s = summarize(values, np.array([0, 2]), missing)
    assert s.mean[:, 0].tolist() == [1.5, 3.5] and s.mean[1, 1] == 7.5
    assert s.empty.tolist() == [[False, True], [False, False]]
    assert s.max[1].tolist() == [4.0, 8.0] and s.min[1].tolist() == [3.0, 7.0]


def test_peak_keeps_the_largest_magnitude_and_nan_wins() -> None:
    values = np.array([[1.0, -3.0, 0.5], [2.0, 1.0, np.nan], [-5.0, np.inf, 0.1]])
    out, empty = peak(values, np.array([0, 2]))
    assert out[0].tolist()[:2] == [2.0, -3.0] and math.isnan(out[0, 2])
    assert out[1].tolist() == [-5.0, np.inf, 0.1] and not empty.any()
    missing = np.array([[True, False, False], [True, False, False], [True, False, False]])
    out, empty = peak(values, np.array([0]), missing)
    assert empty.tolist() == [[True, False, False]]


def test_highest_code() -> None:
    codes = np.array([[0, 2], [1, 3], [2, 1]], dtype=np.uint8)
    assert highest_code(codes, np.array([0, 2])).tolist() == [[1, 3], [2, 1]]


@pytest.mark.parametrize("seed", range(40))
def test_extreme_is_reduceat_whatever_the_bucket_sizes(seed: int) -> None:
    """Even buckets, a long first bucket (a long window's raw steps beside its blocks), one
    bucket, and buckets of one: the gather gives what numpy's reduceat gives."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 400))
    starts = [
        np.arange(0, n, max(1, n // 7)),
        np.r_[0, np.arange(n // 2, n)],
        np.array([0]),
        np.unique(np.r_[0, rng.integers(0, n, int(rng.integers(1, n + 1)))]),
    ][seed % 4].astype(np.int64)
    x = rng.standard_normal((n, 3)).astype(np.float32)
    for op in (np.minimum, np.maximum):
        assert np.array_equal(extreme(op, x, starts), op.reduceat(x, starts, axis=0))
    assert np.array_equal(extreme(np.maximum, x > 1, starts), np.maximum.reduceat(x > 1, starts, axis=0))

"""Chart payloads from a real store against naive loops; the heatmap is the same read in chunks."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator

import numpy as np
import pytest

from gradwatch_server import blocks, charts, spread
from gradwatch_server.protocol import Hello, parse_message
from gradwatch_server.store import StepData, Store, open_store
from support.ema import reference_ema
from support.heatcells import assert_same_cells
from support.wiremsg import ABSENT_BITS, hello

pytestmark = pytest.mark.unit

P, N = 5, 203


@pytest.fixture(scope="module")
def data() -> np.ndarray:
    rng = np.random.default_rng(1)
    values = rng.random((N, P)).astype("<f4")
    values[50, 1] = np.nan
    values[120, 3] = np.inf
    values[7, 2] = 1e6  # a spike
    values.view("<u4")[:30, 4] = ABSENT_BITS  # no grad at first
    return values


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, data: np.ndarray) -> Iterator[Store]:
    s = open_store(f"sqlite:///{tmp_path_factory.mktemp('charts') / 'c.db'}")
    message = parse_message(json.dumps(hello("c", params=tuple(f"p{i}.weight" for i in range(P)))))
    assert isinstance(message, Hello)
    s.open_run(message)
    s.write_steps(
        "c",
        [
            StepData(
                i + 1,
                10 * (i + 1),
                0.0,
                {"loss": float(data[i, 0])},
                {"grad_norm": data[i].tobytes(), "grad_status": bytes([i % 4] * P)},
            )
            for i in range(N)
        ],
    )
    yield s
    s.close()


def naive_peak(chunk: list[float | None]) -> float | str | None:
    """The largest magnitude, NaN winning, None (ABSENT) ignored; as the API writes it."""
    present = [v for v in chunk if v is not None]
    if not present:
        return None
    if any(math.isnan(v) for v in present):
        return "NaN"
    best = max(present, key=abs)
    return "Infinity" if best == math.inf else best


@pytest.mark.parametrize("chunk_rows", [1, 7, 10**6])
def test_heatmap_matches_a_naive_loop_whatever_the_chunking(store: Store, data: np.ndarray, chunk_rows: int) -> None:
    params = store.get_params("c")
    grid = charts.heatmap(store, "c", params, "grad_norm", None, None, 9, chunk_rows=chunk_rows)
    edges = [j * N // 9 for j in range(9)] + [N]
    assert grid.step == [10 * (e + 1) for e in edges[:-1]] and grid.downsampled
    absent = data.view("<u4") == ABSENT_BITS
    for i in range(P):
        for j in range(9):
            chunk = [None if absent[k, i] else float(data[k, i]) for k in range(edges[j], edges[j + 1])]
            assert grid.z[i][j] == naive_peak(chunk), (i, j)
    codes = charts.heatmap(store, "c", params, "grad_status", None, None, 9, chunk_rows=chunk_rows)
    assert codes.z[0] == [max(k % 4 for k in range(edges[j], edges[j + 1])) for j in range(9)]


@pytest.mark.parametrize("chunk_rows", [1, 7, 10**6])
@pytest.mark.parametrize("metric", ["grad_norm", "grad_status"])
def test_heatmap_f32_holds_the_json_cells_whatever_the_chunking(store: Store, chunk_rows: int, metric: str) -> None:
    params = store.get_params("c")
    for start, end, steps in ((None, None, 9), (None, None, 400), (35, 1500, 13)):
        grids = [
            charts.heatmap(store, "c", params, metric, start, end, steps, chunk_rows=chunk_rows, encoding=encoding)
            for encoding in ("json", "f32")
        ]
        assert_same_cells(*(g.model_dump(exclude_unset=True) for g in grids))


def test_heatmap_window_without_downsampling(store: Store) -> None:
    grid = charts.heatmap(store, "c", store.get_params("c"), "grad_norm", 15, 40, 400)
    assert grid.step == [20, 30, 40] and not grid.downsampled and len(grid.z[0]) == 3


def test_top_parameters_rank_nan_first_and_skip_absent(store: Store, data: np.ndarray) -> None:
    values = data[50].copy()
    assert charts.top_indices(values, 2, "desc")[0] == 1  # NaN first
    early = data[0]
    ranked = charts.top_indices(early, P, "asc")
    assert 4 not in ranked and len(ranked) == P - 1  # ABSENT never ranks
    finite = [int(i) for i in np.argsort(early[:4])]
    assert ranked == finite


def test_param_series_by_top_in_a_window(store: Store, data: np.ndarray) -> None:
    body = charts.param_series(store, "c", store.get_params("c"), "grad_norm", [], 1, "desc", None, 510, 2000)
    assert [s.index for s in body.series] == [1] and body.series[0].value[-1] == "NaN"
    assert body.step == [10 * (i + 1) for i in range(51)]


def spread_oracle(data: np.ndarray, rows: slice) -> tuple[list[float], int, int]:
    """Each parameter's mean of finite values over `rows`, numpy's quantiles of them, how many
    parameters have a finite mean, and how many have a non-finite value."""
    absent = data.view("<u4") == ABSENT_BITS
    chunk, gone = data[rows].astype(np.float64), absent[rows]
    finite = np.isfinite(chunk) & ~gone
    means = np.array([chunk[finite[:, i], i].mean() for i in range(P) if finite[:, i].any()])
    return (
        [float(np.quantile(means, q)) for q in spread.QUANTILES],
        len(means),
        int((~np.isfinite(chunk) & ~gone).any(axis=0).sum()),
    )


@pytest.mark.parametrize("raw_rows", [10**6, 16])  # raw rows, or the stored step blocks
def test_spread_across_parameters_matches_numpy(store: Store, data: np.ndarray, raw_rows: int) -> None:
    got = spread.spread(store, "c", P, "grad_norm", None, None, 7, raw_rows=raw_rows)
    assert got.downsampled and 1 < len(got.step) <= 7
    starts = [s // 10 - 1 for s in got.step] + [N]
    for j in range(len(got.step)):
        want, present, odd = spread_oracle(data, slice(starts[j], starts[j + 1]))
        assert [got.min[j], got.q25[j], got.median[j], got.q75[j], got.max[j]] == pytest.approx(want, rel=1e-9)
        assert (got.params[j], got.nonfinite[j]) == (present, odd), j


def test_spread_step_by_step_leaves_out_absent_and_nonfinite_values(store: Store, data: np.ndarray) -> None:
    got = spread.spread(store, "c", P, "grad_norm", 10, 1300, 500)
    assert not got.downsampled and got.step == [10 * (k + 1) for k in range(130)]
    for k in (0, 29, 30, 49, 50, 119, 120):
        want, present, odd = spread_oracle(data, slice(k, k + 1))
        assert [got.min[k], got.median[k], got.max[k]] == pytest.approx([want[0], want[2], want[4]], rel=1e-9)
        assert (got.params[k], got.nonfinite[k]) == (present, odd)
    assert (got.params[0], got.params[30], got.nonfinite[50], got.nonfinite[120]) == (4, 5, 1, 1)


def smoothed_buckets(want: np.ndarray, first: list[int]) -> list[float]:
    """Each bucket's mean of the smoothed steps (10, 20, ... 10 N) from its first step to the next's."""
    rows = [s // 10 - 1 for s in first] + [N]
    return [float(np.mean([w for w in want[a:b] if math.isfinite(w)])) for a, b in zip(rows, rows[1:])]


@pytest.mark.parametrize("kind", ["param", "scalar"])
def test_a_smoothed_series_is_served_up_to_its_raw_row_limit_and_refused_above(
    store: Store, data: np.ndarray, kind: str
) -> None:
    column = 1 if kind == "param" else 0  # p1 has a NaN at step 510, before the window: it stays out
    want = np.array(reference_ema(data[:, column].astype(np.float64).tolist(), 0.9))

    def ask(end: int | None, limit: int) -> tuple[list[int], list[float | str | None], bool]:
        if kind == "scalar":
            got = charts.scalar_series(store, "c", "loss", 1010, end, 10, smooth=0.9, smooth_rows=limit)
            return got.step, got.value, got.downsampled
        p = charts.param_series(
            store,
            "c",
            store.get_params("c"),
            "grad_norm",
            ["p1.weight"],
            5,
            "desc",
            1010,
            end,
            10,
            smooth=0.9,
            smooth_rows=limit,
        )
        return p.step, p.series[0].value, p.downsampled

    # at the limit (N stored steps up to the end): the EMA from the first step, windowed, downsampled
    step, value, downsampled = ask(None, N)
    assert downsampled and len(step) == 10 and step[0] == 1010
    np.testing.assert_allclose(value, smoothed_buckets(want, step), rtol=1e-9)
    # one step more than the limit: refused with what to ask instead, nothing read
    with pytest.raises(charts.TooLong, match=r"smooth: .* has 203 stored steps .* more than the 202 .*without smooth"):
        ask(None, N - 1)
    # an earlier end holds fewer steps: served again
    step, value, _ = ask(10 * (N - 1), N - 1)
    np.testing.assert_allclose(value, smoothed_buckets(want[: N - 1], step)[: len(step)], rtol=1e-9)


def test_long_window_is_public_and_its_buckets_hold_the_raw_steps(store: Store, data: np.ndarray) -> None:
    """Every chart reading a long window from the blocks (series, heatmap, spread) shares it."""
    assert charts.long_window(store, "c", "grad_norm", [0], 1, None, None, 4, 10**6, blocks.group) is None  # read raw
    found = charts.long_window(store, "c", "grad_norm", [0], 1, None, None, 4, 16, blocks.group)
    assert found is not None
    s = blocks.summary(blocks.concat(found, 1))
    first = [int(f) for p in found for f in p.first]
    assert 1 < len(first) <= 4 and first[0] == 10
    rows = [f // 10 - 1 for f in first] + [N]
    for j, (a, b) in enumerate(zip(rows, rows[1:])):
        raw = data[a:b, 0].astype(np.float64)
        assert (s.min[j, 0], s.max[j, 0]) == (raw.min(), raw.max())
        assert s.mean[j, 0] == pytest.approx(raw.mean(), rel=1e-12)

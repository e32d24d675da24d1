"""Step blocks (blocks.py) on real databases: a long window read from blocks gives, bucket by
bucket, exactly what the raw steps give (min, max, NaN and Inf; the mean to float64 rounding),
whatever order the steps arrived in; ingest keeps the blocks equal to a recomputation from
scratch; migration 0004 computes them for runs stored before it.

The store tests run on an SQLite file and on a real PostgreSQL database (tests/conftest.py).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from importlib import resources

import numpy as np
import pytest
from alembic import command
from alembic.config import Config

from gradwatch_server import blocks, charts
from gradwatch_server.protocol import RESENT, Hello, parse_message
from gradwatch_server.store import StepData, Store, backfill_blocks, open_store
from support.heatcells import assert_same_cells
from support.jsonfloats import number, same
from support.wiremsg import ABSENT_BITS, hello

pytestmark = pytest.mark.unit

P = 70  # two parts of blocks: 64 parameters and 6
PARAMS = tuple(f"layer{i}.weight" for i in range(P))


# -- pure functions --------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(200))
def test_cover_is_exact_and_uses_only_closed_blocks_inside(seed: int) -> None:
    rng = np.random.default_rng(seed)
    lo = int(rng.integers(0, 5000))
    hi = lo + int(rng.integers(0, 70000))
    last = None if seed % 10 == 0 else int(rng.integers(0, hi + 20000))
    size = int(rng.choice(blocks.SIZES))
    covered: list[int] = []
    for kind, a, b in blocks.cover(lo, hi, last, size):
        if kind == blocks.RAW:
            covered += range(a, b + 1)
        else:
            assert kind <= size and a <= b
            assert last is not None and (b + 1) * kind <= last  # closed: the run went past its end
            covered += range(a * kind, (b + 1) * kind)
    assert covered == list(range(lo, hi + 1))


@pytest.mark.parametrize("span,points", [(40_000, 2000), (10**6, 2000), (10**6 + 7, 333), (5000, 2), (16 * 9, 9)])
def test_bucket_width_respects_the_number_of_points(span: int, points: int) -> None:
    lo = 12345
    plan = blocks.bucket_width(lo, lo + span - 1, points)
    assert plan is not None
    width, size = plan
    assert width % size == 0 and size <= span / points
    assert (lo + span - 1) // width - lo // width + 1 <= points
    assert blocks.bucket_width(lo, lo + 16 * points - 2, points) is None  # too short: read raw


def test_dirty_blocks_are_those_closed_by_or_touched_by_new_steps() -> None:
    assert blocks.dirty([1, 2, 3], None, 3)[16] == []  # nothing closed yet
    assert blocks.dirty([17], 15, 17)[16] == [0]  # step 15's block closes
    found = blocks.dirty([5, 300], 250, 300)  # 5 arrives late; the blocks holding 250 close
    assert found[16] == [0, 15] and found[64] == [0, 3] and found[256] == [0] and found[1024] == []


# -- a run stored out of order ---------------------------------------------------------------


class Run:
    """What was written: per metric, step -> values (float32 or uint8 codes); `loss`, step -> float."""

    def __init__(self) -> None:
        self.values: dict[str, dict[int, np.ndarray]] = {"grad_norm": {}, "grad_status": {}, "exp_avg_norm": {}}
        self.loss: dict[int, float] = {}


SCALAR_SPECIALS = (math.nan, math.inf, -math.inf, -0.0, 1e300, -5e-324)


def _values(rng: np.random.Generator, step: int) -> np.ndarray:
    v = rng.lognormal(-2, 1, P).astype("<f4")
    v[rng.random(P) < 0.01] = np.nan
    v[rng.random(P) < 0.005] = np.inf
    v[rng.random(P) < 0.005] = -np.inf
    v[rng.random(P) < 0.01] = -0.0
    v[rng.random(P) < 0.002] *= 1e6  # spikes
    if step < 700:
        v.view("<u4")[0] = ABSENT_BITS  # no grad at first
    if 2000 <= step < 2100:
        v.view("<u4")[65] = ABSENT_BITS  # a stretch without, in the second part
    return v


@pytest.fixture
def run(db_url: str) -> Iterator[tuple[Store, Run]]:
    """A run of its own, for the tests that change or reopen the database."""
    store, written = _written(db_url)
    yield store, written
    store.close()


@pytest.fixture(scope="module")
def stored(module_db_url: str) -> Iterator[tuple[Store, Run]]:
    """One run for the module's tests that only read it: writing it takes seconds a database."""
    store, written = _written(module_db_url)
    yield store, written
    store.close()


def _written(db_url: str) -> tuple[Store, Run]:
    """Steps written in batches, out of order, with gaps, a metric that starts late, and resends."""
    store = open_store(db_url)
    message = parse_message(json.dumps(hello("b", params=PARAMS)))
    assert isinstance(message, Hello)
    store.open_run(message)
    rng = np.random.default_rng(5)
    written = Run()
    order = (
        list(range(1, 1000))
        + list(range(1500, 2501))
        + list(range(1000, 1500, 3))
        + list(range(2501, 6001))
        + list(range(7000, 9000, 7))
    )
    seq = 0
    for lo in range(0, len(order), 97):
        batch = []
        for step in order[lo : lo + 97]:
            seq += 1
            grad = _values(rng, step)
            arrays = {"grad_norm": grad.tobytes(), "grad_status": rng.integers(0, 4, P, dtype=np.uint8).tobytes()}
            if step >= 1500:
                arrays["exp_avg_norm"] = _values(rng, step).tobytes()
            for metric, raw in arrays.items():
                written.values[metric][step] = np.frombuffer(raw, dtype="u1" if metric == "grad_status" else "<f4")
            loss = float(rng.lognormal(0, 1))
            if rng.random() < 0.02:
                loss = float(rng.choice(SCALAR_SPECIALS))
            written.loss[step] = loss
            batch.append(StepData(seq, step, float(step), {"loss": loss}, arrays))
        store.write_steps("b", batch)
    resent = [StepData(seq + 1, 40, 40.0, {}, {"grad_norm": np.zeros(P, "<f4").tobytes()})]
    assert store.write_steps("b", resent) == [False]  # a step already stored changes nothing
    return store, written


def _naive(values: dict[int, np.ndarray], first: int, last: int, index: int) -> tuple[float, float, float, bool]:
    """(min, max, mean, empty) of the raw values in [first, last] by downsample.summarize's rules."""
    column = np.array([v[index] for s, v in sorted(values.items()) if first <= s <= last])
    if column.dtype == np.float32:
        column = column[column.view("<u4") != ABSENT_BITS]
    x = column.astype(np.float64)
    nan, finite = np.isnan(x), np.isfinite(x)
    ordered = x[~nan]
    mean = float(x[finite].mean()) if finite.any() else math.nan
    low = float(ordered.min()) if ordered.size else math.nan
    high = math.nan if nan.any() or not ordered.size else float(ordered.max())
    return low, high, mean, not x.size


def _bucket_ends(step: list[int], end: int) -> list[tuple[int, int]]:
    return [(a, b - 1) for a, b in zip(step, [*step[1:], end + 1])]


@pytest.mark.parametrize("metric", ["grad_norm", "exp_avg_norm", "grad_status"])
@pytest.mark.parametrize(
    "start,end,points", [(None, None, 50), (None, None, 7), (333, 5555, 40), (1017, 2222, 20), (5000, 9999, 30)]
)
def test_long_windows_from_blocks_match_the_raw_steps(
    stored: tuple[Store, Run], metric: str, start: int | None, end: int | None, points: int
) -> None:
    store, written = stored
    params = store.get_params("b")
    names = [PARAMS[0], PARAMS[5], PARAMS[66], PARAMS[64]]
    body = charts.param_series(store, "b", params, metric, names, 5, "desc", start, end, points, raw_rows=0)
    values = written.values[metric]
    stored = sorted(s for s in values if (start is None or s >= start) and (end is None or s <= end))
    assert body.downsampled and 1 < len(body.step) <= points
    assert body.step[0] == stored[0] and all(s in values for s in body.step)
    for series, index in zip(body.series, (0, 5, 66, 64)):
        for j, (a, b) in enumerate(_bucket_ends(body.step, stored[-1])):
            low, high, mean, empty = _naive(values, a, b, index)
            got = (number(series.min[j]), number(series.max[j]), number(series.value[j]))  # type: ignore[index]
            assert same(got[0], low) and same(got[1], high) and same(got[2], mean, 1e-12), (index, a, b, got)
            assert (series.value[j] is None) == empty, (index, a, b)
    heat = charts.heatmap(store, "b", params, metric, start, end, points, raw_rows=0)
    assert heat.step == body.step and heat.downsampled
    for index in (0, 5, 64, 69):
        for j, (a, b) in enumerate(_bucket_ends(heat.step, stored[-1])):
            column = [v[index] for s, v in values.items() if a <= s <= b]
            if metric == "grad_status":
                assert heat.z[index][j] == max(int(c) for c in column)
                continue
            present = [float(c) for c in column if np.float32(c).view("<u4") != ABSENT_BITS]
            if not present:
                assert heat.z[index][j] is None
            elif any(math.isnan(c) for c in present):
                assert heat.z[index][j] == "NaN"
            else:
                # the largest magnitude; of +x and -x, +x (as downsample.peak)
                assert same(number(heat.z[index][j]), max(present, key=lambda x: (abs(x), x))), (index, a, b)


def test_heatmap_f32_from_blocks_holds_the_json_cells(stored: tuple[Store, Run]) -> None:
    """encoding=f32 over long windows (blocks inside, raw steps at the edges): the JSON form's cells."""
    store, _ = stored
    params = store.get_params("b")
    for metric in ("grad_norm", "exp_avg_norm", "grad_status"):
        for start, end, points in ((None, None, 50), (333, 5555, 40), (1017, 2222, 20)):
            grids = [
                charts.heatmap(store, "b", params, metric, start, end, points, raw_rows=0, encoding=encoding)
                for encoding in ("json", "f32")
            ]
            assert grids[0].downsampled
            assert_same_cells(*(g.model_dump(exclude_unset=True) for g in grids))


@pytest.mark.parametrize("start,end,points", [(None, None, 50), (333, 5555, 40), (1017, 2222, 3)])
def test_long_scalar_windows_from_blocks_match_the_raw_steps(
    stored: tuple[Store, Run], start: int | None, end: int | None, points: int
) -> None:
    store, written = stored
    body = charts.scalar_series(store, "b", "loss", start, end, points, raw_rows=0)
    stored = sorted(s for s in written.loss if (start is None or s >= start) and (end is None or s <= end))
    assert body.downsampled and 1 < len(body.step) <= points and body.step[0] == stored[0]
    as_rows = {s: np.array([v]) for s, v in written.loss.items()}
    for j, (a, b) in enumerate(_bucket_ends(body.step, stored[-1])):
        low, high, mean, empty = _naive(as_rows, a, b, 0)
        got = (number(body.min[j]), number(body.max[j]), number(body.value[j]))  # type: ignore[index]
        assert same(got[0], low) and same(got[1], high) and same(got[2], mean, 1e-12), (a, b, got)
        assert math.copysign(1, got[0]) == math.copysign(1, low) or math.isnan(low)  # -0.0 stays -0.0


def test_a_short_window_is_still_read_raw(stored: tuple[Store, Run]) -> None:
    store, written = stored
    body = charts.param_series(store, "b", store.get_params("b"), "grad_norm", [PARAMS[3]], 5, "desc", 100, 160, 2000)
    assert not body.downsampled and body.step == list(range(100, 161))
    raw = np.array([number(v) for v in body.series[0].value], dtype=np.float32)
    want = np.array([written.values["grad_norm"][s][3] for s in range(100, 161)])
    assert raw.tobytes() == want.tobytes()  # bit for bit, -0.0 included


def _blocks(store: Store) -> list[tuple[object, ...]]:
    with store.engine.connect() as conn:
        return [
            tuple(bytes(c) if isinstance(c, (bytes, memoryview)) else c for c in r)
            for r in conn.exec_driver_sql(
                "SELECT run_id, kind, metric, size, block, part, first_step, step_count, data FROM metric_blocks "
                "ORDER BY run_id, kind, metric, size, block, part"
            ).all()
        ]


def test_ingest_keeps_the_blocks_equal_to_a_recomputation(run: tuple[Store, Run]) -> None:
    store, _ = run
    kept = _blocks(store)
    assert {r[3] for r in kept} == {16, 64, 256, 1024, 4096} and {r[5] for r in kept} == {0, 1}
    assert {(r[1], r[2]) for r in kept} == {
        ("param", "grad_norm"),
        ("param", "grad_status"),
        ("param", "exp_avg_norm"),
        ("scalar", "loss"),
    }
    with store.engine.begin() as conn:
        conn.exec_driver_sql("DELETE FROM metric_blocks")
        backfill_blocks(conn)
    assert _blocks(store) == kept


def test_deleting_a_run_deletes_its_blocks(run: tuple[Store, Run]) -> None:
    store, _ = run
    assert store.delete_run("b")
    assert _blocks(store) == []


def test_the_migration_computes_blocks_for_runs_stored_before_it(run: tuple[Store, Run], db_url: str) -> None:
    store, _ = run
    kept = _blocks(store)
    store.close()
    config = Config()
    config.set_main_option("script_location", str(resources.files("gradwatch_server.migrations")))
    reopened = open_store(db_url)
    with reopened.engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "0003")  # as a database written before blocks existed
    reopened.close()
    upgraded = open_store(db_url)  # upgrades to the newest revision, 0004 computing the blocks
    assert _blocks(upgraded) == kept
    upgraded.close()


def test_the_flight_recorders_resent_norms_go_into_the_stored_steps_and_their_blocks(db_url: str) -> None:
    """Steps stored with their cheap facts only, then `resent` (ingest: the scalar RESENT) with the norms the
    hook's flight recorder kept: the arrays are added to those steps (never replacing a measured
    one, never storing a step that is not there), and the blocks stay equal to a recomputation,
    in closed blocks and in the open one (whose steps the store kept in memory)."""
    store = open_store(db_url)
    try:
        message = parse_message(json.dumps(hello("w", params=PARAMS[:3])))
        assert isinstance(message, Hello)
        store.open_run(message)
        measured = np.array([1.0, 2.0, 3.0], "<f4").tobytes()
        batch = [StepData(1, 1, 1.0, {"loss": 1.0}, {"grad_norm": measured})]
        batch += [StepData(s, s, float(s), {"loss": 1.0}, {}) for s in range(2, 41)]
        store.write_steps("w", batch)
        window = {s: np.array([s, 2 * s, 3 * s], "<f4") for s in (1, 5, 6, 7, 36, 37, 99)}
        resent = [
            StepData(41, s, float(s), {RESENT: 1.0}, {"grad_norm": v.tobytes()}, resent=True) for s, v in window.items()
        ]
        assert store.write_steps("w", resent) == [False] * len(resent)  # no step of its own
        plain = StepData(42, 8, 8.0, {}, {"grad_norm": window[7].tobytes()})  # a step sent again, unmarked
        later = [StepData(43 + i, s, float(s), {"loss": 1.0}, {}) for i, s in enumerate(range(41, 70))]
        store.write_steps("w", [plain, *later])  # closes the block of steps 32-47
        steps, rows = store.metric_rows("w", "grad_norm")
        assert steps.tolist() == [1, 5, 6, 7, 36, 37]  # not 99 (not stored) nor 8 (not marked)
        assert rows[0].tobytes() == measured  # a measured value is never replaced
        assert [rows[k].tolist() for k in range(1, 6)] == [window[s].tolist() for s in (5, 6, 7, 36, 37)]
        run = store.get_run("w")
        assert run is not None and (run.steps, run.last_step, run.last_seq) == (69, 69, 71)
        assert store.series_names("w", "scalar") == ["loss"]
        kept = _blocks(store)
        assert {r[4] for r in kept if r[2] == "grad_norm" and r[3] == 16} == {0, 2}
        with store.engine.begin() as conn:
            conn.exec_driver_sql("DELETE FROM metric_blocks")
            backfill_blocks(conn)
        assert _blocks(store) == kept
    finally:
        store.close()

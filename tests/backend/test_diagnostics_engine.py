"""The diagnostics engine on a real store (SQLite and PostgreSQL): findings are stored with a
mark of how far they go, answered from the store while current, derived again when stale."""

from __future__ import annotations

import itertools
import json
from collections import deque
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from gradwatch_server.diagnostics import RULES_VERSION, Diagnostics, Finding, RunDiagnosis
from gradwatch_server.protocol import Hello, parse_message
from gradwatch_server.store import DiagnosisMark, StepData, Store, StoredFinding, open_store
from support.wiremsg import f32, hello, with_absent

pytestmark = pytest.mark.unit

PARAMS = ("enc.weight", "head.bias")


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    s = open_store(db_url)
    yield s
    s.close()


def open_run(store: Store, run_id: str, **config: Any) -> None:
    message = parse_message(json.dumps(hello(run_id, params=PARAMS, config={"every": 1, **config})))
    assert isinstance(message, Hello)
    store.open_run(message)


def data(n: int, clear: float | None = 1.0) -> StepData:
    """A step of a loop that forgets zero_grad() from step 5 on (clear 0), unless `clear` says."""
    clear_arr = with_absent(f32(0, 0), 0, 1) if n == 1 or clear is None else f32(clear, clear)
    arrays = {
        "grad_norm": f32(1.0, 0.5).tobytes(),
        "grad_status": bytes([2, 2]),
        "backward_passes": f32(1, 1).tobytes(),
        "grad_clear": clear_arr.tobytes(),
    }
    return StepData(seq=n, step=n, time=float(n), scalars={"loss": 1.0 / n}, arrays=arrays)


def write(store: Store, run_id: str, steps: range, clear_from: int = 5) -> list[StepData]:
    batch = [data(n, 0.0 if n >= clear_from else 1.0) for n in steps]
    assert all(store.write_steps(run_id, batch))
    return batch


def codes(found: list[object]) -> list[tuple[str, int | None]]:
    return [(f.code, f.first_step) for f in found]  # type: ignore[attr-defined]


def test_live_findings_are_stored_with_their_mark(store: Store) -> None:
    open_run(store, "live")
    engine = Diagnostics(store)
    assert engine.open_run("live") == []
    found = engine.observe("live", write(store, "live", range(1, 8)))
    assert codes(found) == [("grad_accumulation_unbounded", 5)]
    assert codes(engine.current("live")) == codes(found)
    stored = store.get_findings("live")
    assert [(f.code, f.severity, f.first_step, f.params) for f in stored] == [
        ("grad_accumulation_unbounded", "error", 5, list(PARAMS))
    ]
    assert stored[0].figure == {
        "label": "backward passes summed in .grad",
        "value": 2.0,
        "unit": "passes",
        "text": "2",
        "step": 5,
    }
    assert store.get_diagnosis("live") == DiagnosisMark(steps=7, last_step=7, version=RULES_VERSION)
    engine.close_run("live")
    assert engine.current("live") == []  # state let go; the store answers now
    assert codes(engine.findings("live", steps=7, running=False)) == codes(found)


def test_stored_runs_are_diagnosed_once_then_answered_from_the_store(store: Store) -> None:
    open_run(store, "old")
    write(store, "old", range(1, 11))  # as an import or an older server leaves it: no findings yet
    assert store.get_diagnosis("old") is None
    first = Diagnostics(store).findings("old", steps=10, running=False)
    assert codes(first) == [("grad_accumulation_unbounded", 5)]
    assert store.get_diagnosis("old") == DiagnosisMark(steps=10, last_step=10, version=RULES_VERSION)

    # While the mark is current, a fresh engine (a restarted server) reads the stored findings.
    edited = StoredFinding("grad_accumulation_unbounded", "error", "edited", list(PARAMS), 5, None)
    store.save_findings("old", [edited])
    assert [f.message for f in Diagnostics(store).findings("old", steps=10, running=False)] == ["edited"]
    # Older rules, or steps the mark does not cover: derived again from the steps.
    store.save_findings("old", [], DiagnosisMark(steps=10, last_step=10, version=RULES_VERSION - 1))
    again = Diagnostics(store).findings("old", steps=10, running=False)
    assert [f.message for f in again] == [f.message for f in first] and again[0].message != "edited"
    assert store.get_diagnosis("old") == DiagnosisMark(steps=10, last_step=10, version=RULES_VERSION)


def test_state_is_rebuilt_from_the_store_and_catches_up(store: Store) -> None:
    open_run(store, "resumed")
    write(store, "resumed", range(1, 6), clear_from=99)
    # A new engine (server restart) sees the run again when its hook resumes: state from the store.
    engine = Diagnostics(store)
    assert engine.open_run("resumed") == []
    found = engine.observe("resumed", write(store, "resumed", range(6, 8), clear_from=6))
    # Continuing from the rebuilt state: step 6 used the gradients of steps 5 and 6.
    assert "step 6 used the sum of 2 batches' gradients" in found[0].message
    # Steps written by another process (an import into the same database) are caught up on read.
    write(store, "resumed", range(8, 40), clear_from=0)
    nan = StepData(
        seq=40,
        step=40,
        time=40.0,
        scalars={},
        arrays={"grad_norm": f32(np.nan, 1).tobytes(), "grad_status": bytes([3, 2])},
    )
    store.write_steps("resumed", [nan])
    assert codes(engine.findings("resumed", steps=40, running=True)) == [
        ("grad_accumulation_unbounded", 6),
        ("nonfinite_grad", 40),
    ]
    assert store.get_diagnosis("resumed") == DiagnosisMark(steps=40, last_step=40, version=RULES_VERSION)


def test_deleting_a_run_deletes_its_findings(store: Store) -> None:
    open_run(store, "gone")
    engine = Diagnostics(store)
    engine.observe("gone", write(store, "gone", range(1, 7)))
    assert store.get_findings("gone")
    store.delete_run("gone")
    engine.forget("gone")
    assert store.get_findings("gone") == [] and store.get_diagnosis("gone") is None
    assert engine.current("gone") == []


def test_with_several_workers_only_the_hooks_worker_stores_a_running_runs_findings(store: Store) -> None:
    """`serve --workers N`: another worker's read of a running run may be behind what the hook's
    worker stores meanwhile (deriving a long run takes a while), so it derives without storing; a
    hook that comes back to a worker finds that worker's state caught up; the close stores all."""
    open_run(store, "shared")
    hooked, other = Diagnostics(store, sole_writer=False), Diagnostics(store, sole_writer=False)
    assert hooked.open_run("shared", 0) == []
    hooked.observe("shared", write(store, "shared", range(1, 8)))
    # The hook's worker stores step 8 and, say, a new finding while the other worker derives the
    # run from its steps (the mark is behind them): that view must not replace the stored one.
    batch = write(store, "shared", range(8, 9))
    newer = StoredFinding("nonfinite_grad", "error", "found by the hook's worker", ["head.bias"], 8, None)
    store.save_findings("shared", [newer])
    assert codes(other.findings("shared", steps=8, running=True)) == [("grad_accumulation_unbounded", 5)]
    assert [f.code for f in store.get_findings("shared")] == ["grad_accumulation_unbounded", "nonfinite_grad"]
    hooked.observe("shared", batch)

    # The hook moves to the other worker (a NaN at step 9 there), then comes back to the first.
    other.open_run("shared", 8)
    nan = StepData(
        seq=9,
        step=9,
        time=9.0,
        scalars={},
        arrays={"grad_norm": f32(np.nan, 1).tobytes(), "grad_status": bytes([3, 2])},
    )
    assert store.write_steps("shared", [nan]) == [True]
    other.observe("shared", [nan])
    assert codes(hooked.open_run("shared", 9)) == [("grad_accumulation_unbounded", 5), ("nonfinite_grad", 9)]
    hooked.close_run("shared")
    assert [(f.code, f.first_step) for f in store.get_findings("shared")] == [
        ("grad_accumulation_unbounded", 5),
        ("nonfinite_grad", 9),
    ]
    assert store.get_diagnosis("shared") == DiagnosisMark(steps=9, last_step=9, version=RULES_VERSION)


# -- the flight recorder's late norms ----------------------------------------------------------


def norms(n: int, spike: tuple[float, float] = (1.0, 1.0)) -> bytes:
    """Step n's steady gradient norms (a little noise), each parameter's times its `spike`."""
    noise = 1.0 + 0.02 * ((n * 7) % 5 - 2)
    return f32(0.5 * noise * spike[0], 0.2 * noise * spike[1]).tobytes()


def sampled(seq: Iterator[int], steps: range) -> list[StepData]:
    """Steps of a loop measured every 10 steps; the others carry the loss only (cheap facts)."""
    return [
        StepData(seq=next(seq), step=n, time=float(n), scalars={"loss": 1.0}, arrays={})
        if n % 10
        else StepData(
            seq=next(seq),
            step=n,
            time=float(n),
            scalars={"loss": 1.0},
            arrays={"grad_norm": norms(n), "grad_status": bytes([2, 2])},
        )
        for n in steps
    ]


def resent(seq: Iterator[int], steps: range, spike: tuple[float, float]) -> list[StepData]:
    """The flight recorder's norms of `steps`, sent before without them, the last one's times `spike`."""
    return [
        StepData(
            seq=next(seq),
            step=n,
            time=float(n),
            scalars={"loss": 1.0, "flight/resent": 1.0},
            arrays={"grad_norm": norms(n, spike if n == steps[-1] else (1.0, 1.0))},
            resent=True,
        )
        for n in steps
    ]


def same(a: object, b: object) -> bool:
    """Two checks' states are equal: arrays bit for bit (NaN where NaN), the rest by value."""
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return a.dtype == b.dtype and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple, deque)) and isinstance(b, (list, tuple, deque)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if hasattr(a, "__dict__"):  # a check, its windows, its finding
        return type(a) is type(b) and same(vars(a), vars(b))
    return bool(a == b)


def held(engine: Diagnostics, run_id: str) -> RunDiagnosis:
    return engine._runs[run_id]  # the live state, to compare with a whole re-diagnosis's


def public(found: list[Finding]) -> list[dict[str, Any]]:
    return [f.to_dict() for f in found]


def test_late_norms_are_judged_from_a_snapshot_exactly_as_a_whole_rejudge(store: Store) -> None:
    """A sampled run of 2,382 steps; at steps 326 and 2,374 (neither measured) the flight
    recorder resends the 7 steps up to it with their norms, a 50x spike at it (enc.weight's, then
    head.bias's), with the next batch's steps: each is judged from the state's snapshot before the
    window (the window's first step is one a snapshot was taken after: 320 and 2,368 are multiples
    of SNAPSHOT_EVERY), and the findings and every check's state equal a re-diagnosis of the
    stored run from its start (`rejudge`, on a fresh engine)."""
    open_run(store, "long", flight_recorder=True)
    engine, seq = Diagnostics(store), itertools.count(1)
    assert engine.open_run("long", 0) == []
    done = 0

    def stream(through: int) -> None:
        nonlocal done
        for lo in range(done + 1, through + 1, 64):
            batch = sampled(seq, range(lo, min(lo + 64, through + 1)))
            assert all(store.write_steps("long", batch))
            engine.observe("long", batch)
        done = through

    assert 320 % RunDiagnosis.SNAPSHOT_EVERY == 2_368 % RunDiagnosis.SNAPSHOT_EVERY == 0
    for at, spike, params in ((326, (50.0, 1.0), ["enc.weight"]), (2_374, (1.0, 50.0), list(PARAMS))):
        stream(at)
        before = engine.current("long")
        assert [f.params for f in before if f.code == "grad_norm_spike"] == ([] if at < 1_000 else [("enc.weight",)])
        late, new = resent(seq, range(at - 6, at + 1), spike), sampled(seq, range(at + 1, at + 9))
        assert store.write_steps("long", late + new) == [False] * len(late) + [True] * len(new)
        found = engine.judge_late("long", at - 6)
        done = at + 8
        assert found is not None
        assert [(f.code, f.first_step, list(f.params)) for f in found] == [("grad_norm_spike", 326, params)]
        oracle = Diagnostics(store)
        assert public(found) == public(oracle.rejudge("long"))
        mine, whole = held(engine, "long"), held(oracle, "long")
        assert (mine.steps, mine.last_step) == (whole.steps, whole.last_step) == (done, done)
        assert same(mine.checks, whole.checks)
    assert [(f.code, f.first_step) for f in store.get_findings("long")] == [("grad_norm_spike", 326)]
    assert store.get_findings("long")[0].params == list(PARAMS)


def test_late_norms_beyond_the_snapshots_are_left_to_a_whole_rejudge(store: Store) -> None:
    """Late values older than every kept snapshot (or a run whose hook said its flight recorder
    is off, which keeps none) are not judged (None, the state untouched) but by `rejudge`; a run
    judged whole keeps snapshots from then on."""
    seq = itertools.count(1)
    assert RunDiagnosis.SNAPSHOT_EVERY * RunDiagnosis.SNAPSHOTS < 399 - 201  # the snapshots' reach
    for run_id, config, first in (("old", {"flight_recorder": True}, 201), ("off", {"flight_recorder": False}, 391)):
        open_run(store, run_id, **config)
        engine = Diagnostics(store)
        engine.open_run(run_id, 0)
        batch = sampled(seq, range(1, 400))  # 20 measured steps before 200: the spike scores from then
        store.write_steps(run_id, batch)
        engine.observe(run_id, batch)
        late = resent(seq, range(first, first + 6), (50.0, 1.0))
        store.write_steps(run_id, late)
        assert engine.judge_late(run_id, first) is None
        assert engine.current(run_id) == []
        found = engine.rejudge(run_id)
        assert [(f.code, f.first_step) for f in found] == [("grad_norm_spike", first + 5)]
        assert public(found) == public(Diagnostics(store).rejudge(run_id))
        later = resent(seq, range(batch[-1].step - 3, batch[-1].step + 1), (1.0, 50.0))
        store.write_steps(run_id, later)
        found = engine.judge_late(run_id, later[0].step)
        assert found is not None and found[0].params == PARAMS

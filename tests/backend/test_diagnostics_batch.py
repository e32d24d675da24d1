"""Judging a batch of steps at once (`RunDiagnosis.observe_records`, `Check.observe_batch`) finds
exactly what judging them one by one finds: the same codes, steps, messages and figures after
every batch. The oracle is the step-by-step path (`observe_record` on each step), fed the same
randomized runs, whose regimes make every kind of finding (gradients gone to zero, exploding,
NaN, forgotten clears, accumulation, zero-filled buffers, steps without gradients, spikes of the
norms, the updates and the loss, AMP skips), split into batches of random sizes, some with
unmeasured steps or steps sent again. The corpus' live findings are held to the same oracle in
tests/diagnostics/test_corpus.py."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from gradwatch_server.diagnostics import CODES, RunContext, RunDiagnosis
from gradwatch_server.protocol import GRAD_STATUS
from support.wiremsg import ABSENT_BITS

pytestmark = pytest.mark.unit

Record = tuple[int, dict[str, float], dict[str, bytes]]
P = 6


def f32(values: np.ndarray, absent: np.ndarray | None = None) -> bytes:
    out = np.asarray(values, dtype="<f4").copy()
    if absent is not None:
        out.view("<u4")[absent] = ABSENT_BITS
    return out.tobytes()


def random_run(rng: np.random.Generator, steps: int, unmeasured: float = 0.05) -> tuple[list[Record], range]:
    """A run of P parameters whose regimes change at random steps: calm lognormal norms, a
    gradient gone to zero, a jump up, NaN, spikes; clears and passes drawn per regime too. And
    the steps where every gradient is zero."""
    base = rng.lognormal(0, 1, P)
    regime = np.zeros(P, dtype=np.int64)
    clearing = int(rng.integers(0, 4))  # 0 set to None, 1 not cleared, 2 zero-filled, 3 accumulation
    with_updates, with_eps, with_loss = rng.random(3) < 0.6
    records: list[Record] = []
    skipped = 0.0
    # every gradient gone to zero for a stretch (a network that died: what the checks' batch
    # paths take at once), then back
    dead = range(int(rng.integers(20, steps)), int(rng.integers(20, steps)) + int(rng.integers(30, 150)))
    for step in range(1, steps + 1):
        if rng.random() < 0.04:  # a parameter changes regime
            regime[rng.integers(P)] = rng.integers(0, 6)
        if rng.random() < 0.04:
            clearing = int(rng.integers(0, 4))
        norm = base * rng.lognormal(0, 0.05 if rng.random() < 0.5 else 0.4, P)
        status = np.full(P, 2, dtype=np.uint8)
        norm[regime == 1] = 0.0  # gone to zero
        norm[regime == 2] *= 50.0  # exploding
        norm[regime == 3] *= rng.choice([1.0, 1e4], size=int((regime == 3).sum()), p=[0.9, 0.1])  # spikes
        nonfinite = (regime == 4) & (rng.random(P) < 0.3)
        norm[nonfinite] = np.nan
        if step in dead:
            norm[:] = 0.0
        status[norm == 0] = 1
        status[nonfinite] = 3
        none = (regime == 5) | ((rng.random(P) < 0.03) & (step % 7 == 0))  # or a branch unused at a step
        status[none] = 0
        norm[none] = np.nan
        if rng.random() < 0.01:  # a step with no gradient at all
            status[:] = 0
            norm[:] = np.nan
        passes = np.where(status == 0, 0.0, 1.0)
        clear = np.full(P, 0.0 if clearing == 1 else 2.0 if clearing == 2 else 1.0)
        if clearing == 3:
            passes = np.where(status == 0, 0.0, float(rng.integers(1, 5)))
        if step in dead and rng.random() < 0.05:  # zero_grad() between backward() and step()
            passes[:] = 0.0
        clear_absent = np.full(P, step == 1) | (rng.random(P) < 0.05)
        arrays = {
            "grad_norm": f32(norm),
            GRAD_STATUS: status.tobytes(),
            "backward_passes": f32(passes),
            "grad_clear": f32(clear, clear_absent),
        }
        if with_updates:
            ratio = 1e-3 * rng.lognormal(0, 0.2, P)
            ratio[rng.random(P) < 0.02] *= 1e4
            arrays["update_ratio"] = f32(ratio)
        if with_eps:
            arrays["eps_share"] = f32(np.where(regime == 1, 0.9, rng.random(P) * 0.3))
        if rng.random() < 0.01:  # the flight recorder's score of a spike between measured steps
            arrays["spike_z"] = f32(rng.normal(0, 5, P))
            arrays["spike_ratio"] = f32(rng.lognormal(0, 1, P))
        scalars: dict[str, float] = {"grad_norm_total": float(np.nansum(norm)) if rng.random() < 0.7 else 0.0}
        if with_loss:
            scalars["loss"] = float(rng.lognormal(0, 0.1) * (20.0 if rng.random() < 0.02 else 1.0))
        if rng.random() < 0.02:
            skipped += 1
            scalars["amp/skipped_steps"] = skipped
            scalars["amp/scale"] = 2.0**10
        if clearing == 2:
            scalars["mem/zero_grad_bytes"] = 4096.0
        if rng.random() < unmeasured:  # a step the hook did not measure: scalars only
            arrays = {}
        records.append((step, scalars, arrays))
    if rng.random() < 0.3:  # a step sent again, and one out of order
        records.insert(len(records) // 2, records[len(records) // 3])
    return records, dead


def public(diag: RunDiagnosis) -> list[dict[str, Any]]:
    return [f.to_dict() for f in diag.findings()]


#: what a check carries from step to step (beyond its finding), compared too: a state that
#: differs after a batch may make a finding differ later
STATE = ("streak", "began", "ratio", "held", "prev_step", "k_min", "k_max", "seen", "never")
WINDOWS = ("history", "params", "total", "grads", "updates", "window", "loss")


def same_state(a: RunDiagnosis, b: RunDiagnosis) -> bool:
    def same(x: Any, y: Any) -> bool:
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            return bool(np.array_equal(x, y, equal_nan=True))
        return bool(x == y)

    for x, y in zip(a.checks, b.checks, strict=True):
        for name in STATE:
            if not same(getattr(x, name, None), getattr(y, name, None)):
                return False
        for name in WINDOWS:
            wx, wy = getattr(x, name, None), getattr(y, name, None)
            if (wx is None) != (wy is None):
                return False
            if wx is not None and not all(same(getattr(wx, f), getattr(wy, f)) for f in ("values", "pos", "count")):
                return False
        rx, ry = getattr(x, "recent", ()), getattr(y, "recent", ())
        if len(rx) != len(ry) or not all(p[0] == q[0] and p[2] == q[2] and same(p[1], q[1]) for p, q in zip(rx, ry)):
            return False
    return True


def test_batches_find_exactly_what_steps_one_by_one_find() -> None:
    found: set[str] = set()
    for seed in range(12):
        rng = np.random.default_rng(seed)
        records, dead = random_run(rng, 260)
        context = RunContext.of([(f"layer{i}.weight", 1000 * (i + 1), "float32") for i in range(P)])
        oracle, batched = RunDiagnosis(context), RunDiagnosis(context)
        i = 0
        while i < len(records):
            n = int(rng.choice([1, 2, 3, 17, 40, 90]))
            for edge in (dead.start, dead.stop):  # often a batch begins where the gradients die or come back
                if i < edge < i + n and rng.random() < 0.7:
                    n = edge - i
            judge_alike(oracle, batched, records[i : i + n], (seed, i + n))
            i += n
        found.update(f["code"] for f in public(oracle))
    # no proof if they find nothing: every code a single run's steps can show is found (a
    # distributed job's, and those of the hello's config, cannot be)
    assert found == set(CODES) - {"rank_desync", "param_not_in_optimizer", "param_never_gets_grad"}


def judge_alike(oracle: RunDiagnosis, batched: RunDiagnosis, chunk: list[Any], where: Any) -> None:
    """`oracle` judges `chunk` step by step, `batched` at once: the same findings, steps and state."""
    for record in chunk:
        oracle.observe_record(*record)
    batched.observe_records(chunk)
    assert public(batched) == public(oracle), where
    assert (batched.steps, batched.last_step) == (oracle.steps, oracle.last_step)
    assert same_state(batched, oracle), where


def test_batches_of_unmeasured_steps_find_what_steps_one_by_one_find() -> None:
    """Mostly unmeasured steps (every="auto"): stretches of them are judged at once
    (`observe_unmeasured_batch`), to the same findings, state and snapshots (whose steps a late
    window rewinds to) as step by step."""
    found: set[str] = set()
    for seed in range(12):
        rng = np.random.default_rng(100 + seed)
        records, _ = random_run(rng, 400, unmeasured=0.9)
        context = RunContext.of([(f"layer{i}.weight", 1000 * (i + 1), "float32") for i in range(P)])
        oracle, batched = RunDiagnosis(context), RunDiagnosis(context)
        i = 0
        while i < len(records):
            n = int(rng.choice([1, 2, 5, 40, 90, 150]))
            judge_alike(oracle, batched, records[i : i + n], (seed, i + n))
            i += n
            snaps = [[(s.steps, s.last_step) for s in d._snapshots or ()] for d in (batched, oracle)]
            assert snaps[0] == snaps[1], (seed, i)
        found.update(f["code"] for f in public(oracle))
    assert "loss_spike" in found


def test_what_grad_holds_after_a_batch_counts_into_the_next_steps_pile() -> None:
    """A forgotten zero_grad() right after a batch: the pile's count starts from what `.grad`
    held at the batch's last step (nothing where that step left a parameter without one)."""
    records: list[Record] = []
    for step in range(1, 8):
        status = np.array([0 if step == 5 else 2, 2], dtype=np.uint8)
        clear = np.array([0.0 if step >= 6 else 1.0] * 2)
        arrays = {
            "grad_norm": f32(np.where(status == 0, np.nan, 1.0)),
            GRAD_STATUS: status.tobytes(),
            "backward_passes": f32(np.array([2.0 if step == 5 else 3.0, 1.0])),  # a's pass left no .grad at 5
            "grad_clear": f32(clear, np.full(2, step == 1)),
        }
        records.append((step, {}, arrays))
    context = RunContext.of([("a", 10, "float32"), ("b", 10, "float32")])
    oracle, batched = RunDiagnosis(context), RunDiagnosis(context)
    for record in records:
        oracle.observe_record(*record)
    for lo, hi in ((0, 1), (1, 5), (5, 7)):
        batched.observe_records(records[lo:hi])
    assert public(batched) == public(oracle)
    assert "grad_accumulation_unbounded" in {f["code"] for f in public(oracle)}


def test_a_step_the_flight_recorder_scored_counts_as_a_move_in_a_batch() -> None:
    """Before the windows are warm they score nothing (NaN); a step the hook's flight recorder
    scored carries its own scores, which stand in: `loss_spike` keeps that step's moved
    parameters whether the step comes alone or in a batch, and names them at the spike."""
    records: list[Record] = []
    for step in range(1, 40):
        arrays = {
            "grad_norm": f32(np.full(P, 1.0)),
            GRAD_STATUS: np.full(P, 2, dtype=np.uint8).tobytes(),
            "backward_passes": f32(np.ones(P)),
            "grad_clear": f32(np.ones(P), np.full(P, step == 1)),
        }
        # every step carries the hook's scores, so that they decode as one batch; one step spiked
        arrays["spike_z"] = f32(np.array([9.0 if step == 5 else 0.0] + [0.0] * (P - 1)))
        arrays["spike_ratio"] = f32(np.array([8.0 if step == 5 else 1.0] + [1.0] * (P - 1)))
        records.append((step, {"loss": 30.0 if step == 7 else 1.0}, arrays))
    context = RunContext.of([(f"layer{i}.weight", 1000, "float32") for i in range(P)])
    oracle, batched = RunDiagnosis(context), RunDiagnosis(context)
    for record in records:
        oracle.observe_record(*record)
    batched.observe_records(records[:3])
    batched.observe_records(records[3:])
    assert public(batched) == public(oracle)
    assert same_state(batched, oracle)
    moved = [c for c in oracle.checks if c.code == "loss_spike"][0].recent
    assert [(at, series) for at, _, series in moved] == [(5, "gradient")]


def test_a_healthy_run_is_judged_a_batch_at_a_time() -> None:
    """Steady norms that enter the windows at every step (a healthy run at `every=1`): the
    checks that keep windows judge each batch at once, never a step at a time (per step their
    numpy calls cost more than their work), and find nothing."""
    rng = np.random.default_rng(3)
    records: list[Record] = []
    for step in range(1, 301):
        arrays = {
            "grad_norm": f32(np.exp(0.2 * rng.standard_normal(P))),
            GRAD_STATUS: np.full(P, 2, dtype=np.uint8).tobytes(),
            "backward_passes": f32(np.ones(P)),
            "grad_clear": f32(np.ones(P), np.full(P, step == 1)),
        }
        records.append((step, {"loss": float(np.exp(0.05 * rng.standard_normal())), "grad_norm_total": 1.0}, arrays))
    context = RunContext.of([(f"layer{i}.weight", 1000, "float32") for i in range(P)])
    batched = RunDiagnosis(context)
    one_by_one: dict[str, int] = {}
    for check in batched.checks:
        if check.code in ("exploding_grad", "vanishing_grad", "grad_norm_spike", "loss_spike"):

            def counted(run: Any, step: Any, check: Any = check, alone: Any = check.observe) -> None:
                one_by_one[check.code] = one_by_one.get(check.code, 0) + 1
                alone(run, step)

            check.observe = counted  # type: ignore[method-assign]
    for lo in range(0, len(records), 20):
        batched.observe_records(records[lo : lo + 20])
    assert batched.steps == 300 and public(batched) == []
    assert one_by_one == {}


def test_updates_as_large_as_their_parameter_are_found_in_a_batch_as_the_warmup_ends() -> None:
    """`large_update` flags an update ratio of 1 or more once its window holds WARMUP values,
    steady or not (this one is never a spike of its own history): a batch that crosses the
    warm-up finds it at the step one by one finds it."""
    records: list[Record] = []
    for step in range(1, 41):
        ratio = np.full(P, 1e-3)
        ratio[2] = 1.5
        arrays = {
            "grad_norm": f32(np.ones(P)),
            GRAD_STATUS: np.full(P, 2, dtype=np.uint8).tobytes(),
            "backward_passes": f32(np.ones(P)),
            "grad_clear": f32(np.ones(P), np.full(P, step == 1)),
            "update_ratio": f32(ratio),
        }
        records.append((step, {}, arrays))
    context = RunContext.of([(f"layer{i}.weight", 1000, "float32") for i in range(P)])
    oracle, batched = RunDiagnosis(context), RunDiagnosis(context)
    judge_alike(oracle, batched, records, "one batch")
    found = {f["code"]: f for f in public(oracle)}
    assert found["large_update"]["first_step"] == 21 and found["large_update"]["params"] == ["layer2.weight"]

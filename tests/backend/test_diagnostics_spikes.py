"""The instability checks (diagnostics/spikes.py) on hand-built steps: the robust score against a
plain numpy oracle, each check quiet on noise and trends, and firing at the step of the spike
with its evidence."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pytest

from gradwatch_server.diagnostics import RunContext, RunDiagnosis, StepView
from gradwatch_server.diagnostics.check import Check
from gradwatch_server.diagnostics.spikes import (
    MAD_SIGMA,
    AdamEpsilonRegime,
    GradNormSpike,
    LargeUpdate,
    LossSpike,
    SpikeWindow,
)

pytestmark = pytest.mark.unit

NAMES = ("emb.weight", "ln.bias", "head.weight")
RUN = RunContext.of([(NAMES[0], 64, "float32"), (NAMES[1], 8, "float32"), (NAMES[2], 64, "float32")])
NONZERO = 2


def f32(values: Sequence[float]) -> bytes:
    return np.asarray(values, dtype="<f4").tobytes()


def measured(
    n: int,
    norms: Sequence[float],
    *,
    loss: float | None = None,
    update: Sequence[float] | None = None,
    eps: Sequence[float] | None = None,
    scalars: dict[str, float] | None = None,
) -> StepView:
    arrays: dict[str, bytes] = {"grad_norm": f32(norms), "grad_status": bytes([NONZERO] * len(norms))}
    if update is not None:
        arrays["update_ratio"] = f32(update)
    if eps is not None:
        arrays["eps_share"] = f32(eps)
    values = dict(scalars or {})
    if loss is not None:
        values["loss"] = loss
    values.setdefault("grad_norm_total", float(np.sqrt(np.sum(np.square(np.asarray(norms, dtype=np.float32))))))
    return StepView.of(n, values, arrays, len(norms))


def noisy(steps: int, seed: int = 0, sigma: float = 0.15, base: Sequence[float] = (1.0, 0.01, 2.0)) -> np.ndarray:
    """Per step and parameter, lognormal noise around `base` (like a healthy run's norms)."""
    rng = np.random.default_rng(seed)
    return np.asarray(base) * np.exp(sigma * rng.standard_normal((steps, len(base))))


def feed(check: Check, steps: Sequence[StepView]) -> list[int | None]:
    check.start(RUN)
    seen = []
    for s in steps:
        check.observe(RUN, s)
        seen.append(None if check.finding is None else check.finding.first_step)
    return seen


def test_the_score_is_the_robust_z_of_the_log_against_the_window() -> None:
    rng = np.random.default_rng(1)
    history = np.exp(rng.standard_normal((200, 3)))
    window = SpikeWindow(3, 128)
    for row in history:
        window.push(row)
    new = np.array([5.0, 0.2, 1.0])
    z, ratio = window.score(new, warmup=20)
    logs = np.log(history[-128:])  # the oracle: numpy's median and MAD over the last 128 logs
    median = np.median(logs, axis=0)
    scale = MAD_SIGMA * np.median(np.abs(logs - median), axis=0)
    np.testing.assert_allclose(z, (np.log(new) - median) / scale, rtol=1e-12)
    np.testing.assert_allclose(ratio, new / np.exp(median), rtol=1e-12)


def test_the_score_waits_for_its_warmup_and_skips_what_has_no_log() -> None:
    window = SpikeWindow(2, 128)
    for v in (1.0, 2.0, 3.0, 4.0, 5.0):
        window.push(np.array([v, 0.0]))  # a zero is not kept
    z, _ = window.score(np.array([9.0, 9.0]), warmup=5)
    assert np.isfinite(z[0]) and np.isnan(z[1])
    flat = SpikeWindow(1, 128)  # no spread at all: any rise is infinitely far (RATIO decides)
    for _ in range(5):
        flat.push(np.array([1.0]))
    assert flat.score(np.array([1.1]), warmup=5)[0][0] == math.inf
    z, _ = window.score(np.array([-1.0, math.nan]), warmup=1)
    assert np.isnan(z).all()
    partial = SpikeWindow(1, 128)  # fewer values than the window: the median of those there
    for v in (1.0, 2.0, 4.0):
        partial.push(np.array([v]))
    _, ratio = partial.score(np.array([8.0]), warmup=3)
    assert ratio[0] == pytest.approx(4.0)


def test_grad_norm_spike_fires_at_the_step_of_one_spike_and_names_the_parameter() -> None:
    norms = noisy(160)
    norms[150, 2] *= 12  # one step, one parameter
    check = GradNormSpike()
    seen = feed(check, [measured(n + 1, row) for n, row in enumerate(norms)])
    assert seen[149] is None and seen[150] == 151
    f = check.finding
    assert f is not None and f.severity == "warning" and f.params == ("head.weight",) and f.first_step == 151
    assert f.figure is not None and f.figure.step == 151 and f.figure.value > 6
    assert f.figure.evidence is not None and f.figure.evidence["params"][0]["param"] == "head.weight"
    assert "step 151" in f.message and "head.weight" in f.message


def test_grad_norm_spike_is_quiet_on_noise_trends_and_small_moves_of_steady_series() -> None:
    for seed in range(5):  # healthy noise, with its odd 3-sigma step
        assert feed(GradNormSpike(), [measured(n + 1, r) for n, r in enumerate(noisy(300, seed))])[-1] is None
    grow = np.exp(np.linspace(0, 3, 300))[:, None] * noisy(300, 7, sigma=0.05)  # 20x over the run
    assert feed(GradNormSpike(), [measured(n + 1, r) for n, r in enumerate(grow)])[-1] is None
    steady = noisy(100, 8, sigma=0.001)
    steady[80] *= 1.5  # 100 sigma, but only 1.5x: a steady gain's move, not a spike
    assert feed(GradNormSpike(), [measured(n + 1, r) for n, r in enumerate(steady)])[-1] is None


def test_grad_norm_spike_reads_the_total_norm_the_loop_clipped_with() -> None:
    norms = noisy(100)
    steps = [measured(n + 1, r, scalars={"clip/total_norm": 3.0}) for n, r in enumerate(norms)]
    steps[90] = measured(91, norms[90], scalars={"clip/total_norm": 30.0})  # the parameters' own look normal
    check = GradNormSpike()
    feed(check, steps)
    f = check.finding
    assert f is not None and f.first_step == 91 and f.params == ()
    assert f.figure is not None and f.figure.evidence is not None and f.figure.evidence["total"]["ratio"] == 10.0
    assert "total gradient norm to 10×" in f.message


def test_grad_norm_spike_leaves_nonfinite_norms_to_nonfinite_grad() -> None:
    norms = noisy(60)
    norms[50, 0] = math.inf
    norms[51, 1] = math.nan
    assert (
        feed(GradNormSpike(), [measured(n + 1, r, scalars={"grad_norm_total": 1.0}) for n, r in enumerate(norms)])[-1]
        is None
    )


def test_loss_spike_names_the_parameters_that_moved_first_and_how_long_before() -> None:
    norms = noisy(130)
    norms[118:, 1] *= 20  # ln.bias moves first, 4 steps before the loss
    norms[120:, 0] *= 10
    losses = 2.0 * np.exp(0.03 * np.random.default_rng(3).standard_normal(130))
    losses[122:] *= 4
    check = LossSpike()
    seen = feed(check, [measured(n + 1, r, loss=float(v)) for n, (r, v) in enumerate(zip(norms, losses))])
    assert seen[121] is None and seen[122] == 123
    f = check.finding
    assert f is not None and f.params == ("ln.bias", "emb.weight") and f.first_step == 123
    assert "ln.bias (gradient" in f.message and "at step 119, 4 steps before" in f.message
    assert f.figure is not None and f.figure.evidence is not None
    assert [(m["param"], m["lead"]) for m in f.figure.evidence["moved_first"]] == [("ln.bias", 4), ("emb.weight", 2)]


def test_loss_spike_counts_unmeasured_steps_and_skips_losses_that_are_not_positive() -> None:
    check = LossSpike()
    check.start(RUN)
    rng = np.random.default_rng(4)
    for n in range(1, 80):
        loss = float(1.0 + 0.02 * rng.standard_normal()) * (5 if n == 70 else 1)
        check.observe_unmeasured(RUN, StepView.unmeasured(n, {"loss": loss}, 3))
    assert check.finding is not None and check.finding.first_step == 70
    assert "No parameter's gradient moved before it" in check.finding.message
    negative = LossSpike()
    for n in range(1, 80):
        negative.observe_unmeasured(RUN, StepView.unmeasured(n, {"loss": -1.0 - (9 if n == 70 else 0)}, 3))
    assert negative.finding is None


def test_large_update_fires_on_an_update_spike_or_a_whole_parameter_moved() -> None:
    ratios = noisy(60, 5, base=(1e-3, 1e-3, 1e-3))
    ratios[40, 2] *= 30
    check = LargeUpdate()
    seen = feed(check, [measured(n + 1, [1.0] * 3, update=r) for n, r in enumerate(ratios)])
    assert seen[39] is None and seen[40] == 41 and check.finding is not None
    assert check.finding.params == ("head.weight",) and "head.weight" in check.finding.message
    quiet = noisy(60, 6, base=(1e-3, 1e-3, 1e-3))
    quiet[:, 1] = math.nan  # a parameter at zero has no ratio
    assert feed(LargeUpdate(), [measured(n + 1, [1.0] * 3, update=r) for n, r in enumerate(quiet)])[-1] is None
    big = noisy(60, 7, sigma=0.5, base=(0.3, 1e-3, 1e-3))  # noisy, but moved by its whole size at step 50
    big[49, 0] = 1.2
    check = LargeUpdate()
    assert feed(check, [measured(n + 1, [1.0] * 3, update=r) for n, r in enumerate(big)])[-1] == 50
    assert LargeUpdate().finding is None and feed(LargeUpdate(), [measured(1, [1.0] * 3)]) == [None]


def test_adam_epsilon_regime_needs_half_a_layer_for_two_measured_steps() -> None:
    shares = [[0.0, 0.0, 0.0]] * 10 + [[0.0, 0.9, 0.4]] + [[0.0, 0.2, 0.4]] + [[0.0, 1.0, 0.4]] * 2
    check = AdamEpsilonRegime()
    seen = feed(check, [measured(n + 1, [1.0] * 3, eps=s) for n, s in enumerate(shares)])
    assert seen == [None] * 13 + [14]  # first_step: the step it was raised at
    f = check.finding
    assert f is not None and f.params == ("ln.bias",) and "From step 13" in f.message and "100%" in f.message
    assert f.figure is not None and f.figure.evidence is not None and f.figure.evidence["since"] == 13
    first = AdamEpsilonRegime()  # a layer at zero only at step 1 (behind a zero-initialised one)
    assert feed(first, [measured(n, [1.0] * 3, eps=[1.0 if n == 1 else 0.0] * 3) for n in range(1, 9)]) == [None] * 8
    sampled = AdamEpsilonRegime()  # every="auto": measured steps far apart still count in a row
    steps = [measured(n, [1.0] * 3, eps=[0.0, 0.0, 1.0]) for n in (1, 2, 14, 300, 700)]
    assert feed(sampled, steps) == [None, None, 14, 14, 14]  # raised at step 14, in it since step 2
    assert sampled.finding is not None and "From step 2," in sampled.finding.message


def test_the_engine_feeds_unmeasured_steps_to_the_loss_check_only() -> None:
    diag = RunDiagnosis(RUN)
    rng = np.random.default_rng(9)
    for n in range(1, 80):
        arrays: dict[str, bytes] = {}
        if n % 10 == 1:  # every=10: the other steps carry their cheap facts (and the loss)
            arrays = {"grad_norm": f32([1.0, 1.0, 1.0]), "grad_status": bytes([NONZERO] * 3)}
        loss = float(1.0 + 0.02 * rng.standard_normal()) * (6 if n == 65 else 1)
        diag.observe_record(n, {"loss": loss}, arrays)
    codes = {f.code: f.first_step for f in diag.findings()}
    assert codes == {"loss_spike": 65}  # and no step_without_grad from the unmeasured steps


def test_loss_spike_fires_at_ten_times_the_median_after_a_fast_fall() -> None:
    """A window over the first steps' fast fall is wide: a loss 25x its median scores under 6
    sigma there, and is still a spike."""
    losses = [15.0 * 0.93**n for n in range(59)] + [20.0]
    check = LossSpike()
    check.start(RUN)
    for n, loss in enumerate(losses, 1):
        check.observe_unmeasured(RUN, StepView.unmeasured(n, {"loss": loss}, 3))
    f = check.finding
    assert f is not None and f.first_step == 60
    assert f.figure is not None and f.figure.evidence is not None and f.figure.evidence["z"] < 6
    assert f.figure.evidence["ratio"] >= 10


def test_a_score_with_a_least_ratio_skips_only_rows_below_it() -> None:
    """With `least`, a row is either scored as without it, or left at 0 and 0 where its ratio
    (scored without `least`) is below `least`."""
    rng = np.random.default_rng(7)
    window = SpikeWindow(40, 128)
    sigma = np.where(np.arange(40) < 20, 0.02, 0.4)  # half of the rows steady: tight bounds
    for n in range(150):
        row = np.exp(sigma * rng.standard_normal(40))
        row[rng.random(40) < 0.05] = math.nan  # missing values are not kept
        window.push(row)
        new = np.where(np.arange(40) < 20, rng.uniform(1.5, 4.0, 40), np.exp(rng.standard_normal(40)))
        new[0] = math.nan
        for least in (2.0, 3.0):
            z, ratio = window.score(new, warmup=20)
            zl, ratiol = window.score(new, warmup=20, least=least)
            skipped = (zl == 0) & (ratiol == 0)
            np.testing.assert_array_equal(zl[~skipped], z[~skipped])
            np.testing.assert_array_equal(ratiol[~skipped], ratio[~skipped])
            assert (ratio[skipped] < least).all()
            if n > 40 and n % 3 == 0:
                assert skipped.any() and not skipped.all()


def test_grad_norm_spike_and_loss_spike_share_one_score_a_step_and_find_what_each_alone_finds() -> None:
    """The two checks keep the same window of gradient norms: scored once a step (`StepView.memo`),
    they find, after every step, what each finds fed a step of its own (no sharing)."""
    from gradwatch_server.diagnostics.spikes import GRAD_LEAST

    assert GRAD_LEAST <= min(GradNormSpike.RATIO, LossSpike.MOVED_RATIO)  # what each compares with
    norms = noisy(200, seed=3, sigma=0.3)
    norms[120:123, 0] *= 20  # the gradient leads the loss
    norms[150, 2] *= 15
    losses = np.exp(0.05 * np.random.default_rng(4).standard_normal(200))
    losses[124] *= 30
    shared = [GradNormSpike(), LossSpike()]
    alone = [GradNormSpike(), LossSpike()]
    for check in (*shared, *alone):
        check.start(RUN)
    for n, (row, loss) in enumerate(zip(norms, losses)):
        step = measured(n + 1, row, loss=float(loss))
        for check in shared:
            check.observe(RUN, step)
        assert len(step.memo) == 1  # one score, read by both
        for check in alone:
            check.observe(RUN, measured(n + 1, row, loss=float(loss)))
        assert [c.finding for c in shared] == [c.finding for c in alone]
        assert len(shared[1].recent) == len(alone[1].recent)  # the parameters that moved, and when
        for a, b in zip(shared[1].recent, alone[1].recent):
            assert a[0] == b[0] and a[2] == b[2] and np.array_equal(a[1], b[1], equal_nan=True)
    assert all(c.finding is not None for c in shared)


def test_a_run_of_losses_scored_at_once_is_scored_and_kept_as_one_by_one() -> None:
    """`SpikeWindow.score_run` against `score` then `push` value by value (the oracle): the same
    scores, bit for bit, and the same window after, through the warmup, a window that wraps,
    runs longer than the window, and losses that are zero or negative (scored NaN, not kept)."""
    rng = np.random.default_rng(11)
    for trial in range(20):
        one, run = SpikeWindow(1, LossSpike.WINDOW), SpikeWindow(1, LossSpike.WINDOW)
        for size in rng.choice([1, 2, 7, 19, 49, 50, 51, 130], size=8):
            values = np.exp(0.1 * rng.standard_normal(size)) * (1 + 30 * (rng.random(size) < 0.05))
            values[rng.random(size) < 0.1] = 0.0
            values[rng.random(size) < 0.05] = -2.0
            expected = []
            for v in values:
                z, ratio = one.score(np.array([v]), LossSpike.WARMUP)
                one.push(np.array([v]))
                expected.append((z[0], ratio[0]))
            z, ratio = run.score_run(values, LossSpike.WARMUP)
            assert np.array_equal(np.array(expected), np.stack([z, ratio], axis=1), equal_nan=True), trial
            assert np.array_equal(run.values, one.values, equal_nan=True), trial
            assert (run.pos.tolist(), run.count.tolist(), run.last) == (one.pos.tolist(), one.count.tolist(), one.last)
        assert one.count[0] > LossSpike.WINDOW  # the window wrapped


def test_a_batch_of_steps_scored_at_once_is_scored_and_kept_as_one_by_one() -> None:
    """`SpikeWindow.score_many` (steps x series) against `score` then `push` row by row (the
    oracle): the same scores, bit for bit, and the same window after, for series that keep
    different counts of values (non-positive and non-finite ones are not kept), through the
    warmup and windows that wrap, with `least` ruling values out (by its bound, and where only
    the window's own least value can tell) and without it."""
    rng = np.random.default_rng(12)
    ruled_out = scored = 0
    for trial in range(60):
        series, width = int(rng.integers(1, 7)), int(rng.choice([5, 16, 128]))
        least = (None, 2.0, 4.0)[trial % 3]
        one, many = SpikeWindow(series, width), SpikeWindow(series, width)
        for size in rng.choice([1, 2, 9, 60, 200], size=3):
            # mostly steady series, some noisy enough (or drifting) that the bound cannot rule them out
            spread = rng.choice([0.05, 1.0], size=series)
            values = np.exp(
                spread * rng.standard_normal((size, series)) + rng.choice([0.0, 0.02]) * np.arange(size)[:, None]
            )
            values[rng.random(values.shape) < 0.08] = rng.choice([0.0, -1.0, np.nan, np.inf])
            expected_z, expected_ratio = [], []
            for row in values:
                z, ratio = one.score(row, 20, least)
                one.push(row)
                expected_z.append(z)
                expected_ratio.append(ratio)
            z, ratio = many.score_many(values, 20, least)
            assert np.array_equal(np.array(expected_z), z, equal_nan=True), trial
            assert np.array_equal(np.array(expected_ratio), ratio, equal_nan=True), trial
            assert np.array_equal(many.values, one.values, equal_nan=True), trial
            assert (many.pos.tolist(), many.count.tolist(), many.last) == (
                one.pos.tolist(),
                one.count.tolist(),
                one.last,
            )
            ruled_out += int((ratio == 0).sum())
            scored += int((ratio > 0).sum())
    assert ruled_out > 0 and scored > 0  # both ways through were taken


def test_loss_spike_judges_a_batch_of_unmeasured_steps_as_one_by_one() -> None:
    """`LossSpike.observe_unmeasured_batch` (the losses scored at once) finds the spike at the
    step `observe_unmeasured` finds it, with the same words, after steps without a loss or with
    one that is not finite."""
    rng = np.random.default_rng(5)
    steps: list[tuple[int, dict[str, float]]] = []
    for n in range(1, 200):
        loss = float(np.exp(0.03 * rng.standard_normal())) * (6 if n in (150, 170) else 1)
        steps.append((n, {} if n % 13 == 0 else {"loss": math.nan if n % 17 == 0 else loss, "lr/0": 0.1}))
    oracle, batched = LossSpike(), LossSpike()
    oracle.start(RUN)
    batched.start(RUN)
    for n, scalars in steps:
        oracle.observe_unmeasured(RUN, StepView.unmeasured(n, scalars, 3))
    for lo in range(0, len(steps), 64):
        batched.observe_unmeasured_batch(RUN, steps[lo : lo + 64])
    assert oracle.finding is not None and oracle.finding.first_step == 150
    assert batched.finding == oracle.finding
    assert np.array_equal(batched.loss.values, oracle.loss.values, equal_nan=True)

"""Each diagnostic check on hand-built steps: what fires, when, with which words and figure.

Steps are built as the wire carries them (float32 arrays with ABSENT on the bits, uint8
statuses) and decoded by `StepView.of`, so the checks see exactly what ingest gives them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pytest

from gradwatch_server.diagnostics import CHECKS, CODES, RunContext, RunDiagnosis, StepView
from gradwatch_server.diagnostics.amp import AmpSkippedSteps
from gradwatch_server.diagnostics.check import Check
from gradwatch_server.diagnostics.clearing import GradAccumulation, UnclearedGradients, ZeroFilledGradBuffers
from gradwatch_server.diagnostics.coverage import ParamNeverGetsGrad, ParamNotInOptimizer, StepWithoutGrad
from gradwatch_server.diagnostics.finding import fmt_bytes, name_list
from gradwatch_server.diagnostics.ranks import RankDesync
from gradwatch_server.diagnostics.values import ExplodingGrad, NonfiniteGrad, VanishingGrad

pytestmark = pytest.mark.unit

ABSENT_BITS = 0x7FDEAD00
NONE, ZERO, NONZERO, NONFINITE = 0, 1, 2, 3
NAMES = ("enc.weight", "enc.bias", "head.weight")
RUN = RunContext.of(
    [("enc.weight", 32 * 16, "float32"), ("enc.bias", 32, "float32"), ("head.weight", 4 * 32, "bfloat16")]
)


def f32(values: Sequence[float | None]) -> bytes:
    """float32 little-endian bytes; None is ABSENT."""
    arr = np.array([0.0 if v is None else v for v in values], dtype="<f4")
    for i, v in enumerate(values):
        if v is None:
            arr.view("<u4")[i] = ABSENT_BITS
    return arr.tobytes()


def step(
    n: int,
    status: Sequence[int],
    *,
    norm: Sequence[float | None] | None = None,
    passes: Sequence[float | None] | None = None,
    clear: Sequence[int | None] | None = None,
    scalars: dict[str, float] | None = None,
) -> StepView:
    if norm is None:
        norm = [None if s == NONE else 0.0 if s == ZERO else math.inf if s == NONFINITE else 1.0 for s in status]
    arrays: dict[str, bytes] = {"grad_norm": f32(norm), "grad_status": bytes(status)}
    if passes is not None:
        arrays["backward_passes"] = f32(passes)
    if clear is not None:
        arrays["grad_clear"] = f32([None if c is None else float(c) for c in clear])
    return StepView.of(n, scalars or {}, arrays, len(status))


def feed(check: Check, steps: Sequence[StepView], run: RunContext = RUN) -> list[int | None]:
    """Run a check; for each step, the first_step of its finding after that step (None: none yet)."""
    check.start(run)
    seen = []
    for s in steps:
        check.observe(run, s)
        seen.append(None if check.finding is None else check.finding.first_step)
    return seen


def job_step(n: int, desync: Sequence[float | None] | None, ranks: dict[int, float] | None = None) -> StepView:
    """A job's assembled step with the `rank_desync` evidence the assembly stores (assemble.py)."""
    arrays: dict[str, bytes] = {"grad_norm": f32([1.0, 1.0, 1.0]), "grad_status": bytes([NONZERO] * 3)}
    if desync is not None:
        arrays["desync_ranks"] = f32(desync)
    scalars = {f"dist/desync/r{r}": v for r, v in (ranks or {}).items()}
    return StepView.of(n, {"loss": 1.0, "dist/ranks": 3.0, **scalars}, arrays, 3)


def plain(n: int, k: int = 1, clear: int | None = 1) -> StepView:
    """A healthy step: every parameter got `k` backward passes after `.grad` was set to None."""
    return step(n, [NONZERO] * 3, passes=[k] * 3, clear=[None if n == 1 else clear] * 3)


def test_every_code_of_the_design_has_one_check() -> None:
    assert sorted(CODES) == sorted(
        [
            "grad_accumulation_unbounded",
            "grad_accumulation",
            "zero_filled_grad_buffers",
            "param_not_in_optimizer",
            "param_never_gets_grad",
            "nonfinite_grad",
            "amp_skipped_steps",
            "exploding_grad",
            "vanishing_grad",
            "step_without_grad",
            "rank_desync",
            "grad_norm_spike",
            "large_update",
            "adam_epsilon_regime",
            "loss_spike",
        ]
    )
    for check in CHECKS:
        assert check.__doc__ and check.code in check.__doc__, f"{check.__name__} must document its code"


def test_step_view_decodes_absent_on_the_bits() -> None:
    measured_nan = np.array([0x7FC00001], dtype="<u4").view("<f4")[0]
    view = step(
        4, [NONE, NONFINITE, ZERO], norm=[None, float(measured_nan), 0.0], passes=[0, 1, None], clear=[None, 0, 2]
    )
    assert np.isnan(view.grad_norm[0]) and np.isnan(view.grad_norm[1])
    assert list(view.status) == [NONE, NONFINITE, ZERO]
    assert view.passes is not None and view.passes[1] == 1 and np.isnan(view.passes[2])
    assert view.clear is not None and list(view.clear) == [-1, 0, 2]
    # Without grad_status, the status is derived from the norms as the hook does.
    derived = StepView.of(1, {}, {"grad_norm": f32([None, 0.0, 2.0, math.nan])}, 4)
    assert list(derived.status) == [NONE, ZERO, NONZERO, NONFINITE]
    assert derived.passes is None and derived.clear is None


# -- clearing ----------------------------------------------------------------------------------


def test_forgotten_zero_grad_is_an_error_from_step_2() -> None:
    check = UnclearedGradients()
    steps = [step(n, [NONZERO] * 3, passes=[1] * 3, clear=[None if n == 1 else 0] * 3) for n in range(1, 6)]
    assert feed(check, steps) == [None, 2, 2, 2, 2]
    f = check.finding
    assert f is not None and f.severity == "error" and f.params == NAMES
    assert f.message == (
        "Gradients pile up across steps: .grad was never cleared, so step 2 used the sum of "
        "2 batches' gradients. Call optimizer.zero_grad() once per step."
    )
    assert f.figure is not None and f.figure.value == 2 and f.figure.unit == "passes"


def test_clearing_by_any_means_is_not_piling_up() -> None:
    for clear in (1, 2):
        check = UnclearedGradients()
        assert feed(check, [plain(n, clear=clear) for n in range(1, 30)]) == [None] * 29
    # A parameter that got no backward pass since the last step (clear ABSENT) is not piling up,
    # nor is a .grad that is None when the step runs (step before backward).
    check = UnclearedGradients()
    steps = [
        step(1, [NONZERO] * 3, passes=[1] * 3, clear=[None] * 3),
        step(2, [NONZERO, NONZERO, NONZERO], passes=[1, 1, 0], clear=[1, 1, None]),
        step(3, [NONE] * 3, passes=[1] * 3, clear=[0] * 3),
    ]
    assert feed(check, steps) == [None, None, None]


def test_one_parameter_left_uncleared_is_named() -> None:
    check = UnclearedGradients()
    steps = [
        step(1, [NONZERO] * 3, passes=[1] * 3, clear=[None] * 3),
        step(2, [NONZERO] * 3, passes=[1] * 3, clear=[1, 1, 0]),
        step(3, [NONZERO] * 3, passes=[1] * 3, clear=[1, 0, 0]),
    ]
    assert feed(check, steps) == [None, 2, 2]
    f = check.finding
    assert f is not None and f.params == ("enc.bias", "head.weight")  # grows, in parameter order
    assert "in 1 parameter (head.weight): their .grad was not cleared, so step 2 used the sum of 2" in f.message


def test_sampled_steps_say_earlier_steps_instead_of_a_count() -> None:
    check = UnclearedGradients()
    steps = [step(n, [NONZERO] * 3, passes=[1] * 3, clear=[None if n == 1 else 0] * 3) for n in (1, 6, 11)]
    assert feed(check, steps) == [None, 6, 6]
    assert check.finding is not None and check.finding.figure is None
    assert "step 6 used gradients summed over earlier steps" in check.finding.message


def test_intentional_accumulation_is_info_with_k() -> None:
    check = GradAccumulation()
    assert feed(check, [plain(n, k=4) for n in range(1, 8)]) == [None, 2, 2, 2, 2, 2, 2]
    f = check.finding
    assert f is not None and f.severity == "info" and f.params == ()
    assert "sums 4 backward passes (micro-batches)" in f.message and f.figure is not None and f.figure.text == "4"
    # a loop may already scale each micro-batch's loss (nanoGPT, HF Trainer): the hint says what
    # the step is either way, and never tells people to divide, which would divide twice
    assert "divide" not in f.message.lower() and "scaled by 1/4" in f.message and "4 times larger" in f.message
    # A short last group: the range is kept.
    check.observe(RUN, plain(8, k=2))
    assert check.finding is not None and check.finding.figure is not None and check.finding.figure.text == "2 to 4"
    assert check.finding.first_step == 2
    # One backward pass per step, or K passes without clearing, is not accumulation on purpose.
    assert feed(GradAccumulation(), [plain(n, k=1) for n in range(1, 10)]) == [None] * 9
    assert feed(GradAccumulation(), [plain(n, k=4, clear=0) for n in range(1, 10)]) == [None] * 9


def test_zero_filled_buffers_are_a_warning_with_the_bytes_held() -> None:
    check = ZeroFilledGradBuffers()
    steps = [plain(1), plain(2, clear=2), plain(3, clear=2)]
    assert feed(check, steps) == [None, 2, 2]
    f = check.finding
    held = 32 * 16 * 4 + 32 * 4 + 4 * 32 * 2  # float32, float32, bfloat16
    assert f is not None and f.severity == "warning" and f.params == NAMES
    assert f.figure is not None and f.figure.value == held and f.figure.unit == "bytes"
    assert fmt_bytes(held) in f.message and "set_to_none=True" in f.message
    # The hook's mem/zero_grad_bytes wins when it is larger (buffers still zero at the step).
    check = ZeroFilledGradBuffers()
    feed(
        check, [plain(1), step(2, [NONZERO] * 3, passes=[1] * 3, clear=[2, 1, 1], scalars={"mem/zero_grad_bytes": 1e6})]
    )
    assert check.finding is not None and check.finding.figure is not None and check.finding.figure.value == 1e6
    assert check.finding.params == ("enc.weight",)


def test_old_hooks_without_the_counters_get_no_clearing_findings() -> None:
    steps = [step(n, [NONZERO] * 3) for n in range(1, 30)]
    for cls in (UnclearedGradients, GradAccumulation, ZeroFilledGradBuffers):
        assert feed(cls(), steps) == [None] * 29


# -- coverage ----------------------------------------------------------------------------------


def test_params_left_out_of_the_optimizer_are_known_from_hello() -> None:
    run = RunContext.of([(n, 4, "float32") for n in NAMES], {"unoptimized_params": ["extra.weight", "extra.bias"]})
    check = ParamNotInOptimizer()
    check.start(run)
    f = check.finding
    assert f is not None and f.severity == "warning" and f.first_step is None
    assert f.params == ("extra.weight", "extra.bias")
    assert f.message.startswith(
        "2 parameters of the model (extra.weight and extra.bias) require gradients but are in no optimizer param group"
    )
    configs: list[dict[str, object]] = [{}, {"unoptimized_params": []}, {"unoptimized_params": "extra.weight"}]
    for config in configs:
        check = ParamNotInOptimizer()
        check.start(RunContext.of([(n, 4, "float32") for n in NAMES], config))
        assert check.finding is None


def test_a_param_without_grad_for_10_steps_is_reported_from_the_first() -> None:
    check = ParamNeverGetsGrad()
    steps = [step(n, [NONZERO, NONZERO, NONE]) for n in range(3, 15)]
    assert feed(check, steps) == [None] * 9 + [3, 3, 3]
    f = check.finding
    assert f is not None and f.severity == "warning" and f.params == ("head.weight",)
    assert "got no gradient in the first 10 steps" in f.message
    # A gradient at any of the first 10 steps, every parameter without one, or frozen: nothing.
    late = [step(n, [NONZERO, NONZERO, NONE if n != 7 else NONZERO]) for n in range(1, 20)]
    assert feed(ParamNeverGetsGrad(), late) == [None] * 19
    assert feed(ParamNeverGetsGrad(), [step(n, [NONE] * 3) for n in range(1, 20)]) == [None] * 19
    frozen = RunContext.of([(n, 4, "float32") for n in NAMES], {"frozen_params": ["head.weight"]})
    assert feed(ParamNeverGetsGrad(), steps, frozen) == [None] * 12


def test_step_without_any_grad_is_an_error() -> None:
    check = StepWithoutGrad()
    assert feed(check, [step(1, [NONE] * 3), plain(2)]) == [1, 1]
    assert check.finding is not None and check.finding.severity == "error"
    assert "step 1 with no gradient at all (every .grad was None)" in check.finding.message
    # Zero-filled buffers and no backward pass since the last step: nothing to step with either.
    check = StepWithoutGrad()
    assert feed(check, [plain(1), step(2, [ZERO] * 3, passes=[0] * 3, clear=[None] * 3)]) == [None, 2]
    # Some parameters without a gradient, or zero gradients from a real backward pass: fine.
    assert feed(
        StepWithoutGrad(), [step(1, [NONE, NONZERO, NONE]), step(2, [ZERO] * 3, passes=[1] * 3, clear=[1] * 3)]
    ) == [None, None]


# -- values ------------------------------------------------------------------------------------


def test_nonfinite_gradients_name_every_parameter_from_the_first_step() -> None:
    check = NonfiniteGrad()
    steps = [plain(1), step(2, [NONZERO, NONFINITE, NONZERO]), plain(3), step(4, [NONFINITE, NONFINITE, NONZERO])]
    assert feed(check, steps) == [None, 2, 2, 2]
    f = check.finding
    assert f is not None and f.severity == "error" and f.params == ("enc.weight", "enc.bias")
    assert f.message.startswith("Gradients became NaN or Inf at step 2 in enc.weight and enc.bias")


def test_amp_skipped_steps_are_info_when_few_and_a_warning_when_many() -> None:
    check = AmpSkippedSteps()
    steps = [
        step(
            n, [NONZERO] * 3, scalars={"amp/scale": 65536.0 / 2 ** min(n, 3), "amp/skipped_steps": float(min(n - 1, 3))}
        )
        for n in range(1, 10)
    ]
    assert feed(check, steps) == [None, 2, 2, 2, 2, 2, 2, 2, 2]
    f = check.finding
    assert f is not None and f.severity == "info" and f.figure is not None and f.figure.value == 3
    assert f.message == (
        "GradScaler skipped 3 optimizer steps because the gradients overflowed (scale now 8192); "
        "a few skips while the scale settles are normal, and need no fix."
    )
    assert f.figure.text == "3 · scale 8192"
    check.observe(RUN, step(40, [NONZERO] * 3, scalars={"amp/scale": 0.5, "amp/skipped_steps": 12.0}))
    f = check.finding
    assert f is not None and f.severity == "warning" and f.first_step == 2
    assert "skipped 12 of 52 optimizer steps because the gradients kept overflowing (scale now 0.5)" in f.message
    assert (
        feed(AmpSkippedSteps(), [step(n, [NONZERO] * 3, scalars={"amp/skipped_steps": 0.0}) for n in range(1, 5)])
        == [None] * 4
    )


def noisy(n: int, rng: np.random.Generator, scale: float = 1.0) -> StepView:
    norms = scale * np.exp(rng.normal(0, 0.3, 3))
    return step(n, [NONZERO] * 3, norm=list(norms), passes=[1] * 3, clear=[None if n == 1 else 1] * 3)


def test_exploding_needs_three_samples_in_a_row_far_above_the_median() -> None:
    rng = np.random.default_rng(0)
    history = [noisy(n, rng) for n in range(1, 31)]
    spike = [step(n, [NONZERO] * 3, norm=[50.0, 1.0, 1.0], passes=[1] * 3, clear=[1] * 3) for n in range(31, 34)]
    check = ExplodingGrad()
    assert feed(check, history + spike) == [None] * 32 + [31]
    f = check.finding
    assert f is not None and f.severity == "warning" and f.params == ("enc.weight",)
    assert f.figure is not None and f.figure.value > 10 and f.figure.unit == "ratio"
    assert "jumped to" in f.message and "at step 31" in f.message
    # One or two spikes, or a spike during the warm-up, is no explosion.
    two = [step(n, [NONZERO] * 3, norm=[50.0, 1.0, 1.0], passes=[1] * 3, clear=[1] * 3) for n in (31, 32)]
    assert feed(ExplodingGrad(), history + two + [noisy(n, rng) for n in range(33, 60)])[-1] is None
    early = [noisy(n, rng, 100.0 if n in (3, 4, 5, 6) else 1.0) for n in range(1, 40)]
    assert feed(ExplodingGrad(), early)[-1] is None
    # Non-finite gradients are nonfinite_grad's, not an explosion; they do not break a streak either.
    inf = [step(n, [NONFINITE] * 3, passes=[1] * 3, clear=[1] * 3) for n in range(31, 40)]
    assert feed(ExplodingGrad(), history + inf)[-1] is None
    high = [step(n, [NONZERO] * 3, norm=[50.0, 1.0, 1.0], passes=[1] * 3, clear=[1] * 3) for n in (31, 32, 34)]
    nan = step(33, [NONFINITE, NONZERO, NONZERO], norm=[math.nan, 1.0, 1.0], passes=[1] * 3, clear=[1] * 3)
    assert feed(ExplodingGrad(), history + high[:2] + [nan] + high[2:])[-1] == 31


def test_vanishing_needs_a_sudden_collapse() -> None:
    rng = np.random.default_rng(1)
    history = [noisy(n, rng) for n in range(1, 31)]
    dead = [step(n, [ZERO, NONZERO, NONZERO], passes=[1] * 3, clear=[1] * 3) for n in range(31, 34)]
    check = VanishingGrad()
    assert feed(check, history + dead) == [None] * 31 + [31, 31]
    f = check.finding
    assert f is not None and f.severity == "warning" and f.params == ("enc.weight",)
    assert f.figure is not None and f.figure.value == 0 and "collapsed to 0× its recent median at step 31" in f.message
    # A zero gradient that no backward pass produced (the parameter was not used) is not a collapse,
    # nor is a single dead step.
    unused = [step(n, [ZERO, NONZERO, NONZERO], passes=[0, 1, 1], clear=[None, 1, 1]) for n in range(31, 40)]
    assert feed(VanishingGrad(), history + unused)[-1] is None
    once = [step(31, [ZERO, NONZERO, NONZERO], passes=[1] * 3, clear=[1] * 3)] + [noisy(n, rng) for n in range(32, 40)]
    assert feed(VanishingGrad(), history + once)[-1] is None


def converging(steps: int, seed: int, decay: float) -> list[StepView]:
    """Norms that fall the way training runs' do: fast at first, then a noisy floor, plus spikes."""
    rng = np.random.default_rng(seed)
    out = []
    for n in range(1, steps + 1):
        base = np.array([3.0, 0.5, 12.0]) * (0.05 + 0.95 * math.exp(-n / decay))
        spikes = np.where(rng.random(3) < 0.02, rng.uniform(2, 6, 3), 1.0)  # the odd loss spike
        norms = base * np.exp(rng.normal(0, 0.35, 3)) * spikes
        out.append(step(n, [NONZERO] * 3, norm=list(norms), passes=[1] * 3, clear=[None if n == 1 else 1] * 3))
    return out


@pytest.mark.parametrize("seed", range(5))
def test_exploding_and_vanishing_stay_quiet_on_converging_runs(seed: int) -> None:
    for decay in (10.0, 60.0, 400.0):
        for cls in (ExplodingGrad, VanishingGrad):
            assert feed(cls(), converging(600, seed, decay))[-1] is None, (cls.code, decay)


def test_vanishing_stays_quiet_when_the_loss_goes_to_zero_geometrically() -> None:
    """Full-batch descent on a noise-free problem: the norm shrinks by a constant factor per step."""
    for factor in (0.5, 0.8, 0.95):
        steps = [
            step(n, [NONZERO] * 3, norm=[factor**n * 5] * 3, passes=[1] * 3, clear=[None if n == 1 else 1] * 3)
            for n in range(1, 120)
        ]
        assert feed(VanishingGrad(), steps)[-1] is None, factor


# -- engine ------------------------------------------------------------------------------------


def test_run_diagnosis_orders_findings_and_survives_a_broken_check(caplog: pytest.LogCaptureFixture) -> None:
    class Broken(Check):
        """`broken`: raises on every step."""

        code = "broken"

        def observe(self, run: RunContext, step: StepView) -> None:
            raise RuntimeError("bug")

    run = RunContext.of([(n, 4, "float32") for n in NAMES], {"unoptimized_params": ["x.weight"]})
    diag = RunDiagnosis(run, (Broken, *CHECKS))
    for n in range(1, 5):
        diag.observe(
            step(
                n,
                [NONZERO, NONFINITE if n >= 3 else NONZERO, NONZERO],
                passes=[1] * 3,
                clear=[None if n == 1 else 0] * 3,
            )
        )
    diag.observe(step(2, [NONE] * 3))  # not after the last step: counted, not judged
    assert [f.code for f in diag.findings()] == [
        "param_not_in_optimizer",
        "grad_accumulation_unbounded",
        "nonfinite_grad",
    ]
    assert diag.steps == 5 and diag.last_step == 4
    assert "check broken failed" in caplog.text


def test_name_lists_read_as_sentences() -> None:
    assert name_list(["a"]) == "a"
    assert name_list(["a", "b"]) == "a and b"
    assert name_list(["a", "b", "c"]) == "a, b and c"
    assert name_list(["a", "b", "c", "d", "e"]) == "a, b, c and 2 more"
    assert [fmt_bytes(x) for x in (512, 1536, 3 * 2**20)] == ["512 B", "1.5 KiB", "3 MiB"]


def test_norm_history_medians_match_a_naive_oracle() -> None:
    """The ring buffers' medians equal numpy's median of each parameter's last values."""
    from gradwatch_server.diagnostics.values import NormHistory

    rng = np.random.default_rng(3)
    history = NormHistory(6, 8)
    kept: list[list[float]] = [[] for _ in range(6)]
    for _ in range(30):
        mask = rng.random(6) < 0.6
        values = rng.lognormal(size=6)
        history.push(mask, values)
        for j in np.flatnonzero(mask):
            kept[int(j)].append(float(values[j]))
        for last in (None, 5):
            got = history.median(last)
            for i, seen in enumerate(kept):
                window = seen[-8:] if last is None else seen[-min(last, 8) :]
                if window:
                    assert got[i] == pytest.approx(float(np.median(window)))
                else:
                    assert np.isnan(got[i])


def test_rank_desync_names_the_parameters_the_ranks_and_the_first_step() -> None:
    check = RankDesync()
    steps = [
        job_step(1, [0.0, 0.0, None]),
        job_step(2, None),  # a single-process step, or one the rule does not apply to
        job_step(3, [0.0, 1.0, None], {2: 1.0}),
        job_step(4, [1.0, 2.0, None], {1: 1.0, 2: 2.0}),
        job_step(5, [0.0, 0.0, None]),
    ]
    assert feed(check, steps) == [None, None, 3, 3, 3]
    finding = check.finding
    assert finding is not None and finding.severity == "error"
    assert finding.params == ("enc.weight", "enc.bias")  # head.weight is sharded: never judged
    assert "ranks 1 and 2" in finding.message and "from step 3" in finding.message
    assert "no_sync()" in finding.message and "static_graph" in finding.message
    assert finding.figure is not None and finding.figure.value == 2.0


def test_rank_desync_is_quiet_while_the_replicas_agree() -> None:
    check = RankDesync()
    assert feed(check, [job_step(n, [0.0, 0.0, None]) for n in range(1, 30)]) == [None] * 29


def test_norm_history_medians_of_some_rows_and_its_bounds_match_a_naive_oracle() -> None:
    """`median(rows=...)` makes only those rows' medians, each the number `median()` gives; the
    kept medians follow the pushes; `bounds` are each window's least and greatest value."""
    from gradwatch_server.diagnostics.values import NormHistory

    rng = np.random.default_rng(5)
    history, fresh = NormHistory(6, 8), NormHistory(6, 8)  # `fresh`: medians made anew at every step
    kept: list[list[float]] = [[] for _ in range(6)]
    for n in range(40):
        mask = rng.random(6) < (0.0 if n % 5 == 4 else 0.5)  # some steps push nothing
        values = rng.lognormal(size=6)
        history.push(mask, values)
        fresh.push(mask, values)
        for j in np.flatnonzero(mask):
            kept[int(j)].append(float(values[j]))
        rows = rng.random(6) < 0.5
        for last in (None, 5):
            got = history.median(last, rows=rows)
            want = NormHistory.median(fresh, last)
            fresh._known[:] = False  # noqa: SLF001 - the oracle forgets its medians
            for i, seen in enumerate(kept):
                if not rows[i] or not seen:
                    assert np.isnan(got[i])
                else:
                    assert got[i] == want[i]
                    window = seen[-8:] if last is None else seen[-min(last, 8) :]
                    assert got[i] == pytest.approx(float(np.median(window)))
        least, greatest = history.bounds()
        for i, seen in enumerate(kept):
            if seen:
                assert (least[i], greatest[i]) == (min(seen[-8:]), max(seen[-8:]))
            else:
                assert np.isnan(least[i]) and np.isnan(greatest[i])


class _EveryMedianExploding(ExplodingGrad):
    """The oracle: no bounds (`_NormJump._near`'s default), every judged parameter's median."""

    def _near(self, value: np.ndarray, history: object, streak: np.ndarray) -> np.ndarray:
        return np.zeros(len(value), dtype=bool)


class _EveryMedianVanishing(VanishingGrad):
    def _near(self, value: np.ndarray, history: object, streak: np.ndarray) -> np.ndarray:
        return np.zeros(len(value), dtype=bool)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_exploding_and_vanishing_find_what_every_median_finds(seed: int) -> None:
    """The windows' bounds spare medians, never a finding: against checks that make every
    judged parameter's median, the same finding after every step, on norms that jump up,
    collapse, go to zero for good, and come back."""
    rng = np.random.default_rng(seed)
    steps = []
    for n in range(1, 160):
        norm = np.exp(0.05 * rng.standard_normal(3)) * np.array([1.0, 0.01, 2.0])  # tight bounds: most steps near
        status = [NONZERO] * 3
        if 60 <= n < 64:
            norm[0] *= 50.0  # jumps up and stays: exploding_grad's
        elif rng.random() < 0.1:
            norm[0] *= rng.uniform(7.0, 14.0)  # around exploding_grad's 10x
        if 90 <= n < 93:
            norm[1] *= 1e-5  # collapses: vanishing_grad's
        elif rng.random() < 0.1:
            norm[1] *= 10 ** rng.uniform(-3.5, -2.5)  # around vanishing_grad's 1/1000
        if n >= 120:
            status[2], norm[2] = ZERO, 0.0  # a gradient gone to zero for good (dead ReLUs)
        if rng.random() < 0.05:
            status[1], norm[1] = NONE, math.nan
        steps.append(step(n, status, norm=[None if math.isnan(v) else float(v) for v in norm], passes=[1.0] * 3))
    for fast, oracle in ((ExplodingGrad(), _EveryMedianExploding()), (VanishingGrad(), _EveryMedianVanishing())):
        fast.start(RUN)
        oracle.start(RUN)
        for s in steps:
            fast.observe(RUN, s)
            oracle.observe(RUN, s)
            assert fast.finding == oracle.finding
            np.testing.assert_array_equal(fast.streak, oracle.streak)  # the steps judged far so far
        assert fast.finding is not None  # the steps above do trigger both

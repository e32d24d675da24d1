"""Training instabilities, warned early: single-step spikes of the gradient norms, updates large
against their parameter, and loss spikes with the parameters that moved first.

Pretraining teams watch a spike score (OLMo-core and Levanter flag a value more than 6 standard
deviations above its last 128 steps). Here the score is robust and per series: the value's log
against the median of the series' last `WINDOW` values, in units of their scaled median absolute
deviation (1.4826 x MAD, the standard deviation of normal noise), so that one earlier spike in
the window neither hides the next nor makes the scale; logs, because norms and losses are
positive and their noise is multiplicative. A minimum ratio to the median keeps a very steady
series (a LayerNorm's gain at full batch) from raising a warning on a 20% move.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from . import rings
from .check import Check
from .data import NONZERO, RunContext, StepBatch, StepView
from .finding import Figure, Finding, fmt_num, name_list

#: The scale of normal noise from a median absolute deviation.
MAD_SIGMA = 1.4826


class SpikeWindow:
    """The last `window` log values of each of `count` series (a row each), and the robust
    score of a new value against them. Non-positive and non-finite values are not kept."""

    def __init__(self, count: int, window: int) -> None:
        self.values = np.full((count, window), np.nan)
        self.pos = np.zeros(count, dtype=np.int64)
        self.count = np.zeros(count, dtype=np.int64)
        self._rows = np.arange(count)
        self.last = b""  # the logs of the last push (`_grad_score`'s key)

    def push(self, values: np.ndarray) -> None:
        """Keep each row's value where it is finite and positive."""
        with np.errstate(divide="ignore", invalid="ignore"):
            logs = np.log(values)
        self.last = logs.tobytes()
        rows = self._rows[np.isfinite(logs)]
        if not len(rows):
            return
        self.values[rows, self.pos[rows]] = logs[rows]
        self.pos[rows] = (self.pos[rows] + 1) % self.values.shape[1]
        self.count[rows] += 1

    def score(self, values: np.ndarray, warmup: int, least: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Per row: (robust z-score, value / median) of `values` against the kept ones; NaN
        where the row has fewer than `warmup` values or the value is not finite and positive.

        With `least` (a ratio the caller needs at least), a row whose value is below `least`
        times even its smallest kept value (so below `least` times their median) is not scored:
        0 and 0 there. The medians (two sorts of each row, at every ingested step) are this
        class's largest cost, and most steps have no such row."""
        n = len(self._rows)
        z, ratio = np.full(n, np.nan), np.full(n, np.nan)
        with np.errstate(divide="ignore", invalid="ignore"):
            logs = np.log(values)
        ready = (self.count >= warmup) & np.isfinite(logs)
        if least is not None and ready.any():
            # fl(x - median) <= fl(x - smallest), as median >= smallest; a margin far above
            # exp's rounding keeps a value just below the bound from reading as at it
            with np.errstate(invalid="ignore"):
                below = ready & (logs - np.fmin.reduce(self.values, axis=1) < math.log(least) - 1e-9)
            z[below], ratio[below] = 0.0, 0.0
            ready &= ~below
        if not ready.any():
            return z, ratio
        kept = self.values[ready]
        size = np.minimum(self.count[ready], kept.shape[1])
        median = _medians(kept, size)
        spread = _medians(np.abs(kept - median[:, None]), size) * MAD_SIGMA
        x = logs[ready]
        with np.errstate(divide="ignore", invalid="ignore"):
            z[ready] = np.where(spread > 0, (x - median) / spread, np.where(x > median, np.inf, 0.0))
        ratio[ready] = np.exp(x - median)
        return z, ratio

    def score_run(self, values: np.ndarray, warmup: int) -> tuple[np.ndarray, np.ndarray]:
        """A one-row window's `score` of each of `values` in turn, each pushed after it is
        scored (`score_many` of a column)."""
        z, ratio = self.score_many(np.asarray(values, dtype=np.float64)[:, None], warmup)
        return z[:, 0], ratio[:, 0]

    def score_many(self, values: np.ndarray, warmup: int, least: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """`score` then `push` of each row of `values` (steps x series) in turn: the same scores,
        bit for bit, and the same window after, in a few numpy calls for the batch rather than
        a few a step. Each value's window is a row of a sliding view over its series' kept values
        and the batch's before it (rings.py); with `least`, a bound of each window's smallest
        value rules out most values first, and only the others' windows are gathered. The
        medians sort the same values as `score`'s, so the scores are the same bits."""
        steps, n = values.shape
        width = self.values.shape[1]
        with np.errstate(divide="ignore", invalid="ignore"):
            logs = np.log(values)
        z, ratio = np.full((steps, n), np.nan), np.full((steps, n), np.nan)
        if not steps:
            return z, ratio
        usable = np.isfinite(logs)
        before = rings.kept_before(usable)
        held = self.count[None, :] + before  # values kept before each
        ready = usable & (held >= warmup)
        below = np.zeros((steps, n), dtype=bool)
        if least is not None and ready.any():
            # as `score`'s test, against a bound below each window's least value first
            bar = math.log(least) - 1e-9
            with np.errstate(invalid="ignore"):
                least_kept = np.fmin.reduce(self.values, axis=1)
                below = ready & (logs - rings.floors(least_kept, logs, usable) < bar)
        todo = ready & ~below
        if todo.any():
            i, s = np.nonzero(todo)
            kept = rings.windows(self.values, self.pos, logs, usable, before, i, s)
            if least is not None:
                with np.errstate(invalid="ignore"):
                    out = logs[i, s] - np.fmin.reduce(kept, axis=1) < bar
                below[i[out], s[out]] = True
                i, s, kept = i[~out], s[~out], kept[~out]
            if len(i):
                size = np.minimum(held[i, s], width)
                median = _medians(kept, size)
                spread = _medians(np.abs(kept - median[:, None]), size) * MAD_SIGMA
                x = logs[i, s]
                with np.errstate(divide="ignore", invalid="ignore"):
                    z[i, s] = np.where(spread > 0, (x - median) / spread, np.where(x > median, np.inf, 0.0))
                ratio[i, s] = np.exp(x - median)
        z[below], ratio[below] = 0.0, 0.0
        rings.append(self.values, self.pos, self.count, logs, usable, before)
        self.last = logs[-1].tobytes()  # as `push` of the last row leaves it
        return z, ratio


def _medians(rows: np.ndarray, size: np.ndarray) -> np.ndarray:
    """Median of each row's first `size` finite values (NaN sorts last)."""
    ordered = np.sort(rows, axis=1)
    at = np.arange(len(ordered))
    return np.asarray((ordered[at, (size - 1) // 2] + ordered[at, size // 2]) / 2)


def _usable_grads(step: StepView) -> np.ndarray:
    """Gradient norms a spike is judged on: non-zero and finite (NaN elsewhere); NaN and Inf are
    `nonfinite_grad`'s, and a zero gradient is no scale to compare with."""
    return np.where(step.status == NONZERO, step.grad_norm, np.nan)


#: The least ratio to its median a gradient norm is scored at (`_grad_score`): the smaller of
#: `GradNormSpike.RATIO` and `LossSpike.MOVED_RATIO`, which each compare with their own.
GRAD_LEAST = 2.0


def _grad_score(step: StepView, window: SpikeWindow, warmup: int) -> tuple[np.ndarray, np.ndarray]:
    """`window.score` of the step's usable gradient norms (at least GRAD_LEAST times the median;
    rows below it 0 and 0), made once a step for the checks that keep the same window:
    `grad_norm_spike`'s and `loss_spike`'s each keep every measured step's usable norms, so
    before this step's push they hold the same values, and their two scores were the largest
    part of the checks' cost on a run with noisy norms. Kept on the step (`StepView.memo`) for a
    window of the same fill (counts, positions, last push), never mutated by its readers."""
    key = (warmup, window.values.shape, window.count.tobytes(), window.pos.tobytes(), window.last)
    held = step.memo.get("grad_score")
    if held is not None and held[0] == key:
        return held[1], held[2]
    z, ratio = window.score(_usable_grads(step), warmup, least=GRAD_LEAST)
    step.memo["grad_score"] = (key, z, ratio)
    return z, ratio


def _grad_scores(batch: StepBatch, window: SpikeWindow | None, warmup: int) -> tuple[np.ndarray, np.ndarray] | None:
    """`_grad_score` of each step of the batch in turn, each step's usable norms pushed after
    it (`SpikeWindow.score_many`: steps x parameters): None where a step lacks the norms or
    the window counts other parameters (the steps are judged one by one). Kept on the batch
    with the window as it leaves it: the other check that keeps the same window (the same
    key before the batch) takes both instead of scoring again."""
    status, norm = batch.stack("status"), batch.stack("grad_norm")
    if window is None or status is None or norm is None or status.shape[1] != len(window.count):
        return None
    key = (warmup, window.values.shape, window.count.tobytes(), window.pos.tobytes(), window.last)
    held = batch.memo.get("grad_scores")
    if held is not None and held[0] == key:
        _, z, ratio, (values, pos, count, last) = held
        window.values[...], window.pos[...], window.count[...], window.last = values, pos, count, last
        return z, ratio
    z, ratio = window.score_many(np.where(status == NONZERO, norm, np.nan), warmup, least=GRAD_LEAST)
    after = (window.values.copy(), window.pos.copy(), window.count.copy(), window.last)
    batch.memo["grad_scores"] = (key, z, ratio, after)
    return z, ratio


def _flown(step: StepView, z: np.ndarray, ratio: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A step's gradient scores, where the hook's flight recorder scored it (`spike_z`,
    `spike_ratio`) its scores standing in for those the window could not make (NaN)."""
    if step.spike_z is None or step.spike_ratio is None:
        return z, ratio
    return np.where(np.isnan(z), step.spike_z, z), np.where(np.isnan(ratio), step.spike_ratio, ratio)


def _total(step: StepView) -> float | None:
    """The step's total gradient norm: what the loop's `clip_grad_norm_` returned when it
    clipped (the hook sends it as `clip/total_norm`), else the hook's own (`grad_norm_total`)."""
    for key in ("clip/total_norm", "grad_norm_total"):
        value = step.scalar(key)
        if value is not None and math.isfinite(value) and value > 0:
            return value
    return None


def _moves(
    names: Sequence[str], ratio: np.ndarray, z: np.ndarray, flagged: np.ndarray, limit: int = 10
) -> list[dict[str, Any]]:
    """The flagged parameters, largest move first, as evidence."""
    order = [i for i in np.argsort(-np.nan_to_num(ratio, nan=0.0)) if flagged[i]][:limit]
    return [
        {"param": names[i], "ratio": round(float(ratio[i]), 3), "z": round(float(min(z[i], 1e6)), 1)} for i in order
    ]


class GradNormSpike(Check):
    """`grad_norm_spike` (warning): at one measured step, a gradient norm far above its recent range.

    Per parameter (its gradient norm) and for the step's total gradient norm (what the loop's
    `clip_grad_norm_` returned when the hook saw one, else the norm over every parameter): the
    robust score (module docstring) over the series' last `WINDOW` (128) measured values, after
    `WARMUP` (20) of them, at least `Z` (6), and the value at least `RATIO` (3) times the median.
    One step is enough: the spike that precedes a divergence, or a bad batch, is warned at the
    step it happens (`exploding_grad` waits for the norm to stay up). Sampled (every=N, "auto"),
    a series may have too few measured values: a step the hook's flight recorder sent because it
    scored a spike there (against every step's norms) carries that score (`spike_z`,
    `spike_ratio`, `flight/total_z`, `flight/total_ratio`), which stands in for the missing one. Non-finite norms are
    `nonfinite_grad`'s. `first_step` is the step of the first spike; later spikes add the
    parameters they involve. Evidence (the figure's): the step, the total's and each spiking
    parameter's ratio and score.
    """

    code = "grad_norm_spike"
    WINDOW = 128
    WARMUP = 20
    Z = 6.0
    RATIO = 3.0

    def __init__(self) -> None:
        super().__init__()
        self.params: SpikeWindow | None = None
        self.total = SpikeWindow(1, self.WINDOW)

    def observe(self, run: RunContext, step: StepView) -> None:
        total = _total(step)
        # no total: nothing to score nor keep (score and push would find no log)
        none = np.array([np.nan])
        tz, tratio = (none, none) if total is None else self.total.score(np.array([total]), self.WARMUP)
        if total is not None:
            self.total.push(np.array([total]))
        self._observe_params(run, step, tz, tratio)

    def _observe_params(self, run: RunContext, step: StepView, tz: np.ndarray, tratio: np.ndarray) -> None:
        """`observe` of the step's parameters, its total scored already (`tz`, `tratio`: one value
        each, NaN where it has none): the total's window and the parameters' are apart."""
        values = _usable_grads(step)
        if self.params is None:
            self.params = SpikeWindow(len(values), self.WINDOW)
        z, ratio = _grad_score(step, self.params, self.WARMUP)  # rows below GRAD_LEAST x: 0 and 0
        self.params.push(values)
        self._judge(run, step, z, ratio, tz, tratio)

    def _judge(
        self, run: RunContext, step: StepView, z: np.ndarray, ratio: np.ndarray, tz: np.ndarray, tratio: np.ndarray
    ) -> None:
        """The finding after `step`, scored: its parameters (`z`, `ratio`) and its total (one
        value each, NaN where it has none), the flight recorder's scores standing in for those
        the windows could not make."""
        if step.spike_z is not None and step.spike_ratio is not None:  # the flight recorder scored it
            z, ratio = _flown(step, z, ratio)
            hook_z, hook_ratio = step.scalar("flight/total_z"), step.scalar("flight/total_ratio")
            if np.isnan(tz[0]) and hook_z is not None and hook_ratio is not None:
                tz, tratio = np.array([hook_z]), np.array([hook_ratio])
        with np.errstate(invalid="ignore"):
            flagged = (z >= self.Z) & (ratio >= self.RATIO)
            total_flagged = bool(tz[0] >= self.Z and tratio[0] >= self.RATIO)
        if not flagged.any() and not total_flagged:
            return
        before = self.finding
        names = set(before.params if before else ()) | set(run.names(flagged))
        if before is not None and len(names) == len(before.params):
            return
        ordered = tuple(p for p in run.params if p in names)
        if before is not None and before.figure is not None:  # the first incident stays the evidence
            self.finding = Finding(self.code, "warning", before.message, ordered, before.first_step, before.figure)
            return
        moved = _moves(run.params, ratio, z, flagged)
        parts = []
        if total_flagged:
            parts.append(f"the total gradient norm to {fmt_num(tratio[0])}× its recent median ({tz[0]:.0f}σ)")
        if moved:
            led = [str(m["param"]) for m in moved]
            parts.append(
                f"{name_list(led)} to {'up to ' if len(led) > 1 else ''}{fmt_num(float(moved[0]['ratio']))}× "
                f"{'their' if len(led) > 1 else 'its'} own"
            )
        worst = float(tratio[0]) if total_flagged else float(moved[0]["ratio"])
        message = (
            f"The gradient norm spiked at step {step.step}: {' and '.join(parts)}. One step like this is a bad "
            "batch or the first sign of a divergence (a learning rate too high, a layer blowing up); look at "
            "the loss around it, clip gradients, and lower the learning rate if it comes back."
        )
        evidence = {
            "step": step.step,
            "total": None
            if not total_flagged
            else {"ratio": round(float(tratio[0]), 3), "z": round(float(min(tz[0], 1e6)), 1)},
            "params": moved,
        }
        figure = Figure("gradient norm / its recent median", worst, "ratio", f"{fmt_num(worst)}×", step.step, evidence)
        self.finding = Finding(self.code, "warning", message, ordered, step.step, figure)

    def observe_batch(self, run: RunContext, batch: StepBatch) -> None:
        """`observe` of each step in turn: the batch's total norms scored at once
        (`SpikeWindow.score_run`), its parameters' norms too (`_grad_scores`), then only the
        steps that may raise or change the finding are looked at one by one."""
        views = batch.views
        totals = [_total(v) for v in views]
        tz, tratio = np.full(len(views), np.nan), np.full(len(views), np.nan)
        have = [j for j, t in enumerate(totals) if t is not None]
        if have:
            tz[have], tratio[have] = self.total.score_run(np.array([totals[j] for j in have]), self.WARMUP)
        status = batch.stack("status")
        if self.params is None and status is not None:
            self.params = SpikeWindow(status.shape[1], self.WINDOW)
        scored = _grad_scores(batch, self.params, self.WARMUP)
        if scored is None:
            for j, step in enumerate(views):
                self._observe_params(run, step, tz[j : j + 1], tratio[j : j + 1])
            return
        z, ratio = scored
        with np.errstate(invalid="ignore"):
            hot = ((z >= self.Z) & (ratio >= self.RATIO)).any(axis=1) | ((tz >= self.Z) & (tratio >= self.RATIO))
        hot |= [v.spike_z is not None and v.spike_ratio is not None for v in views]
        for k in map(int, np.flatnonzero(hot)):
            self._judge(run, views[k], z[k], ratio[k], tz[k : k + 1], tratio[k : k + 1])


class LargeUpdate(Check):
    """`large_update` (warning): a step's update is large against its parameter (`updates=True`).

    Evidence: `update_ratio` (‖p_after − p_before‖ / ‖p_before‖) per parameter. Flagged when it is
    a spike of its own history (the robust score over its last `WINDOW` (128) measured values,
    after `WARMUP` (20), at least `Z` (6), and at least `RATIO` (4) times its median), or when it
    is at least `ABSOLUTE` (1: the step moved the parameter by as much as its whole size) after
    the warm-up. A parameter at zero (a zero-initialised layer) has no ratio and is left out.
    The learning rate jumping, Adam's second moment having decayed under a gradient that comes
    back: the update is what moves the weights, so it sees these a step before the loss.
    """

    code = "large_update"
    WINDOW = 128
    WARMUP = 20
    Z = 6.0
    RATIO = 4.0
    ABSOLUTE = 1.0

    def __init__(self) -> None:
        super().__init__()
        self.window: SpikeWindow | None = None

    def observe(self, run: RunContext, step: StepView) -> None:
        values = step.update_ratio
        if values is None:
            return
        if self.window is None:
            self.window = SpikeWindow(len(values), self.WINDOW)
        z, ratio = self.window.score(values, self.WARMUP, least=self.RATIO)
        ready = self.window.count >= self.WARMUP
        self.window.push(values)
        self._judge(run, step, values, z, ratio, ready)

    def observe_batch(self, run: RunContext, batch: StepBatch) -> None:
        """`observe` of each step in turn: the batch's ratios scored at once
        (`SpikeWindow.score_many`), then only the steps with a flagged parameter looked at."""
        values = batch.stack("update_ratio")  # None where a step has none: step by step (each returns at once)
        if values is not None and self.window is None:
            self.window = SpikeWindow(values.shape[1], self.WINDOW)
        if values is None or self.window is None or values.shape[1] != len(self.window.count):
            super().observe_batch(run, batch)
            return
        with np.errstate(divide="ignore", invalid="ignore"):
            kept = np.isfinite(np.log(values))  # what `push` keeps
        ready = self.window.count[None, :] + rings.kept_before(kept) >= self.WARMUP
        z, ratio = self.window.score_many(values, self.WARMUP, least=self.RATIO)
        for k in map(int, np.flatnonzero(self._flagged(values, z, ratio, ready).any(axis=1))):
            self._judge(run, batch.views[k], values[k], z[k], ratio[k], ready[k])

    def _flagged(self, values: np.ndarray, z: np.ndarray, ratio: np.ndarray, ready: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore"):
            return np.asarray(
                ((z >= self.Z) & (ratio >= self.RATIO)) | (ready & (values >= self.ABSOLUTE) & np.isfinite(values))
            )

    def _judge(
        self, run: RunContext, step: StepView, values: np.ndarray, z: np.ndarray, ratio: np.ndarray, ready: np.ndarray
    ) -> None:
        """The finding after `step`, its update ratios (`values`) scored (`z`, `ratio`);
        `ready`: where the window was warm before it."""
        flagged = self._flagged(values, z, ratio, ready)
        if not flagged.any():
            return
        before = self.finding
        names = set(before.params if before else ()) | set(run.names(flagged))
        if before is not None and len(names) == len(before.params):
            return
        ordered = tuple(p for p in run.params if p in names)
        if before is not None and before.figure is not None:
            self.finding = Finding(self.code, "warning", before.message, ordered, before.first_step, before.figure)
            return
        moved = _moves(run.params, ratio, z, flagged)
        top = int(np.nanargmax(np.where(flagged, values, np.nan)))
        message = (
            f"At step {step.step} the update of {name_list([str(m['param']) for m in moved] or [run.params[top]])} "
            f"was {fmt_num(float(values[top]))} of the parameter's size ({fmt_num(float(ratio[top]))}× its usual "
            "update): a learning rate that jumped, or Adam's second moment that decayed while the gradient was "
            "small and is now far behind it; lower the learning rate, warm it up, or raise Adam's epsilon."
        )
        evidence = {"step": step.step, "params": moved}
        figure = Figure(
            "update / parameter norm", float(values[top]), "ratio", fmt_num(float(values[top])), step.step, evidence
        )
        self.finding = Finding(self.code, "warning", message, ordered, step.step, figure)


class AdamEpsilonRegime(Check):
    """`adam_epsilon_regime` (warning): a layer's Adam second moment sank to epsilon's scale.

    Evidence: the hook's `eps_share` per parameter (Adam family, measured steps): the share of
    its entries whose bias-corrected second moment v̂ is below `EPS_FACTOR`² × eps² (the hook's
    constant, docs/diagnostics.md), where the update is lr · m / eps instead of lr · m / √v̂.
    Flagged when at least `SHARE` (0.5) of a parameter's entries are there on `PERSIST` (2)
    measured steps in a row, from step `FROM_STEP` (2) on: a layer whose gradient is zero only at
    the first step (behind a zero-initialised layer, as LoRA's A) is not there. With every="auto"
    two measured steps can be hundreds of steps apart; both count. Such a layer learns almost nothing while its gradient is small; when the gradient
    comes back its first updates are many times their usual size (Wortsman et al. 2023, Molybog
    et al. 2023): a spike waits there. Lower epsilon (OLMo 2 uses 1e-8 and below), or find why
    the gradient vanished.
    """

    code = "adam_epsilon_regime"
    SHARE = 0.5
    PERSIST = 2
    FROM_STEP = 2

    def __init__(self) -> None:
        super().__init__()
        self.streak: np.ndarray | None = None
        self.began: np.ndarray | None = None

    def observe(self, run: RunContext, step: StepView) -> None:
        share = step.eps_share
        if share is None:
            return
        if self.streak is None or self.began is None:
            self.streak = np.zeros(len(share), dtype=np.int64)
            self.began = np.zeros(len(share), dtype=np.int64)
        with np.errstate(invalid="ignore"):
            low = (share >= self.SHARE) & (step.step >= self.FROM_STEP)
        self.began[low & (self.streak == 0)] = step.step
        self.streak = np.where(low, self.streak + 1, 0)
        flagged = self.streak >= self.PERSIST
        if not flagged.any():
            return
        before = self.finding
        names = set(before.params if before else ()) | set(run.names(flagged))
        if before is not None and len(names) == len(before.params):
            return
        ordered = tuple(p for p in run.params if p in names)
        if before is not None and before.figure is not None:
            self.finding = Finding(self.code, "warning", before.message, ordered, before.first_step, before.figure)
            return
        worst = float(np.nanmax(np.where(flagged, share, np.nan)))
        message = (
            f"From step {int(self.began[flagged].min())}, {name_list(run.names(flagged))} "
            f"{'has' if flagged.sum() == 1 else 'have'} {worst:.0%} of {'its' if flagged.sum() == 1 else 'their'} "
            "entries in Adam's epsilon regime (second moment below epsilon²): the layer learns almost nothing "
            "now, and when its gradient comes back its updates will be many times their usual size; lower "
            "Adam's epsilon, or find why its gradient vanished (an input gone silent, a dead branch)."
        )
        evidence = {
            "step": step.step,
            "since": int(self.began[flagged].min()),
            "params": [{"param": run.params[i], "share": round(float(share[i]), 4)} for i in np.flatnonzero(flagged)][
                :10
            ],
        }
        figure = Figure("share of entries in the epsilon regime", worst, "ratio", f"{worst:.0%}", step.step, evidence)
        self.finding = Finding(self.code, "warning", message, ordered, step.step, figure)


class LossSpike(Check):
    """`loss_spike` (warning): the loss the loop logs (`w.log(loss=...)`) jumps above its recent range.

    Every step that carries a `loss` counts, measured or not. Flagged when the loss is at least
    `RATIO` (2) times the median of its last `WINDOW` (50) values, after `WARMUP` (20), and its
    robust score (module docstring) over them is at least `Z` (6); or at least `JUMP` (10) times
    that median whatever the score (a window that spans the fast fall of the first steps has a wide
    spread). Losses that are not positive (a GAN's, a log-likelihood) are not judged.

    The finding names the parameters whose gradient norm (or update ratio, with `updates=True`)
    moved first: at each measured step the check scores every parameter against its own last
    `WINDOW` values; a parameter moves at a step where it scores at least `MOVED_Z` (4) and is at
    least `MOVED_RATIO` (2)× its median. Those still moving near the spike (a run of moving steps,
    none more than `GAP` (3) steps apart, reaching to within `GAP` of it, in the last `LOOKBACK`
    (64) steps) are ranked by the step their run began, then by how far they moved, and named
    with how many steps before the loss they began.
    """

    code = "loss_spike"
    WINDOW = 50
    WARMUP = 20
    Z = 6.0
    RATIO = 2.0
    JUMP = 10.0
    MOVED_Z = 4.0
    MOVED_RATIO = 2.0
    LOOKBACK = 64
    GAP = 3
    NAMED = 5

    def __init__(self) -> None:
        super().__init__()
        self.loss = SpikeWindow(1, self.WINDOW)
        self.grads: SpikeWindow | None = None
        self.updates: SpikeWindow | None = None
        #: (step, per-parameter ratio where it moved else NaN, which series) of recent measured steps
        self.recent: deque[tuple[int, np.ndarray, str]] = deque()

    def observe(self, run: RunContext, step: StepView) -> None:
        self.observe_moves(step)
        self.observe_unmeasured(run, step)

    def observe_batch(self, run: RunContext, batch: StepBatch) -> None:
        """`observe` of each step in turn: the batch's losses scored at once (the loss's window
        depends on nothing else), its gradient norms and update ratios too (`score_many`), then
        only the steps where something moved or the loss spiked are looked at one by one (the
        spike's finding, made at its step, reads the recent moves as that step leaves them)."""
        views = batch.views
        spike = self._score_losses([(v.step, v.scalars) for v in views])
        status = batch.stack("status")
        if self.grads is None and status is not None:
            self.grads = SpikeWindow(status.shape[1], 128)
        with_updates = [j for j, v in enumerate(views) if v.update_ratio is not None]
        updates = [v.update_ratio for v in views if v.update_ratio is not None]
        sizes = {len(u) for u in updates} | ({len(self.updates.count)} if self.updates is not None else set())
        alike = status is not None and sizes <= {status.shape[1]}  # the updates' window, a row a parameter
        scored = _grad_scores(batch, self.grads, self.WARMUP) if alike else None
        if scored is None:
            for j, step in enumerate(views):
                self.observe_moves(step)
                if spike is not None and spike[0] == j:
                    self._loss_spike(run, step.step, *spike[1:])
            return
        z, ratio = scored
        moved_updates = np.zeros(z.shape, dtype=bool)
        update_ratio = np.full(z.shape, np.nan)
        if updates:
            if self.updates is None:
                self.updates = SpikeWindow(z.shape[1], 128)
            uz, uratio = self.updates.score_many(np.stack(updates), self.WARMUP, least=self.MOVED_RATIO)
            with np.errstate(invalid="ignore"):
                moved_updates[with_updates] = (uz >= self.MOVED_Z) & (uratio >= self.MOVED_RATIO)
            update_ratio[with_updates] = uratio
        flown = np.array([v.spike_z is not None and v.spike_ratio is not None for v in views])
        with np.errstate(invalid="ignore"):
            act = ((z >= self.MOVED_Z) & (ratio >= self.MOVED_RATIO)).any(axis=1) | moved_updates.any(axis=1) | flown
        if spike is not None:
            act[spike[0]] = True
        for k in map(int, np.flatnonzero(act)):
            step = views[k]
            self._moved(step.step, *_flown(step, z[k], ratio[k]), "gradient")
            if moved_updates[k].any():
                self.recent.append((step.step, np.where(moved_updates[k], update_ratio[k], np.nan), "update"))
            self._age(step.step)
            if spike is not None and spike[0] == k:
                self._loss_spike(run, step.step, *spike[1:])
        self._age(views[-1].step)

    def observe_moves(self, step: StepView) -> None:
        """A measured step's gradient norms, and its update ratios where it has them, scored and kept."""
        self._track("gradient", _usable_grads(step), step.step, step, shared=True)
        if step.update_ratio is not None:
            self._track("update", step.update_ratio, step.step)

    def _track(
        self, series: str, values: np.ndarray, at: int, step: StepView | None = None, shared: bool = False
    ) -> None:
        """`shared`: `values` are the step's usable gradient norms, scored as `_grad_score` does."""
        window = self.grads if series == "gradient" else self.updates
        if window is None:
            window = SpikeWindow(len(values), 128)
            if series == "gradient":
                self.grads = window
            else:
                self.updates = window
        if shared and step is not None:
            z, ratio = _grad_score(step, window, self.WARMUP)
        else:
            z, ratio = window.score(values, self.WARMUP, least=self.MOVED_RATIO)
        window.push(values)
        if step is not None:  # scored by the hook
            z, ratio = _flown(step, z, ratio)
        self._moved(at, z, ratio, series)
        self._age(at)

    def _moved(self, at: int, z: np.ndarray, ratio: np.ndarray, series: str) -> None:
        """Keep the parameters of `series` that moved at step `at` (`recent`)."""
        with np.errstate(invalid="ignore"):
            moved = (z >= self.MOVED_Z) & (ratio >= self.MOVED_RATIO)
        if moved.any():
            self.recent.append((at, np.where(moved, ratio, np.nan), series))

    def _age(self, at: int) -> None:
        """Forget the moves of more than LOOKBACK steps before `at`."""
        while self.recent and self.recent[0][0] <= at - self.LOOKBACK:
            self.recent.popleft()

    def _moved_first(self, run: RunContext, at: int) -> dict[str, tuple[int, float, str]]:
        """Parameter -> (the step it began to move, its largest ratio since, the series), for the
        parameters still moving near step `at`: a run of moved measured steps, none more than
        `GAP` steps apart, whose last is at most `GAP` steps before `at`."""
        first: dict[str, tuple[int, float, str]] = {}
        reach: dict[int, int] = {}  # parameter index -> the oldest step of its run so far
        for when, ratios, series in reversed(self.recent):
            for i in map(int, np.flatnonzero(np.isfinite(ratios))):
                if when < reach.get(i, at) - self.GAP:
                    continue  # its run broke, or it was not moving near `at`
                reach[i] = when
                name = run.params[i]
                was = first.get(name)
                first[name] = (when, max(float(ratios[i]), was[1] if was else 0.0), was[2] if was else series)
        return first

    def observe_unmeasured_batch(self, run: RunContext, steps: Sequence[tuple[int, Mapping[str, float]]]) -> None:
        """`observe_unmeasured` of each step in turn, the run's losses scored at once
        (`SpikeWindow.score_run`): per step, numpy's calls on a one-value window cost more than
        storing the step (docs/benchmarks.md)."""
        spike = self._score_losses(steps)
        if spike is not None:
            self._loss_spike(run, steps[spike[0]][0], *spike[1:])

    def _score_losses(self, steps: Sequence[tuple[int, Mapping[str, float]]]) -> tuple[int, float, float, float] | None:
        """Score and keep the losses of `steps` ((step, scalars), in order), as `observe_unmeasured`
        on each would; the first that spiked while no finding is held: (its index in `steps`,
        the loss, its score, its ratio to the median), else None."""
        # a step that logged no loss, or a loss not finite, changes nothing (`observe_unmeasured`)
        at, losses = [], []
        for i, (_, scalars) in enumerate(steps):
            loss = scalars.get("loss")
            if loss is not None and math.isfinite(loss := float(loss)):
                at.append(i)
                losses.append(loss)
        if not losses:
            return None
        z, ratio = self.loss.score_run(np.array(losses), self.WARMUP)
        if self.finding is not None:
            return None
        with np.errstate(invalid="ignore"):
            spiked = np.flatnonzero(((z >= self.Z) & (ratio >= self.RATIO)) | (ratio >= self.JUMP))
        if not len(spiked):
            return None
        k = int(spiked[0])
        return at[k], losses[k], float(z[k]), float(ratio[k])

    def observe_unmeasured(self, run: RunContext, step: StepView) -> None:
        loss = step.scalar("loss")
        if loss is None or not math.isfinite(loss):
            return
        value = np.array([loss])
        z, ratio = self.loss.score(value, self.WARMUP)
        self.loss.push(value)
        if self.finding is not None or not ((z[0] >= self.Z and ratio[0] >= self.RATIO) or ratio[0] >= self.JUMP):
            return
        self._loss_spike(run, step.step, loss, float(z[0]), float(ratio[0]))

    def _loss_spike(self, run: RunContext, at_step: int, loss: float, z: float, ratio: float) -> None:
        """The finding of a loss that spiked at `at_step` (score `z`, `ratio` to its median)."""
        first = self._moved_first(run, at_step)
        ranked = sorted(first.items(), key=lambda kv: (kv[1][0], -kv[1][1]))[: self.NAMED]
        if ranked:
            named = ", ".join(
                f"{name} ({series} {fmt_num(r)}× at step {at}, {plural_steps(at_step - at)})"
                for name, (at, r, series) in ranked
            )
            moved = f" First to move: {named}."
        else:
            moved = " No parameter's gradient moved before it (a bad batch, or the loss alone)."
        message = (
            f"The loss spiked at step {at_step} to {fmt_num(loss)}, {fmt_num(ratio)}× its recent median."
            f"{moved} Look at the data of that step, the learning rate, and the parameters named."
        )
        evidence = {
            "step": at_step,
            "loss": loss,
            "ratio": round(ratio, 3),
            "z": round(min(z, 1e6), 1),
            "moved_first": [
                {"param": name, "series": series, "step": at, "lead": at_step - at, "ratio": round(r, 3)}
                for name, (at, r, series) in ranked
            ],
        }
        figure = Figure("loss / its recent median", ratio, "ratio", f"{fmt_num(ratio)}×", at_step, evidence)
        self.finding = Finding(self.code, "warning", message, tuple(name for name, _ in ranked), at_step, figure)


def plural_steps(n: int) -> str:
    return "the same step" if n == 0 else f"{n} step{'s' if n != 1 else ''} before"

"""Gradient values: non-finite gradients, and norms far above or below a parameter's own history."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from . import rings
from .check import Check
from .data import NONFINITE, NONZERO, ZERO, RunContext, StepBatch, StepView
from .finding import Figure, Finding, name_list


class NonfiniteGrad(Check):
    """`nonfinite_grad` (error): a gradient holds NaN or ±Inf.

    Evidence: `grad_status == nonfinite` (the hook's norm of that `.grad` is NaN or infinite).
    The finding names every parameter seen non-finite so far, and the first step. (Under a
    GradScaler, an overflowing step is skipped and never reaches the optimizer, so it shows as
    `amp_skipped_steps` instead.)
    """

    code = "nonfinite_grad"

    def observe(self, run: RunContext, step: StepView) -> None:
        bad = step.status == NONFINITE
        if not bad.any():
            return
        before = self.finding
        names = set(before.params if before else ()) | set(run.names(bad))
        if before is not None and len(names) == len(before.params):
            return
        ordered = tuple(n for n in run.params if n in names)
        first = before.first_step if before is not None and before.first_step is not None else step.step
        message = (
            f"Gradients became NaN or Inf at step {first} in {name_list(ordered)}; look for NaN/Inf in "
            "the inputs and the loss (log, division, overflow in float16), lower the learning rate, or "
            "clip gradients with torch.nn.utils.clip_grad_norm_."
        )
        self.finding = Finding(self.code, "error", message, ordered, first)

    def observe_batch(self, run: RunContext, batch: StepBatch) -> None:
        status = batch.stack("status")
        if status is not None and not (status == NONFINITE).any():
            return  # each step would return at once
        super().observe_batch(run, batch)


def _row_medians(values: np.ndarray) -> np.ndarray:
    """`np.median(values, axis=1)`, bit for bit, by sorting each row: numpy partitions a short
    row with two pivots (and a third for its NaN check) several times slower than it sorts it,
    and this runs at every ingested step for every parameter (docs/benchmarks.md)."""
    ordered = np.sort(values, axis=1)  # NaN sorts last
    mid = ordered.shape[1] // 2
    median = ordered[:, mid] if ordered.shape[1] % 2 else (ordered[:, mid - 1] + ordered[:, mid]) / 2
    return np.where(np.isnan(ordered[:, -1]), np.nan, median)


class NormHistory:
    """The last `window` usable gradient norms of each parameter: one ring buffer per parameter
    (a row each, so that a parameter's window is contiguous for the median)."""

    def __init__(self, count: int, window: int) -> None:
        self.values = np.full((count, window), np.nan)
        self.pos = np.zeros(count, dtype=np.int64)
        self.count = np.zeros(count, dtype=np.int64)
        self._rows = np.arange(count)
        # Medians of whole windows and the windows' bounds, kept until their rows change: a
        # parameter whose norms stop coming (a gradient gone to zero) is judged at every step
        # against the same window.
        self._medians = np.full(count, np.nan)
        self._known = np.zeros(count, dtype=bool)
        self._bounds: tuple[np.ndarray, np.ndarray] | None = None

    def push(self, mask: np.ndarray, values: np.ndarray) -> None:
        rows = self._rows[mask]
        if not len(rows):
            return
        self.values[rows, self.pos[rows]] = values[rows]
        self.pos[rows] = (self.pos[rows] + 1) % self.values.shape[1]
        self.count[rows] += 1
        self._known[rows] = False
        self._bounds = None

    def median(self, last: int | None = None, rows: np.ndarray | None = None) -> np.ndarray:
        """Per parameter: the median of its last `last` values (all kept ones by default); NaN if
        none. With `rows` (a mask), only those rows' medians are made (NaN elsewhere), each the
        same number as without it."""
        window = self.values.shape[1]
        depth = window if last is None else min(last, window)
        if depth == window:  # whole windows: from the rows' kept medians, the others made and kept
            wanted = np.ones(len(self._rows), dtype=bool) if rows is None else rows
            todo = wanted & ~self._known
            if todo.any():
                self._medians[todo] = self._made(window, todo)[todo]
                self._known |= todo
            return np.where(wanted, self._medians, np.nan)
        return self._made(depth, rows)

    def _made(self, depth: int, rows: np.ndarray | None) -> np.ndarray:
        """`median(depth)` made afresh."""
        if rows is not None and not rows.any():
            return np.full(len(self._rows), np.nan)
        window = self.values.shape[1]
        index = self._rows if rows is None else self._rows[rows]
        values, pos, count = self.values[index], self.pos[index], self.count[index]
        if depth == window:
            recent = values  # the order does not matter to a median
        else:
            cols = (pos[:, None] - np.arange(1, depth + 1)[None, :]) % window
            recent = values[np.arange(len(index))[:, None], cols]
        sub = np.full(len(index), np.nan)
        full = count >= depth  # no gaps: np.median, much faster than nanmedian
        if full.all():
            sub = _row_medians(recent)
        else:
            if full.any():
                sub[full] = _row_medians(recent[full])
            part = (count > 0) & ~full
            if part.any() and depth == window:  # not wrapped yet: a row's values are its first `count`
                for n in np.unique(count[part]):
                    same = part & (count == n)
                    sub[same] = _row_medians(values[same, :n])
            elif part.any():
                sub[part] = np.nanmedian(recent[part], axis=1)
        if rows is None:
            return sub
        out = np.full(len(self._rows), np.nan)
        out[index] = sub
        return out

    def push_many(self, kept: np.ndarray, values: np.ndarray) -> None:
        """`push` of each row (a step) in turn."""
        if not kept.any():
            return
        rings.append(self.values, self.pos, self.count, values, kept)
        self._known[kept.any(axis=0)] = False
        self._bounds = None

    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """Per parameter: the smallest and the largest kept value (NaN if none). A median lies
        between them, in floating point too: cheap bounds that spare most medians (`_NormJump`)."""
        if self._bounds is None:
            with np.errstate(invalid="ignore"):
                self._bounds = np.fmin.reduce(self.values, axis=1), np.fmax.reduce(self.values, axis=1)
        return self._bounds


class _NormJump(Check):
    """A parameter's gradient norm leaves its own recent range for `PERSIST` sampled steps in a row.

    Each parameter is compared with itself only: the median of its last `WINDOW` usable norms
    (finite, non-zero, from a step where a backward pass reached it), once it has `WARMUP` of
    them. A median is robust to the odd spike, and a window follows the slow drift of a run
    that converges. Subclasses say what "far" means (`_far`).
    """

    WINDOW = 50
    WARMUP = 20
    PERSIST = 2
    ABOVE = True  # the figure is the highest ratio (else the lowest)

    def __init__(self) -> None:
        super().__init__()
        self.history: NormHistory | None = None
        self.streak: np.ndarray | None = None
        self.began: np.ndarray | None = None
        self.ratio: np.ndarray | None = None
        self.named: np.ndarray | None = None  # the parameters the finding names, as a mask

    def _far(self, value: np.ndarray, median: np.ndarray, history: NormHistory, streak: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _far_any_streak(
        self, value: np.ndarray, median: np.ndarray, history: NormHistory
    ) -> tuple[np.ndarray, np.ndarray]:
        """`_far` of a batch's rows of values against one history: (far whatever the streak,
        far where the streak is above 0), so that the streak can be carried step by step."""
        raise NotImplementedError

    def _near(self, value: np.ndarray, history: NormHistory, streak: np.ndarray) -> np.ndarray:
        """Where `_far` is false whatever the median within the window's bounds (True: no need
        to make the median)."""
        return self._within(value, *history.bounds())

    def _within(self, value: np.ndarray, least: np.ndarray, greatest: np.ndarray) -> np.ndarray:
        """Where `_far` is false whatever the median, for windows whose values lie between
        `least` and `greatest`; False where that cannot be told (the default)."""
        return np.zeros(value.shape, dtype=bool)

    def _message(self, names: tuple[str, ...], first: int, ratio: float) -> tuple[str, Figure]:
        raise NotImplementedError

    def _state(self, n: int) -> tuple[NormHistory, np.ndarray]:
        """The windows and streaks of `n` parameters, made at the first step."""
        if self.history is None or self.streak is None or self.began is None or self.ratio is None:
            self.history = NormHistory(n, self.WINDOW)
            self.streak = np.zeros(n, dtype=np.int64)
            self.began = np.zeros(n, dtype=np.int64)
            self.ratio = np.zeros(n)
        return self.history, self.streak

    def observe(self, run: RunContext, step: StepView) -> None:
        n = len(step.status)
        history, streak = self._state(n)
        # Plain comparisons, not np.nan_to_num / np.isin (same values; they ran at every step):
        # a NaN count of passes is not above 0.
        reached = (step.passes > 0) if step.passes is not None else step.status == NONZERO
        value = np.where(step.status == ZERO, 0.0, step.grad_norm)
        # Non-finite norms are nonfinite_grad's: they neither extend nor break a streak here.
        judged = reached & ((step.status == ZERO) | (step.status == NONZERO)) & (history.count >= self.WARMUP)
        # Only the parameters that may be far need their median: judged (none until WARMUP sampled
        # steps have passed), and far even from the bound of their window's median (`_near`: a
        # median lies between its window's least and greatest value). Most steps have none, and
        # a median sorts its whole window, at every ingested step: the check's largest cost.
        maybe = judged & ~self._near(value, history, streak)
        median = history.median(rows=maybe) if maybe.any() else np.full(n, np.nan)
        far = maybe & self._far(value, median, history, streak)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(far, value / median, 0.0)
        assert self.began is not None and self.ratio is not None
        self.began[far & (streak == 0)] = step.step
        streak[far] += 1
        streak[judged & ~far] = 0
        self.ratio = np.where(far, ratio, self.ratio)
        history.push(reached & (step.status == NONZERO), step.grad_norm)
        self._flag(run, step.step, streak >= self.PERSIST)

    def observe_batch(self, run: RunContext, batch: StepBatch) -> None:
        """Steps whose norms leave the windows as they are (none kept but maybe the last step's:
        a gradient gone to zero, or NaN) are judged against the same window at once: the
        bounds, medians and comparisons as (steps x parameters) arrays; only the streaks go
        step by step. Any other batch, step by step."""
        status, norm = batch.stack("status"), batch.stack("grad_norm")
        if status is not None:
            self._state(status.shape[1])
        history, streak, began = self.history, self.streak, self.began
        with_passes = [v.passes is not None for v in batch.views]
        passes = batch.stack("passes") if all(with_passes) else None
        if (
            history is None
            or streak is None
            or began is None
            or status is None
            or norm is None
            or status.shape[1] != len(streak)
            or (any(with_passes) and passes is None)
        ):
            super().observe_batch(run, batch)
            return
        reached = (passes > 0) if passes is not None else status == NONZERO
        kept = reached & (status == NONZERO)
        if kept[:-1].any():  # the window changes inside the batch
            if not self._quiet(run, batch, reached, status, norm, kept):
                super().observe_batch(run, batch)
            return
        value = np.where(status == ZERO, 0.0, norm)
        judged = reached & ((status == ZERO) | (status == NONZERO)) & (history.count >= self.WARMUP)
        maybe = judged & ~self._near(value, history, streak)
        rows = maybe.any(axis=0)
        if rows.any():
            median = np.where(maybe, history.median(rows=rows), np.nan)
            always, if_streak = self._far_any_streak(value, median, history)
            always, if_streak = maybe & always, maybe & if_streak
            with np.errstate(divide="ignore", invalid="ignore"):
                ratios = value / median
        else:
            always = if_streak = ratios = np.zeros(value.shape, dtype=bool)
        if not self._scan(batch.steps, always, if_streak, judged, ratios):
            for i, step in enumerate(batch.steps.tolist()):
                far = always[i] | (if_streak[i] & (streak > 0))
                if far.any():
                    began[far & (streak == 0)] = step
                    streak[far] += 1
                    self.ratio = np.asarray(np.where(far, ratios[i], self.ratio))
                streak[judged[i] & ~far] = 0
                self._flag(run, step, streak >= self.PERSIST)
        history.push(kept[-1], norm[-1])

    def _quiet(
        self,
        run: RunContext,
        batch: StepBatch,
        reached: np.ndarray,
        status: np.ndarray,
        norm: np.ndarray,
        kept: np.ndarray,
    ) -> bool:
        """A batch whose steps change the windows, judged at once where no value can be far from
        its window (True: done); else nothing is changed (False: the caller goes step by step).
        Each step's window holds a subset of the values kept before the batch and the batch's
        kept ones before it: a value within the bounds of those (`rings.floors`) is within its
        window's own, so no median is needed, no streak grows, and the judged ones end."""
        assert self.history is not None and self.streak is not None
        history = self.history
        held = history.count[None, :] + rings.kept_before(kept)
        value = np.where(status == ZERO, 0.0, norm)
        judged = reached & ((status == ZERO) | (status == NONZERO)) & (held >= self.WARMUP)
        if judged.any():
            least, greatest = history.bounds()
            low = rings.floors(least, norm, kept, np.fmin)
            high = rings.floors(greatest, norm, kept, np.fmax)
            if (judged & ~self._within(value, low, high)).any():
                return False
        # `_scan` with no step far: a streak ends at its parameter's first judged step; one
        # already at PERSIST before that is flagged again, which changes nothing if it is named
        start = self.streak
        flagged = (start >= self.PERSIST) & ~judged[0]
        if flagged.any() and (self.finding is None or self.named is None or (flagged & ~self.named).any()):
            return False
        self.streak = np.where(judged.any(axis=0), 0, start)
        history.push_many(kept, norm)
        return True

    def _scan(
        self, steps: np.ndarray, always: np.ndarray, if_streak: np.ndarray, judged: np.ndarray, ratios: np.ndarray
    ) -> bool:
        """The streaks, beginnings and ratios after the batch's steps (rows), all at once, where
        no step flags a parameter the finding does not name yet (True: done); else nothing is
        changed (False: the caller goes step by step, making the finding where it changes).

        A streak is above 0 after a step that is far whatever the streak (`always`), 0 after a
        judged step that is not far even with a streak (`if_streak` holds `always`, and both are
        judged), and as before otherwise: the last such step tells, and a step far only with a
        streak is far exactly where the streak before it is above 0. A streak's length is then
        its far steps since its last judged step that was not far (or since the batch began)."""
        assert self.streak is not None and self.began is not None and self.ratio is not None
        start = self.streak
        at = np.arange(len(steps))[:, None]
        event = np.where(always, 1, np.where(judged & ~if_streak, 0, -1))
        last = np.maximum.accumulate(np.where(event >= 0, at, -1), axis=0)
        up = np.where(last >= 0, np.take_along_axis(event, np.maximum(last, 0), 0) == 1, start > 0)
        up_before = np.vstack([start[None, :] > 0, up[:-1]])
        far = always | (if_streak & up_before)
        reset = judged & ~far
        fars = np.cumsum(far, axis=0)
        since = np.maximum.accumulate(np.where(reset, at, -1), axis=0)
        after = np.where(since >= 0, fars - np.take_along_axis(fars, np.maximum(since, 0), 0), start + fars)
        flagged = after >= self.PERSIST
        if flagged.any() and (self.finding is None or self.named is None or (flagged & ~self.named).any()):
            return False
        before = np.vstack([start[None, :], after[:-1]])
        began = far & (before == 0)
        if began.any():
            last_began = len(steps) - 1 - np.argmax(began[::-1], axis=0)
            self.began = np.where(began.any(axis=0), steps[last_began], self.began)
        if far.any():
            last_far = len(steps) - 1 - np.argmax(far[::-1], axis=0)
            self.ratio = np.where(far.any(axis=0), ratios[last_far, np.arange(far.shape[1])], self.ratio)
        self.streak = np.ascontiguousarray(after[-1])
        return True

    def _flag(self, run: RunContext, at: int, flagged: np.ndarray) -> None:
        """The finding after step `at`, whose streaks reach PERSIST at `flagged`."""
        if not flagged.any():
            return
        assert self.began is not None and self.ratio is not None
        before = self.finding
        if before is not None and self.named is not None and not (flagged & ~self.named).any():
            return  # every flagged parameter is named already: the finding stays as it is
        names = set(before.params if before else ()) | set(run.names(flagged))
        if before is not None and len(names) == len(before.params):
            return
        self.named = flagged if self.named is None else self.named | flagged
        ordered = tuple(p for p in run.params if p in names)
        first = (
            int(self.began[flagged].min())
            if before is None or before.first_step is None
            else min(before.first_step, int(self.began[flagged].min()))
        )
        ratios = self.ratio[flagged]
        worst = (
            before.figure.value
            if before is not None and before.figure is not None
            else float(ratios.max() if self.ABOVE else ratios.min())
        )
        message, figure = self._message(ordered, first, worst)
        shown = before.figure.step if before is not None and before.figure is not None else at
        self.finding = Finding(self.code, "warning", message, ordered, first, replace(figure, step=shown))


class ExplodingGrad(_NormJump):
    """`exploding_grad` (warning): a gradient norm far above its own history.

    Thresholds: above `RATIO` (10) times the median of the parameter's last `WINDOW` (50) usable
    norms, after `WARMUP` (20) of them, on `PERSIST` (3) sampled steps in a row. A one-step
    spike is not an explosion; a run that diverges stays up. (Non-finite norms are left to
    `nonfinite_grad`: NaN from a bad batch is not a divergence.)
    The parameters' norms are measured as the step uses them, so clipping keeps this quiet.
    """

    code = "exploding_grad"
    RATIO = 10.0
    PERSIST = 3

    def _far(self, value: np.ndarray, median: np.ndarray, history: NormHistory, streak: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore"):
            return np.asarray(value > self.RATIO * median)

    def _far_any_streak(
        self, value: np.ndarray, median: np.ndarray, history: NormHistory
    ) -> tuple[np.ndarray, np.ndarray]:
        far = self._far(value, median, history, np.zeros(0))
        return far, far

    def _within(self, value: np.ndarray, least: np.ndarray, greatest: np.ndarray) -> np.ndarray:
        # median >= least, so RATIO * median >= RATIO * least (rounding is monotonic)
        with np.errstate(invalid="ignore"):
            return np.asarray(value <= self.RATIO * least)

    def _message(self, names: tuple[str, ...], first: int, ratio: float) -> tuple[str, Figure]:
        text = f"{ratio:.0f}×"
        message = (
            f"The gradient norm of {name_list(names)} jumped to {text} its recent median at step {first} "
            "and stayed up: training is diverging; lower the learning rate, add warm-up, or clip gradients "
            "with torch.nn.utils.clip_grad_norm_."
        )
        return message, Figure("gradient norm / its recent median", float(ratio), "ratio", text)


class VanishingGrad(_NormJump):
    """`vanishing_grad` (warning): a gradient norm collapses far below its own history.

    Thresholds: below `RATIO` (1/1000) of the median of the parameter's last `WINDOW` (50)
    usable norms, after `WARMUP` (20) of them, on `PERSIST` (2) sampled steps in a row, where the
    first of them is also below `SUDDEN` (1/100) of the median of its last `RECENT` (5) norms.
    The last condition tells a collapse (dead ReLUs, saturated activations) from the steady,
    geometric decay of a run that converges towards zero loss, which never drops 100× at once.
    A zero gradient from a backward pass that reached the parameter counts as below.
    """

    code = "vanishing_grad"
    RATIO = 1e-3
    SUDDEN = 1e-2
    RECENT = 5
    PERSIST = 2
    ABOVE = False

    def _far(self, value: np.ndarray, median: np.ndarray, history: NormHistory, streak: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore"):
            low = value < self.RATIO * median
            if not low.any():  # the usual case: skip the recent medians (a gather and a sort per step)
                return np.asarray(low)
            sudden = value < self.SUDDEN * history.median(self.RECENT, rows=low & (streak == 0))
        return np.asarray(low & ((streak > 0) | sudden))

    def _far_any_streak(
        self, value: np.ndarray, median: np.ndarray, history: NormHistory
    ) -> tuple[np.ndarray, np.ndarray]:
        # a row's recent median is the same number whichever other rows are asked for
        with np.errstate(invalid="ignore"):
            low = value < self.RATIO * median
            if not low.any():
                return low, low
            sudden = value < self.SUDDEN * history.median(self.RECENT, rows=np.asarray(low.any(axis=0)))
        return low & sudden, low

    def _within(self, value: np.ndarray, least: np.ndarray, greatest: np.ndarray) -> np.ndarray:
        # median <= greatest, so RATIO * median <= RATIO * greatest (rounding is monotonic)
        with np.errstate(invalid="ignore"):
            return np.asarray(value >= self.RATIO * greatest)

    def _message(self, names: tuple[str, ...], first: int, ratio: float) -> tuple[str, Figure]:
        text = "0×" if ratio == 0 else f"{ratio:.1e}×"
        message = (
            f"The gradient norm of {name_list(names)} collapsed to {text} its recent median at step {first}, "
            "so it has stopped learning (its input became zero, dead ReLUs, saturated activations, or a loss "
            "scaled to nothing); check the data, the activations and the learning rate."
        )
        return message, Figure("gradient norm / its recent median", float(ratio), "ratio", text)

"""Assembly of a distributed job's global step from its ranks' steps: the combination rules
(docs/protocol.md, "Distributed training"), pure functions of numpy arrays.

Each rank sends the norms of its local piece of every parameter; a global norm is the square
root of the sum of the squared local norms of the pieces that count (a replica counts once),
added in float64 so that no sum of squares overflows. ABSENT (no such tensor) is resolved on
the bits before any arithmetic; NaN and infinities are data and propagate.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..protocol import ABSENT_BITS, GRAD_STATUS, absent_mask
from .memory import base_digest

log = logging.getLogger("gradwatch.jobs")
#: The per-parameter metric a job's run stores for `rank_desync`: per parameter, how many ranks'
#: local gradient differs from rank 0's (0: in sync; ABSENT: the rule does not apply, the
#: parameter being sharded or the step not measured on rank 0).
DESYNC_METRIC = "desync_ranks"
#: Prefix of the scalars naming the desynchronised ranks: `dist/desync/r1` = the number of
#: parameters whose gradient on rank 1 differs from rank 0's, stored only where above 0.
DESYNC_PREFIX = "dist/desync/r"
#: The scalar every assembled step has: how many ranks contributed to it.
RANKS_SCALAR = "dist/ranks"

#: Tolerance of `rank_desync`: DDP's replicas hold the same reduced gradient, so their norms
#: agree to float rounding.
DESYNC_RTOL = 1e-5
DESYNC_ATOL = 1e-12

#: Per-parameter metrics taken from the lowest rank whose piece counts, not added.
_FROM_ONE_RANK = ("backward_passes", "grad_clear")
#: Scalars added over the ranks (the job's footprint).
_SUMMED = frozenset({"mem/params_bytes", "mem/grads_bytes", "mem/optimizer_bytes", "mem/zero_grad_bytes"})
#: Scalar prefixes (and keys) taken as the largest over the ranks (the tightest, slowest rank).
_MAX_PREFIXES = ("mem/cuda:", "time/", "hook/")
_MAX_KEYS = frozenset({"mem/rss_bytes"})


@dataclass
class RankStep:
    """One rank's stored step: its scalars, its per-parameter arrays (float32, or uint8 for
    grad_status) and, per parameter, whether its piece counts toward the global value."""

    rank: int
    time: float
    scalars: Mapping[str, float]
    arrays: Mapping[str, np.ndarray]
    counted: np.ndarray  # bool per parameter
    #: a DDP replica's `grad_digest` in place of its grad_norm and grad_status (protocol v2)
    digest: str | None = None


@dataclass
class Assembled:
    """The global step: what the job's run stores."""

    time: float
    scalars: dict[str, float] = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    ranks: tuple[int, ...] = ()

    def raw_arrays(self) -> dict[str, bytes]:
        """The arrays as the store keeps them: little-endian bytes."""
        return {m: np.ascontiguousarray(a).tobytes() for m, a in self.arrays.items()}


def _absent(count: int) -> np.ndarray:
    return np.full(count, ABSENT_BITS, dtype="<u4").view("<f4")


def global_norm(locals_: Sequence[np.ndarray], counted: Sequence[np.ndarray]) -> np.ndarray:
    """sqrt(sum of squared local norms) over the counted pieces, in float64, as float32.

    ABSENT where every counted piece is ABSENT (or none counts); NaN if any counted piece is
    NaN; inf if any is infinite and none NaN.
    """
    count = len(counted[0]) if counted else 0
    total = np.zeros(count, dtype=np.float64)
    seen = np.zeros(count, dtype=bool)
    for values, use in zip(locals_, counted):
        absent = absent_mask(values)
        take = use & ~absent
        v = values.astype(np.float64)
        total[take] += v[take] * v[take]
        seen |= take
    out = np.sqrt(total).astype("<f4")
    out[~seen] = _absent(int((~seen).sum()))
    return out


def from_lowest(values: Sequence[np.ndarray], counted: Sequence[np.ndarray]) -> np.ndarray:
    """Per parameter, the value of the lowest-ranked counted piece (pieces in rank order);
    ABSENT where no piece counts."""
    count = len(counted[0]) if counted else 0
    out = _absent(count).copy()
    todo = np.ones(count, dtype=bool)
    for v, use in zip(values, counted):
        take = todo & use
        out[take] = v[take]
        todo &= ~take
    return out


#: norms of what every rank holding a parameter has a piece of; every other norm is of optimizer state
EVERY_RANK_NORMS = frozenset({"grad_norm", "param_norm", "update_norm", "param_before_norm"})


def state_held_elsewhere(out: np.ndarray, locals_: Sequence[np.ndarray], counted: Sequence[np.ndarray]) -> None:
    """A piece that exists on one rank only counts once: where no counted piece has a value of a
    state norm (`out` ABSENT), the lowest-ranked piece that has one gives it, in place. A sharded
    optimizer (ZeroRedundancyOptimizer) keeps a replicated parameter's state on its owner rank only,
    while the parameter counts on rank 0."""
    missing = absent_mask(out)
    for values, use in zip(locals_, counted):
        take = missing & ~use & ~absent_mask(values)
        out[take] = values[take]
        missing &= ~take


def global_status(codes: Sequence[np.ndarray], counted: Sequence[np.ndarray]) -> np.ndarray:
    """none if every counted piece is none; else nonfinite if any is; else nonzero if any is;
    else zero. The codes are ordered (none < zero < nonzero < nonfinite): the largest."""
    count = len(counted[0]) if counted else 0
    out = np.zeros(count, dtype="u1")
    for c, use in zip(codes, counted):
        out = np.where(use, np.maximum(out, c), out).astype("u1")
    return out


def total_norm(grad_norm: np.ndarray) -> float:
    """`grad_norm_total` of a global grad_norm array, as the hook computes its own: sqrt of the
    sum of squares of the entries that are not ABSENT, in float64; so NaN if any entry is NaN,
    else inf if any is infinite."""
    v = grad_norm[~absent_mask(grad_norm)].astype(np.float64)
    return float(np.sqrt(np.sum(v * v)))


def _ratio(update: np.ndarray, before: np.ndarray) -> np.ndarray:
    """Global update_norm / global param_before_norm; ABSENT where either is."""
    absent = absent_mask(update) | absent_mask(before)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = (update.astype(np.float64) / before.astype(np.float64)).astype("<f4")
    out[absent] = _absent(int(absent.sum()))
    return out


def combine_scalars(pieces: Sequence[RankStep]) -> dict[str, float]:
    """Scalars by key family: memory of params, grads and optimizer state summed (left out
    where some rank did not send it, e.g. the optimizer's bytes from a rank that did not
    measure: a sum of fewer ranks would understate the job's footprint); the rank's own memory,
    `time/*` and `hook/*` the largest; every other key the lowest rank's."""
    out: dict[str, float] = {}
    for key in sorted({k for p in pieces for k in p.scalars}):
        values = [p.scalars[key] for p in pieces if key in p.scalars]
        if key in _SUMMED:
            if len(values) == len(pieces):
                out[key] = float(np.sum(values))
        elif key in _MAX_KEYS or key.startswith(_MAX_PREFIXES):
            out[key] = float(np.max(values))
        else:
            out[key] = float(values[0])
    return out


def _measured(piece: RankStep) -> bool:
    return piece.digest is not None or measured(piece.arrays)


def measured(arrays: Mapping[str, np.ndarray]) -> bool:
    """Whether a rank measured its step: it sent `grad_status` (or, from a hook that sends no
    status, `grad_norm`). An unmeasured step has the cheap facts only (docs/protocol.md)."""
    return GRAD_STATUS in arrays or "grad_norm" in arrays


def job_measured(pieces: Sequence[RankStep]) -> bool:
    """Whether the job's step is measured: every rank present that holds a counted piece
    measured it (a DDP rank whose pieces all count elsewhere need not). Otherwise the global
    norms and status of the pieces it holds are unknown, and the step is stored unmeasured."""
    holders = [p for p in pieces if p.counted.any()]
    return bool(holders) and all(measured(p.arrays) for p in holders)


def _is_gradient_metric(metric: str) -> bool:
    """What only a measured step has: the norms, the ratio of norms, the status."""
    return metric.endswith("_norm") or metric in ("update_ratio", GRAD_STATUS)


def combine(pieces: Sequence[RankStep]) -> Assembled:
    """The global step of the ranks' `pieces` (at least one, in rank order).

    An unmeasured job step (`job_measured`) has the cheap facts only: no norms, no status, no
    `grad_norm_total`, as an unmeasured single-process step."""
    pieces = sorted(pieces, key=lambda p: p.rank)
    result = Assembled(time=max(p.time for p in pieces), ranks=tuple(p.rank for p in pieces))
    result.scalars = combine_scalars(pieces)
    is_measured = job_measured(pieces)
    metrics = sorted({m for p in pieces for m in p.arrays if is_measured or not _is_gradient_metric(m)})
    for metric in metrics:
        having = [p for p in pieces if metric in p.arrays]
        values = [p.arrays[metric] for p in having]
        counted = [p.counted for p in having]
        if metric == GRAD_STATUS:
            result.arrays[metric] = global_status(values, counted)
        elif metric.endswith("_norm"):
            result.arrays[metric] = global_norm(values, counted)
            if metric not in EVERY_RANK_NORMS:
                state_held_elsewhere(result.arrays[metric], values, counted)
            unknown = _not_sent(pieces, metric)
            if unknown is not None:
                result.arrays[metric][unknown] = _absent(int(unknown.sum()))
        elif metric == "update_ratio":
            continue  # from the global norms below
        else:  # backward_passes, grad_clear, and any metric that is not a norm
            result.arrays[metric] = from_lowest(values, counted)
    if "update_ratio" in metrics:
        update, before = result.arrays.get("update_norm"), result.arrays.get("param_before_norm")
        if update is not None and before is not None:
            result.arrays["update_ratio"] = _ratio(update, before)
        else:  # a hook that sent no param_before_norm: the lowest counted rank's own ratio
            having = [p for p in pieces if "update_ratio" in p.arrays]
            result.arrays["update_ratio"] = from_lowest(
                [p.arrays["update_ratio"] for p in having], [p.counted for p in having]
            )
    signals_of_pieces(result.arrays)
    if not is_measured:
        result.scalars.pop("grad_norm_total", None)
    elif "grad_norm_total" in result.scalars and "grad_norm" in result.arrays:
        result.scalars["grad_norm_total"] = total_norm(result.arrays["grad_norm"])
    result.scalars[RANKS_SCALAR] = float(len(pieces))
    return result


#: The norms each optimizer signal is made of (the hook's signals.PIECE_NORMS), added over the
#: pieces as every norm is: the signal of the whole tensor is a ratio of the sums.
SIGNAL_NORMS = {
    "eps_share": ("eps_regime_norm", "eps_numel_norm"),
    "v_decoupling": ("signal_grad_norm", "v_hat_root_norm"),
    "momentum_cosine": ("grad_momentum_norm", "signal_grad_norm", "momentum_norm"),
}


def signals_of_pieces(arrays: dict[str, np.ndarray]) -> None:
    """The optimizer signals of the whole tensors, in place, from their global norms, where the
    ranks sent them (docs/protocol.md): eps_share = E² / N², v_decoupling = G² / V²,
    momentum_cosine = (S² − G² − M²) / (2 G M), in float64; ABSENT where a norm is. The norms
    themselves are the signals' wire form only: the job's step keeps the signals."""
    for signal, names in SIGNAL_NORMS.items():
        if not all(n in arrays for n in names):
            continue
        norms = [arrays[n] for n in names]
        absent = np.logical_or.reduce([absent_mask(n) for n in norms])
        x = [n.astype(np.float64) for n in norms]
        with np.errstate(divide="ignore", invalid="ignore"):
            if signal == "momentum_cosine":
                s, g, m = x
                value = (s * s - g * g - m * m) / (2 * g * m)
            else:
                value = x[0] * x[0] / (x[1] * x[1])
        out = value.astype("<f4")
        out[absent] = _absent(int(absent.sum()))
        arrays[signal] = out
    for name in {n for names in SIGNAL_NORMS.values() for n in names}:
        arrays.pop(name, None)


def _not_sent(pieces: Sequence[RankStep], metric: str) -> np.ndarray | None:
    """Where a norm of a measured step cannot be known: the parameters whose counted piece is on
    a rank that did not send `metric`. Their global norm is ABSENT rather than the sum of the
    other pieces, which would be too small."""
    unknown = np.zeros(len(pieces[0].counted), dtype=bool)
    for piece in pieces:
        if metric not in piece.arrays:
            unknown |= piece.counted
    return unknown if unknown.any() else None


def _same(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per parameter, whether two local norms agree: both ABSENT, both NaN, the same infinity,
    or finite and within DESYNC_RTOL/DESYNC_ATOL of each other."""
    absent_a, absent_b = absent_mask(a), absent_mask(b)
    x, y = a.astype(np.float64), b.astype(np.float64)
    with np.errstate(invalid="ignore"):
        close = np.isfinite(x) & np.isfinite(y) & (np.abs(x - y) <= DESYNC_ATOL + DESYNC_RTOL * np.abs(y))
    both_nan = np.isnan(x) & np.isnan(y) & ~absent_a & ~absent_b
    same_inf = np.isinf(x) & (x == y)
    same: np.ndarray = np.where(absent_a | absent_b, absent_a & absent_b, close | both_nan | same_inf)
    return same


def _bitwise_equal(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def desync(pieces: Sequence[RankStep], replicated: np.ndarray) -> tuple[np.ndarray, dict[int, int]] | None:
    """For `rank_desync`: per parameter, how many ranks' local gradient differs from rank 0's
    (grad_norm beyond tolerance, or grad_status), over the `replicated` parameters (the full
    tensor on every rank: DDP); and per differing rank, on how many parameters. Only the ranks
    that measured the step are compared. None where the rule does not apply: no replicated
    parameter, rank 0 absent or not measured, one rank only."""
    pieces = sorted(pieces, key=lambda p: p.rank)
    if not replicated.any() or len(pieces) < 2 or pieces[0].rank != 0 or not measured(pieces[0].arrays):
        return None
    base = pieces[0]
    counts = np.zeros(len(replicated), dtype=np.float64)
    ranks: dict[int, int] = {}
    own: str | None = None
    for other in pieces[1:]:
        if not _measured(other):
            continue
        differs = np.zeros(len(replicated), dtype=bool)
        if other.digest is not None and not measured(other.arrays):
            # a replica's digest: the same bits as rank 0's, in sync; one that differs is
            # assembled only once its arrays came (JobMemory.waits_on), or without the rank
            own = own or base_digest(base.arrays)
            if other.digest != own:
                log.warning("rank %d's grad_digest differs from rank 0's and its arrays never came", other.rank)
            continue
        # replicas in step send the same bits (what _same finds the same: the common case, cheap)
        if "grad_norm" in base.arrays and "grad_norm" in other.arrays:
            if not _bitwise_equal(other.arrays["grad_norm"], base.arrays["grad_norm"]):
                differs |= ~_same(other.arrays["grad_norm"], base.arrays["grad_norm"])
        if GRAD_STATUS in base.arrays and GRAD_STATUS in other.arrays:
            if not _bitwise_equal(other.arrays[GRAD_STATUS], base.arrays[GRAD_STATUS]):
                differs |= other.arrays[GRAD_STATUS] != base.arrays[GRAD_STATUS]
        differs &= replicated
        counts += differs
        if differs.any():
            ranks[other.rank] = int(differs.sum())
    out = counts.astype("<f4")
    out[~replicated] = _absent(int((~replicated).sum()))
    return out, ranks


def with_desync(step: Assembled, pieces: Sequence[RankStep], replicated: np.ndarray) -> Assembled:
    """`step` with the `rank_desync` evidence added (DESYNC_METRIC, DESYNC_PREFIX scalars); none
    on an unmeasured step, whose gradients are not judged."""
    found = desync(pieces, replicated) if measured(step.arrays) else None
    if found is not None:
        counts, ranks = found
        step.arrays[DESYNC_METRIC] = counts
        for rank, n in ranks.items():
            step.scalars[f"{DESYNC_PREFIX}{rank}"] = float(n)
    return step

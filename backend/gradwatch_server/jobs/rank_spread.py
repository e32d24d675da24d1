"""The spread of a per-rank scalar across a big job's ranks (GET /api/runs/{job}/ranks/spread):
per step, its quantiles across ranks (min, p5, p50, p95, max), and the outlier ranks by number.
A line per rank stops telling anything beyond a few ranks; bands and a list of the ranks that
stand apart do (docs/distributed.md, The Ranks section)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: The quantiles drawn as bands, in percent.
QUANTILES = (0.0, 5.0, 50.0, 95.0, 100.0)
#: Outlier ranks listed at most (the farthest from the others first).
MAX_OUTLIERS = 8
#: A rank is an outlier when its median over the window is this many scaled median absolute
#: deviations from the median of the ranks' medians, and OUTLIER_MIN_GAP of it (relative) away:
#: ranks that are alike (DDP's step times) have a deviation near 0, and a 1% wobble is no outlier.
OUTLIER_MADS = 5.0
OUTLIER_MIN_GAP = 0.05


@dataclass(frozen=True)
class Outlier:
    rank: int
    median: float  # the rank's median over the window
    others: float  # the median of all ranks' medians
    high: bool  # above the others (slower, larger) or below


@dataclass(frozen=True)
class Spread:
    ranks: int  # ranks with at least one finite value in the window
    steps: list[int]
    quantiles: list[list[float | None]]  # per QUANTILES entry, one value per step (None: no finite value)
    outliers: list[Outlier]


def spread(rank: np.ndarray, step: np.ndarray, value: np.ndarray) -> Spread:
    """The spread of (rank, step, value) rows: quantiles per step over the finite values of that
    step's ranks, and the ranks whose window median stands apart (`OUTLIER_MADS`)."""
    finite = np.isfinite(value)
    steps = np.unique(step)
    quantiles: list[list[float | None]] = [[] for _ in QUANTILES]
    order = np.argsort(step, kind="stable")
    bounds = np.searchsorted(step[order], steps, side="left").tolist() + [len(order)]
    for i in range(len(steps)):
        at = order[bounds[i] : bounds[i + 1]]
        v = value[at][finite[at]]
        q = np.percentile(v, QUANTILES).tolist() if len(v) else [None] * len(QUANTILES)
        for k, x in enumerate(q):
            quantiles[k].append(x)
    medians = {int(r): float(np.median(value[(rank == r) & finite])) for r in np.unique(rank[finite])}
    return Spread(ranks=len(medians), steps=[int(s) for s in steps], quantiles=quantiles, outliers=outliers(medians))


def outliers(medians: dict[int, float]) -> list[Outlier]:
    """The ranks whose median stands apart from the others' (the farthest first, MAX_OUTLIERS)."""
    if len(medians) < 3:
        return []
    m = np.array(list(medians.values()))
    center = float(np.median(m))
    mad = 1.4826 * float(np.median(np.abs(m - center)))
    gap = max(OUTLIER_MADS * mad, OUTLIER_MIN_GAP * abs(center))
    far = sorted(
        ((abs(v - center), r, v) for r, v in medians.items() if abs(v - center) > gap), key=lambda t: (-t[0], t[1])
    )
    return [Outlier(rank=r, median=v, others=center, high=v > center) for _, r, v in far[:MAX_OUTLIERS]]

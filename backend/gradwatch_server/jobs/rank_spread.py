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

    def _with_outliers(self, rank: np.ndarray, value: np.ndarray) -> Spread:
        """This spread with `ranks` and `outliers` judged on the ranks' medians of (rank, value)
        rows: each rank's median over its finite values, computed per rank in one sort."""
        finite = np.isfinite(value)
        r, v = rank[finite], value[finite]
        order = np.lexsort((v, r))
        r, v = r[order], v[order]
        ids, start, count = np.unique(r, return_index=True, return_counts=True)
        mid = start + (count - 1) // 2
        medians = (v[mid] + v[start + count // 2]) / 2
        found = dict(zip(ids.tolist(), medians.tolist(), strict=True))
        return Spread(ranks=len(found), steps=self.steps, quantiles=self.quantiles, outliers=outliers(found))


def step_quantiles(finite: np.ndarray) -> list[float | None]:
    """QUANTILES of one step's finite values across its ranks (None each: no value)."""
    return np.percentile(finite, QUANTILES).tolist() if len(finite) else [None] * len(QUANTILES)


def spread(steps: np.ndarray, quantiles: np.ndarray, rank: np.ndarray, value: np.ndarray) -> Spread:
    """The spread from quantiles stored per step (`quantiles[k]`: QUANTILES[k] at each of
    `steps`, NaN: no finite value), the outliers from the ranks' (rank, value) rows."""
    q = [[None if not np.isfinite(x) else float(x) for x in row] for row in quantiles.tolist()]
    return Spread(ranks=0, steps=[int(s) for s in steps], quantiles=q, outliers=[])._with_outliers(rank, value)


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

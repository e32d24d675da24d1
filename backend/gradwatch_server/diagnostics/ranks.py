"""Distributed jobs: DDP replicas whose synchronised gradients differ across ranks."""

from __future__ import annotations

import numpy as np

from ..jobs.assemble import DESYNC_PREFIX
from .check import Check
from .data import RunContext, StepView
from .finding import Figure, Finding, name_list, plural


class RankDesync(Check):
    """`rank_desync` (error): after DDP's synchronisation, a rank's gradient differs from rank 0's.

    Evidence, written by the assembly of a job's step (jobs/assemble.py, where every rank's local
    norms are at hand): per parameter whose piece is the full tensor on every rank (a DDP
    replica), the number of ranks whose local `grad_norm` differs from rank 0's beyond float
    tolerance (relative 1e-5, absolute 1e-12) or whose `grad_status` differs (`desync_ranks`),
    and per such rank the scalar `dist/desync/rRANK`. Replicas hold the same all-reduced
    gradient, so any difference means a step without the reduction. Accumulation under
    `no_sync()` reduces on the last micro-batch, before the step: it never shows here (it is
    `grad_accumulation`). The finding names the parameters, the ranks and the first step; its
    figure is the number of ranks.
    """

    code = "rank_desync"

    def __init__(self) -> None:
        super().__init__()
        self._params: set[str] = set()
        self._ranks: set[int] = set()

    def observe(self, run: RunContext, step: StepView) -> None:
        if step.desync is None:
            return
        bad = np.nan_to_num(step.desync) > 0
        ranks = {int(k.removeprefix(DESYNC_PREFIX)) for k, v in step.scalars.items() if _rank_key(k) and v > 0}
        if not bad.any() and not ranks:
            return
        names = self._params | set(run.names(bad))
        if names == self._params and ranks <= self._ranks and self.finding is not None:
            return
        self._params, self._ranks = names, self._ranks | ranks
        ordered = tuple(n for n in run.params if n in names)
        first = self.finding.first_step if self.finding is not None else step.step
        who = sorted(self._ranks)
        ranks_text = f"rank {who[0]}" if len(who) == 1 else "ranks " + name_list([str(r) for r in who], shown=8)
        message = (
            f"The gradients of {ranks_text} differ from rank 0's after DDP's synchronisation, from step "
            f"{first}, in {name_list(ordered)}: the ranks no longer train the same model. Usual causes: "
            "optimizer.step() after a backward inside no_sync() (accumulate under no_sync() only for "
            "the micro-batches before the last), DDP(static_graph=True) with a graph that changes "
            "between steps (so a parameter is not reduced), or a rank running different code or data "
            "paths (find_unused_parameters, a rank-dependent branch)."
        )
        self.finding = Finding(
            self.code,
            "error",
            message,
            ordered,
            first,
            Figure("ranks out of sync", float(len(who)), "ranks", plural(len(who), "rank"), step.step),
        )


def _rank_key(key: str) -> bool:
    return key.startswith(DESYNC_PREFIX) and key.removeprefix(DESYNC_PREFIX).isdigit()

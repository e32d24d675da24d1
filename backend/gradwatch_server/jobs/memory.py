"""What the process that assembles a distributed job keeps of it between assemblies: the ranks'
steps its connections stored, and each rank's parameter list (which pieces count, which are the
whole tensor), so that an assembly reads neither back from the store."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..protocol import array_dtype
from .hearing import Hearing

if TYPE_CHECKING:  # the store imports this module: its records are types here only
    from ..store.records import StepData

#: Most bytes of the ranks' pieces a job's memory keeps (1,024 ranks of 700 tensors: about 12
#: steps); past it a rank's step is not kept, and its assembly reads the rank's stored rows back,
#: as after a restart. The oldest steps, which the assembly needs first, stay.
MEMORY_BYTES = 256 * 2**20


@dataclass(frozen=True)
class _Sent:
    """One rank's step as its connection stored it, arrays decoded once (views of its bytes)."""

    time: float
    scalars: dict[str, float]
    arrays: dict[str, np.ndarray]
    size: int  # bytes of its arrays


class JobMemory:
    """What the process that assembles a job keeps between its assemblies, so that an assembly
    reads back neither the ranks' parameter lists (per rank's run: which pieces count, which are
    the full tensor) nor the steps the ranks' connections stored through this process (the
    ranks' stored rows are read only for what it does not hold: steps stored before a restart,
    through another worker, or beyond MEMORY_STEPS). Shared by the event loop, which adds
    steps, and the assembly's thread: a lock guards the steps."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._steps: dict[int, dict[int, _Sent]] = {}  # step -> rank -> its piece
        self._bytes = 0
        self.counted: dict[str, np.ndarray] = {}  # rank's run id -> whether each piece counts
        self.full: dict[str, np.ndarray] = {}  # rank's run id -> whether each piece is the whole tensor
        #: the rank runs `full` was last combined over, and which parameters are whole on all of them
        self.replicated: tuple[tuple[str, ...], np.ndarray | None] | None = None
        self.pruned_through = 0  # the ranks' per-parameter rows up to here are pruned (`_prune`)
        self.heard = Hearing()  # what this process hears of the ranks before the store does

    def add(self, rank: int, batch: Sequence[StepData]) -> None:
        """A rank's connection stored `batch` (committed): keep its pieces until assembled."""
        with self._lock:
            for d in batch:
                size = sum(len(raw) for raw in d.arrays.values())
                if self._bytes + size > MEMORY_BYTES:
                    return
                arrays = {m: np.frombuffer(raw, dtype=array_dtype(m)) for m, raw in d.arrays.items()}
                old = self._steps.setdefault(d.step, {}).get(rank)
                self._steps[d.step][rank] = _Sent(d.time, dict(d.scalars), arrays, size)
                self._bytes += size - (0 if old is None else old.size)

    def take(self, rank: int, step: int) -> _Sent | None:
        with self._lock:
            return self._steps.get(step, {}).get(rank)

    def forget_through(self, step: int) -> None:
        """Steps up to `step` are assembled: their pieces are not needed again (a partial step
        completed later reads its ranks' stored rows)."""
        with self._lock:
            for s in [s for s in self._steps if s <= step]:
                self._bytes -= sum(sent.size for sent in self._steps.pop(s).values())

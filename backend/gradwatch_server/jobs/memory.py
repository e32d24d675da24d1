"""What the process that assembles a distributed job keeps of it between assemblies: the ranks'
steps its connections stored, and each rank's parameter list (which pieces count, which are the
whole tensor), so that an assembly reads neither back from the store."""

from __future__ import annotations

import threading
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..protocol import GRAD_STATUS, array_dtype, grad_digest
from .hearing import Hearing

if TYPE_CHECKING:  # the store imports this module: its records are types here only
    from ..store.records import StepData, StoredStep

#: Most bytes of the ranks' pieces a job's memory keeps (1,024 ranks of 700 tensors: about 12
#: steps); past it a rank's step is not kept, and its assembly reads the rank's stored rows back,
#: as after a restart. The oldest steps, which the assembly needs first, stay.
MEMORY_BYTES = 256 * 2**20
#: How long a replica that closed (or is lost) is waited for after the server asked it for the
#: arrays behind its `grad_digest` (the answer follows its close when the ask came after it):
#: within the hook's own close timeout (5 s).
ASK_WAIT_S = 4.0


@dataclass(frozen=True)
class _Sent:
    """One rank's step as its connection stored it, arrays decoded once (views of its bytes)."""

    time: float
    scalars: dict[str, float]
    arrays: dict[str, np.ndarray]
    size: int  # bytes of its arrays
    digest: str | None = None  # a replica's grad_digest in place of its grad_norm and grad_status


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
        #: whether the job's ranks have steps stored before migration 0010 (None: not asked yet),
        #: and the run ids of its ranks that said hello, as of the last assembly
        self.legacy: bool | None = None
        self.rank_runs: list[str] = []
        self.heard = Hearing()  # what this process hears of the ranks before the store does
        #: replicas' steps whose digest differs from rank 0's: (rank, step) -> asked for their
        #: arrays already; `asks` are those the assembler has yet to send (`waits_on`)
        self.wanted: dict[tuple[int, int], float] = {}
        self.asks: list[tuple[int, int]] = []

    def add(self, rank: int, batch: Sequence[StepData]) -> None:
        """A rank's connection stored `batch` (committed): keep its pieces until assembled."""
        with self._lock:
            for d in batch:
                size = sum(len(raw) for raw in d.arrays.values())
                if self._bytes + size > MEMORY_BYTES and not d.resent:  # a step held back takes its arrays
                    return
                arrays = {m: np.frombuffer(raw, dtype=array_dtype(m)) for m, raw in d.arrays.items()}
                old = self._steps.setdefault(d.step, {}).get(rank)
                if d.resent:  # the arrays asked of a replica: added to its step
                    if old is None or old.digest is None:  # assembled, not kept, or the flight recorder's
                        continue
                    # none: the replica no longer holds them, the step is judged without it
                    digest = old.digest if arrays else None
                    sent = _Sent(old.time, old.scalars, {**old.arrays, **arrays}, old.size + size, digest)
                else:
                    sent = _Sent(d.time, dict(d.scalars), arrays, size, d.digest)
                self._steps[d.step][rank] = sent
                self._bytes += sent.size - (0 if old is None else old.size)

    def absent(self, step: int, ranks: Collection[int]) -> list[int]:
        """Those of `ranks` whose piece of `step` is not kept here."""
        with self._lock:
            pieces = self._steps.get(step, {})
            return [r for r in ranks if r not in pieces]

    def has_digest(self, step: int) -> bool:
        """Whether a piece kept of `step` is a replica's digest."""
        with self._lock:
            return any(p.digest is not None for p in self._steps.get(step, {}).values())

    def recall(self, rank: int, record: StoredStep) -> None:
        """Keep a rank's step read back from the store (stored before a restart, or through another
        worker), so that a digest comparison sees it (`waits_on`); within the bound, as `add`."""
        with self._lock:
            size = sum(a.nbytes for a in record.arrays.values())
            if rank in self._steps.get(record.step, {}) or self._bytes + size > MEMORY_BYTES:
                return
            arrays = dict(record.arrays)
            digest = None if _has_grads(arrays) else record.digest
            self._steps.setdefault(record.step, {})[rank] = _Sent(
                record.time, dict(record.scalars), arrays, size, digest
            )
            self._bytes += size

    def waits_on(self, step: int, gone: Collection[int], now: float | None = None) -> bool:
        """Whether `step` waits for a replica's arrays: a rank sent its `grad_digest`, and it
        differs from that of rank 0's arrays, so `rank_desync` needs the arrays it stands for.
        Each such (rank, step) is asked for once (`asks`); a rank `gone` (closed, lost) is
        waited for ASK_WAIT_S after the ask (its answer may follow its close), then not."""
        now = time.monotonic() if now is None else now
        with self._lock:
            pieces = self._steps.get(step, {})
            base = pieces.get(0)
            if base is None or base.digest is not None or not any(p.digest for p in pieces.values()):
                return False
            own = base_digest(base.arrays)
            waiting = False
            for rank, piece in pieces.items():
                if piece.digest is None or piece.digest == own or _has_grads(piece.arrays):
                    continue
                asked = self.wanted.get((rank, step))
                if rank in gone and (asked is None or now - asked > ASK_WAIT_S):
                    continue
                waiting = True
                if asked is None:
                    self.wanted[(rank, step)] = now
                    self.asks.append((rank, step))
            return waiting

    def owed(self, rank: int, now: float | None = None) -> list[int]:
        """The steps `rank` sent a `grad_digest` for that no comparison has settled: rank 0's
        piece of the step is not here yet, or differs and the arrays have not come. A closing
        replica is asked for them all before its close is acknowledged (its ring answers; rank
        0's piece may come after the rank has gone); each is marked asked (`wanted`), so that
        the assembly waits for the answer rather than asking again (`waits_on`)."""
        now = time.monotonic() if now is None else now
        out: list[int] = []
        with self._lock:
            for step, pieces in self._steps.items():
                piece, base = pieces.get(rank), pieces.get(0)
                if piece is None or piece.digest is None or _has_grads(piece.arrays):
                    continue
                if base is not None and base.digest is None and base_digest(base.arrays) == piece.digest:
                    continue  # in sync with rank 0's: nothing owed
                self.wanted[(rank, step)] = now
                out.append(step)
        return sorted(out)

    def take_asks(self) -> list[tuple[int, int]]:
        with self._lock:
            asks, self.asks = self.asks, []
            return asks

    def digest(self, rank: int, step: int) -> str | None:
        """The `grad_digest` rank sent for step (None: none, or not kept here)."""
        sent = self.take(rank, step)
        return None if sent is None or _has_grads(sent.arrays) else sent.digest

    def take(self, rank: int, step: int) -> _Sent | None:
        with self._lock:
            return self._steps.get(step, {}).get(rank)

    def forget_through(self, step: int) -> None:
        """Steps up to `step` are assembled: their pieces are not needed again (a partial step
        completed later reads its ranks' stored rows)."""
        with self._lock:
            for s in [s for s in self._steps if s <= step]:
                self._bytes -= sum(sent.size for sent in self._steps.pop(s).values())
            self.wanted = {key: t for key, t in self.wanted.items() if key[1] > step}


def _has_grads(arrays: Mapping[str, np.ndarray]) -> bool:
    return "grad_norm" in arrays or GRAD_STATUS in arrays


def base_digest(arrays: Mapping[str, np.ndarray]) -> str:
    """The `grad_digest` of a rank's arrays, computed as a replica's hook does."""
    norm, status = arrays.get("grad_norm"), arrays.get(GRAD_STATUS)
    return grad_digest(
        None if norm is None else np.ascontiguousarray(norm).tobytes(),
        None if status is None else np.ascontiguousarray(status).tobytes(),
    )

"""The steps in the open smallest block of each run the store wrote lately, kept in memory.

Storing a batch closes the blocks it completes, and the smallest summarize raw steps that earlier
batches mostly stored: computing them from these tails saves reading those steps back. A tail is
trusted only while the run's (stored steps, last step, last seq) in the database still match it
(read under the run's lock); any other write, a failed transaction or a deleted run makes it match
nothing, and the store reads the database instead. It covers only steps from its start on.

A tail also keeps, per block size but the largest, the closed blocks inside the open block of the
next size (`Closed`): a closing larger block is made from them, not from the smaller blocks read
back from the database. Why: docs/design.md, Tails.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from .blocks import SIZES, closed

#: The block size whose raw steps a tail holds.
SIZE = SIZES[0]


class WrittenStep(Protocol):
    """A step message as the store wrote it (a store.StepData): what a tail keeps. (Not the
    protocol's `Step` model, nor a `StoredStep` read back.)"""

    @property
    def step(self) -> int: ...

    @property
    def scalars(self) -> Mapping[str, float]: ...

    @property
    def arrays(self) -> Mapping[str, bytes]: ...


#: What a run's row says of its steps when a tail is kept: (stored steps, last step, last seq).
#: The last seq tells a tail from one kept before steps were rewritten in place (a job's partial
#: steps re-assembled: store/jobs.py), which leaves the same count and last step.
Token = tuple[int | None, ...]


#: A stored block as written: (first stored step, stored steps, its record per parameter: one
#: row of blocks.RECORD or blocks.SCALAR_RECORD, every part of the block joined).
BlockRow = tuple[int, int, np.ndarray]

#: Blocks of one size, per series (kind, name), per block number.
BlockRows = dict[tuple[str, str], dict[int, BlockRow]]

#: What a write computed, per block size: (the block numbers recomputed, the blocks stored of
#: them; a series without stored steps in a block has none).
Computed = dict[int, tuple[list[int], BlockRows]]


@dataclass(frozen=True)
class Closed:
    """The closed blocks of one size in the open block of the next size: every stored one
    numbered from `start` on (up to the last closed one) is in `rows`."""

    start: int
    rows: BlockRows


@dataclass(frozen=True)
class Tail:
    token: Token  # the run's Token when it was kept
    #: first step of the open block: every stored step from here on is in `steps` (None: the
    #: open block holds steps not in memory; only `closed` is kept)
    start: int | None
    steps: tuple[WrittenStep, ...]
    closed: Mapping[int, Closed] = field(default_factory=dict)  # per size (all but the largest)


def next_tail(
    tail: Tail | None,
    new: Sequence[WrittenStep],
    before: int | None,
    after: int | None,
    token: Token,
    computed: Computed | None = None,
    held: Mapping[int, Closed] | None = None,
) -> Tail | None:
    """The tail after storing `new` (the run's last step going from `before` to `after`), given
    the tail that matched before it and covered the new steps (None: none did), the blocks the
    write `computed` and the closed ones kept before it that matched (`held`)."""
    if after is None:
        return Tail(token, 0, ())
    closed_now = next_closed(held, computed or {}, before, after)
    start = after // SIZE * SIZE
    if tail is None and before is not None and start <= before:
        # the open block holds steps stored earlier that are not in memory: only blocks are kept
        return Tail(token, None, (), closed_now)
    kept = (tail.steps if tail is not None else ()) + tuple(new)
    return Tail(token, start, tuple(s for s in kept if s.step >= start), closed_now)


def next_closed(
    held: Mapping[int, Closed] | None, computed: Computed, before: int | None, after: int
) -> dict[int, Closed]:
    """The closed blocks to keep after a write (the run's last step going from `before` to
    `after`) that computed `computed`, given those kept before it (None: they did not match).

    Without them, the blocks of a size numbered from `closed(size, before)` on are still known:
    none of them was stored before the write (every stored step was at most `before`), and the
    write computed each of them that closed (blocks.dirty: the ones its steps landed in, and the
    one holding `before`; the others in between hold no step)."""
    out = {}
    for size, larger in zip(SIZES, SIZES[1:]):
        old = None if held is None else held.get(size)
        start = old.start if old is not None else closed(size, before)
        numbers, made = computed.get(size, ([], {}))
        low = after // larger * (larger // size)  # the open larger block's first block of `size`
        redone = set(numbers)
        rows: BlockRows = {}
        for key, mine in old.rows.items() if old is not None else ():
            kept = {n: row for n, row in mine.items() if n >= low and n not in redone}
            if kept:
                rows[key] = kept
        for key, mine in made.items():
            kept = {n: row for n, row in mine.items() if n >= low}
            if kept:
                rows.setdefault(key, {}).update(kept)
        out[size] = Closed(max(start, low), rows)
    return out


def covers(tail: Tail | None, new: Iterable[WrittenStep]) -> bool:
    """Whether `tail` holds every stored step of the open block and those `new` steps are in it
    or after it."""
    if tail is None or tail.start is None:
        return False
    start = tail.start
    return all(s.step >= start for s in new)


def tail_nbytes(tail: Tail) -> int:
    """About the memory `tail` holds: its steps' arrays and its closed blocks' records."""
    steps = sum(len(a) for s in tail.steps for a in s.arrays.values())
    blocks = sum(
        row[2].nbytes for level in tail.closed.values() for rows in level.rows.values() for row in rows.values()
    )
    return steps + blocks


class Tails:
    """The tails of the last `capacity` runs written, in at most `budget` bytes (the latest
    always kept): a server that writes many runs of many parameters at once (a large job's
    ranks) would otherwise hold several megabytes a run; safe to share between threads."""

    def __init__(self, capacity: int = 256, budget: int = 256 << 20) -> None:
        self._capacity, self._budget = capacity, budget
        self._tails: OrderedDict[str, tuple[Tail, int]] = OrderedDict()
        self._nbytes = 0
        self._lock = threading.Lock()

    def get(self, run_id: str, token: Token) -> Tail | None:
        """The run's tail if it is what the database holds now (`token`), else None."""
        if token[0] == 0:
            return Tail(token, 0, ())  # nothing stored: nothing to read back
        with self._lock:
            kept = self._tails.get(run_id)
        return kept[0] if kept is not None and kept[0].token == token else None

    def keep(self, run_id: str, tail: Tail | None) -> None:
        """Remember `tail` (None: forget the run's) once its write has committed."""
        size = 0 if tail is None else tail_nbytes(tail)
        with self._lock:
            old = self._tails.pop(run_id, None)
            if old is not None:
                self._nbytes -= old[1]
            if tail is not None:
                self._tails[run_id] = (tail, size)
                self._nbytes += size
                while len(self._tails) > 1 and (len(self._tails) > self._capacity or self._nbytes > self._budget):
                    self._nbytes -= self._tails.popitem(last=False)[1][1]

    @property
    def nbytes(self) -> int:
        """What the kept tails hold (`tail_nbytes`)."""
        return self._nbytes

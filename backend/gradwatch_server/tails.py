"""The steps in the open smallest block of each run the store wrote lately, kept in memory.

Storing a batch closes the blocks it completes, and the smallest summarize raw steps that earlier
batches mostly stored: computing them from these tails saves reading those steps back. A tail is
trusted only while the run's (stored steps, last step, last seq) in the database still match it
(read under the run's lock); any other write, a failed transaction or a deleted run makes it match
nothing, and the store reads the database instead. It covers only steps from its start on.
Why: docs/design.md, Tails.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from .blocks import SIZES

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


@dataclass(frozen=True)
class Tail:
    token: Token  # the run's Token when it was kept
    start: int  # first step of the open block: every stored step from here on is in `steps`
    steps: tuple[WrittenStep, ...]


def next_tail(
    tail: Tail | None, new: Sequence[WrittenStep], before: int | None, after: int | None, token: Token
) -> Tail | None:
    """The tail after storing `new` (the run's last step going from `before` to `after`), given
    the tail that matched before it (None: none did, or it did not cover the new steps)."""
    if after is None:
        return Tail(token, 0, ())
    start = after // SIZE * SIZE
    if tail is None and before is not None and start <= before:
        return None  # the open block holds steps stored earlier that are not in memory
    kept = (tail.steps if tail is not None else ()) + tuple(new)
    return Tail(token, start, tuple(s for s in kept if s.step >= start))


def covers(tail: Tail | None, new: Iterable[WrittenStep]) -> bool:
    return tail is not None and all(s.step >= tail.start for s in new)


class Tails:
    """The tails of the last `capacity` runs written; safe to share between threads."""

    def __init__(self, capacity: int = 256) -> None:
        self._capacity = capacity
        self._tails: OrderedDict[str, Tail] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, run_id: str, token: Token) -> Tail | None:
        """The run's tail if it is what the database holds now (`token`), else None."""
        if token[0] == 0:
            return Tail(token, 0, ())  # nothing stored: nothing to read back
        with self._lock:
            tail = self._tails.get(run_id)
        return tail if tail is not None and tail.token == token else None

    def keep(self, run_id: str, tail: Tail | None) -> None:
        """Remember `tail` (None: forget the run's) once its write has committed."""
        with self._lock:
            self._tails.pop(run_id, None)
            if tail is not None:
                self._tails[run_id] = tail
                while len(self._tails) > self._capacity:
                    self._tails.popitem(last=False)

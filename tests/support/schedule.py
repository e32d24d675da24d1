"""The order in which `make test`'s parallel tier hands test modules to its workers: the
longest first, by each module's recorded seconds (tests/durations.json).

`--dist loadfile` gives a worker a whole module at a time, in collection order once xdist's own
reordering (by number of tests) is off (`--no-loadscope-reorder`). Ordered by count, the modules
of one or two long tests (an example's training run, a torchrun job) came last, and one worker
ran them while the other had nothing left to do. Longest first, what is left at the end is short,
so the workers finish close together. A module the file does not know (a new one) counts as
`UNKNOWN_S`, ahead of the short ones. The figures only order the modules: a stale file makes the
run less even, never wrong.

Record them again (the seconds each module's tests took, setup and teardown included) with
`pytest ... --record-durations=tests/durations.json`, e.g. with the parallel tier's command of
docs/development.md.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

DURATIONS = Path(__file__).resolve().parents[1] / "durations.json"
UNKNOWN_S = 20.0


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def longest_first(items: list[pytest.Item], durations: dict[str, float]) -> None:
    """Reorder `items` in place: by module, the longest recorded module first; within a module,
    the tests keep their order."""
    first_seen: dict[str, int] = {}
    for item in items:
        first_seen.setdefault(module_of(item.nodeid), len(first_seen))
    items.sort(
        key=lambda item: (
            -durations.get(module_of(item.nodeid), UNKNOWN_S),
            first_seen[module_of(item.nodeid)],
        )
    )


def load(path: Path = DURATIONS) -> dict[str, float]:
    return json.loads(path.read_text()) if path.exists() else {}


class Recorder:
    """`--record-durations=PATH`: the seconds each module's tests took (setup, call and teardown),
    written as JSON at the end of the session (under xdist, by the controller, which gets every
    worker's reports)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        module = module_of(report.nodeid)
        self.seconds[module] = self.seconds.get(module, 0.0) + report.duration

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if hasattr(session.config, "workerinput"):  # an xdist worker: the controller writes
            return
        ordered = dict(sorted(((m, round(s, 1)) for m, s in self.seconds.items()), key=lambda kv: -kv[1]))
        self.path.write_text(json.dumps(ordered, indent=0) + "\n")

"""A distributed job's steps read back from a real `Store`, for the tests of the store."""

from __future__ import annotations

from gradwatch_server.store import Store


def partial_steps(store: Store, job: str) -> list[tuple[int, list[int]]]:
    """The job's steps stored without some rank, by step: (step, missing ranks), from the ranges
    the store serves (`Store.partial_ranges`) over the steps it holds (`Store.iter_steps`)."""
    ranges = store.partial_ranges(job)
    if not ranges:
        return []
    stored = [s.step for chunk in store.iter_steps(job, with_scalars=False, metrics=()) for s in chunk]
    return [(step, list(r.missing)) for r in ranges for step in stored if r.first <= step <= r.last]

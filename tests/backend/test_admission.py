"""A crowd of one job's rank hellos opened in one transaction (store/admission.py, and
jobs/admission.py's batches through a real connection): each hello gets what opening it alone
gives, a refused one harms none of its batch, and a rank sent twice is one run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gradwatch_server.protocol import Hello, validate_message
from gradwatch_server.store import OpenedRank, ParamsMismatch, open_store
from support.asgi import in_process_server
from support.wiremsg import rank_hello

pytestmark = pytest.mark.unit


def parsed(message: dict[str, Any]) -> Hello:
    hello = validate_message(message)
    assert isinstance(hello, Hello)
    return hello


def test_a_batch_opens_each_rank_as_alone_and_refuses_only_the_bad_one(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'x.db'}")
    try:
        hellos = [parsed(rank_hello("j", r, 4, counted=[r == 0, r == 0])) for r in range(4)]
        stray = parsed(rank_hello("j", 3, 4, ("fc.weight", "other.bias")))
        results = store.open_ranks([*hellos[:3], stray, hellos[1]])
        assert [type(r) for r in results] == [OpenedRank, OpenedRank, OpenedRank, ParamsMismatch, OpenedRank]
        assert "'other.bias' is not in the job" in str(results[3])
        first, again = results[1], results[4]
        assert isinstance(first, OpenedRank) and isinstance(again, OpenedRank)
        assert first.rank.created and not again.rank.created  # rank 1 twice: one run
        assert [r.job_created for r in results if isinstance(r, OpenedRank)] == [True, False, False, False]
        assert [r.id for r in store.rank_runs("j")] == ["j.r0", "j.r1", "j.r2"]
        for r in range(3):  # each rank's pieces, as its hello gave them (the oracle: the hello)
            assert [p.counted for p in store.get_params(f"j.r{r}")] == [r == 0, r == 0]
        (last,) = store.open_ranks([hellos[3]])  # a later batch: rank 3 joins the job
        assert isinstance(last, OpenedRank) and not last.job_created and last.rank.created
        assert last.job.param_count == 2 and len(store.rank_runs("j")) == 4
    finally:
        store.close()


def test_a_crowd_of_hellos_through_the_server_is_welcomed_together(tmp_path: Path) -> None:
    """Eleven ranks' hellos sent at once after rank 0's, one of them with other parameters: ten
    welcomes, one refusal that says why."""
    with in_process_server(f"sqlite:///{tmp_path / 'x.db'}") as server:
        hooks = [server.hook().__enter__() for _ in range(12)]
        try:
            assert hooks[0].call(rank_hello("crowd", 0, 12))["type"] == "welcome"  # the job, first
            for r, hook in enumerate(hooks[1:], start=1):
                hook.send(rank_hello("crowd", r, 12, ("fc.weight",) if r == 7 else ("fc.weight", "fc.bias")))
            replies = [{"type": "welcome"}] + [hook.recv() for hook in hooks[1:]]
        finally:
            for hook in hooks:
                hook.__exit__(None, None, None)
        assert [r["type"] for r in replies] == ["welcome"] * 7 + ["error"] + ["welcome"] * 4
        assert "'fc.bias' is missing" in replies[7]["message"]
        assert len(server.app.state.store.rank_runs("crowd")) == 11

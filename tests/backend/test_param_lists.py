"""Protocol v2's rank hello (docs/protocol.md, "Version 2"): a rank names its job's parameter list
by digest; the server knows the list from an earlier hello (or from the job's stored rows), waits
a moment for a digest it does not know yet, then asks for the list in full (close 4002); a rank's
run keeps its pieces, not a copy of the job's rows; bad input is refused and harms no other run.

One in-process server on SQLite (the store's statements are the same on PostgreSQL: test_jobs.py
runs the rank hellos on both)."""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from gradwatch_server import ingest
from gradwatch_server.protocol import Hello, params_digest, validate_message
from support.asgi import InProcessServer, in_process_server
from support.wiremsg import f32, rank_hello, step

pytestmark = pytest.mark.unit

#: fc.weight is sharded (half on each rank, both counted); fc.bias is a DDP replica (rank 0 counts).
PIECES = [{"local_numel": [3, 3], "counted": [True, True]}, {"local_numel": [3, 3], "counted": [True, False]}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessServer]:
    url = f"sqlite:///{tmp_path_factory.mktemp('v2') / 'x.db'}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ingest, "DIGEST_WAIT_S", 0.5)  # an unknown digest is asked for in full sooner
        with in_process_server(url) as srv:
            yield srv


def pieces(rank: int, count: int) -> dict[str, list[Any]]:
    return {k: v[:count] for k, v in PIECES[rank].items()}


def v1(job: str, rank: int, params: tuple[str, ...] = ("fc.weight", "fc.bias")) -> dict[str, Any]:
    return rank_hello(job, rank, 2, params, **pieces(rank, len(params)))


def v2(job: str, rank: int, *, full: bool, params: tuple[str, ...] = ("fc.weight", "fc.bias")) -> dict[str, Any]:
    """The v2 hello of `rank`, its digest computed by the server's own function."""
    message = v1(job, rank, params)
    parsed = validate_message(message)
    assert isinstance(parsed, Hello)
    job_wide = [{k: v for k, v in p.items() if k not in ("local_numel", "counted")} for p in message["params"]]
    out = {k: v for k, v in message.items() if k not in ("params", "groups")}
    out |= {"v": 2, "params_digest": params_digest(parsed.params, parsed.groups), "pieces": pieces(rank, len(params))}
    return out | ({"params": job_wide, "groups": message["groups"]} if full else {})


def stored_rows(server: InProcessServer, table: str, run_id: str) -> int:
    engine = sa.create_engine(server.settings.db_url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(sa.text(f"SELECT count(*) FROM {table} WHERE run_id = :r"), {"r": run_id}).scalar())
    finally:
        engine.dispose()


def test_a_rank_names_the_jobs_list_by_digest_and_keeps_only_its_pieces(server: InProcessServer) -> None:
    with server.hook() as r0, server.hook() as r1, server.client() as http:
        assert r0.call(v2("j-v2", 0, full=True))["type"] == "welcome"
        assert r1.call(v2("j-v2", 1, full=False))["type"] == "welcome"
        for rank, hook in enumerate((r0, r1)):  # the job's step is assembled from both
            grad = f32(1.0, 2.0) if rank == 0 else f32(2.0, 2.0)
            assert hook.call(step(1, 1, arrays={"grad_norm": grad}, grad_status=[2, 2]))["type"] == "ack"
        for rank in (0, 1):
            found = server.app.state.store.get_params(f"j-v2.r{rank}")
            assert [(p.name, p.local_numel, p.counted) for p in found] == [
                ("fc.weight", 3, True),
                ("fc.bias", 3, rank == 0),
            ]
            shown = http.get(f"/api/runs/j-v2.r{rank}/params").json()["data"]
            assert [p["name"] for p in shown] == ["fc.weight", "fc.bias"]
        assert http.get("/api/runs/j-v2.r1/groups").json()["data"][0]["hparams"]["lr"] == 0.001
        assert stored_rows(server, "params", "j-v2.r1") == 0  # the job's rows stand for the rank's
        assert stored_rows(server, "params", "j-v2") == 2


def test_a_digest_hello_before_the_full_list_waits_for_it(server: InProcessServer) -> None:
    """No race at a job's start: rank 1's digest arrives first and is admitted once rank 0's
    full list is, instead of being refused."""
    replies: list[dict[str, Any]] = []
    names = ("race.weight", "race.bias")
    with server.hook() as r1, server.hook() as r0:
        r1.send(v2("j-race", 1, full=False, params=names))
        waiter = threading.Thread(target=lambda: replies.append(r1.recv()))
        waiter.start()
        assert r0.call(v2("j-race", 0, full=True, params=names))["type"] == "welcome"
        waiter.join(10)
    assert replies and replies[0]["type"] == "welcome" and replies[0]["run_id"] == "j-race.r1"


def test_an_unknown_digest_is_asked_for_in_full_then_taken(server: InProcessServer) -> None:
    names = ("unknown.weight", "unknown.bias")  # a list no other test's job has (a digest names content)
    with server.hook() as r1:
        r1.send(v2("j-unknown", 1, full=False, params=names))
        code, _, error = r1.refused()
    assert code == ingest.CLOSE_NEED_PARAMS and error is not None and "full parameter list" in error
    with server.hook() as r1:  # the same rank with its list: welcomed, and the digest known now
        assert r1.call(v2("j-unknown", 1, full=True, params=names))["type"] == "welcome"
    with server.hook() as r0:
        assert r0.call(v2("j-unknown", 0, full=False, params=names))["type"] == "welcome"


def test_a_v1_hello_is_still_read_and_its_jobs_list_named_after_a_restart(tmp_path: Path) -> None:
    """A job opened by v1 hellos: a v2 rank joining later, on a server that never saw the list
    (restarted), is welcomed from the job's stored rows."""
    url = f"sqlite:///{tmp_path / 'x.db'}"
    names = ("old.weight", "old.bias")
    with in_process_server(url) as first, first.hook() as r0:
        assert r0.call(v1("j-old", 0, names))["type"] == "welcome"
    with in_process_server(url) as second, second.hook() as r1:
        assert (
            second.app.state.store.param_lists.known(v2("j-old", 1, full=False, params=names)["params_digest"]) is None
        )
        assert r1.call(v2("j-old", 1, full=False, params=names))["type"] == "welcome"
        assert [p.counted for p in second.app.state.store.get_params("j-old.r1")] == [True, False]


def test_a_digest_that_is_not_its_lists_or_not_the_jobs_is_refused(server: InProcessServer) -> None:
    wrong = v2("j-mismatch", 0, full=True)
    wrong["params_digest"] = "0" * 64
    with server.hook() as r0:
        r0.send(wrong)
        code, _, error = r0.refused()
    assert code == ingest.CLOSE_INVALID and error is not None and "does not match the params" in error
    with server.hook() as r0:
        assert r0.call(v2("j-mismatch", 0, full=True))["type"] == "welcome"
    # rank 1 names another job's list (known to the server): not this job's, said so
    with server.hook() as other:
        assert other.call(v2("j-other", 0, full=True, params=("fc.weight",)))["type"] == "welcome"
    stray = v2("j-mismatch", 1, full=False, params=("fc.weight",))
    stray["pieces"] = {"counted": False}
    with server.hook() as r1:
        r1.send(stray)
        code, _, error = r1.refused()
    assert code == ingest.CLOSE_INVALID and error is not None and "'fc.bias' is missing" in error


@pytest.mark.parametrize(
    ("change", "text"),
    [
        ({"params_digest": "A" * 64}, "params_digest: String should match pattern"),
        ({"params_digest": "ab" * 31}, "params_digest: String should match pattern"),
        ({"v": 1}, "params_digest and pieces are protocol version 2"),
        ({"pieces": {"counted": [True]}}, "pieces.counted has 1 flags for 2 parameters"),
        ({"pieces": {"local_numel": [3, 9]}}, "pieces.local_numel 9 of 'fc.bias' is above its numel 3"),
        ({"groups": [{"optimizer": 0, "index": 0}]}, "groups without params"),
    ],
)
def test_bad_v2_hellos_are_refused_clearly_and_harm_no_other_run(
    server: InProcessServer, change: dict[str, Any], text: str
) -> None:
    job = f"j-bad{abs(hash(text)) % 10_000}"
    with server.hook() as r0:
        assert r0.call(v2(job, 0, full=True))["type"] == "welcome"
        bad = copy.deepcopy(v2(job, 1, full=False)) | change
        with server.hook() as r1:
            r1.send(bad)
            code, _, error = r1.refused()
        assert code == ingest.CLOSE_INVALID and error is not None and text in error
        assert r0.call(step(1, 1, arrays={"grad_norm": f32(1.0, 2.0)}, grad_status=[2, 2]))["type"] == "ack"

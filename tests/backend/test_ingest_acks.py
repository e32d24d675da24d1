"""Paced acks: a rank of a large job (world_size >= PACED_ACKS_FROM_RANKS) is acknowledged at most
every RANK_ACK_EVERY_S, each ack cumulative and sent only once what it covers is committed;
against a real `gradwatch serve` and real websockets, the test acting as the job's ranks."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import pytest

from gradwatch_server.ingest import BURST_GAP_S, PACED_ACKS_FROM_RANKS, RANK_ACK_EVERY_S
from gradwatch_server.store import open_store
from support.server import ServerProcess, start_server
from support.wiremsg import Hook, close, f32, hello, rank_hello, step

pytestmark = pytest.mark.server

JOB = "j-paced"


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = start_server(tmp_path_factory.mktemp("acks"), args=("--rank-timeout", "60"))
    yield server
    server.stop()


def frame(seq: int) -> dict[str, object]:
    return step(seq, seq, arrays={"grad_norm": f32(1.0, 2.0)})


def committed_seq(srv: ServerProcess, rank: int) -> int:
    store = open_store(srv.db_url)
    try:
        run = store.get_run(f"{JOB}.r{rank}")
        assert run is not None
        return run.last_seq
    finally:
        store.engine.dispose()


def test_a_large_jobs_rank_gets_one_ack_for_several_frames_each_after_its_commit_and_errors_after_acks(
    srv: ServerProcess,
) -> None:
    ranks = PACED_ACKS_FROM_RANKS
    with contextlib.ExitStack() as stack:
        hooks = [stack.enter_context(Hook(srv.ws_url)) for _ in range(ranks)]
        for rank, hook in enumerate(hooks):
            hook.send(rank_hello(JOB, rank, ranks))
        assert [hook.recv()["type"] for hook in hooks] == ["welcome"] * ranks
        r0, r1 = hooks[0], hooks[1]
        assert r0.call(frame(1))["seq"] == 1  # the first ack goes at once

        started = time.monotonic()
        r0.send(frame(2))
        r0.send(frame(3))
        ack = r0.recv(timeout=RANK_ACK_EVERY_S + 10)
        held = time.monotonic() - started
        assert ack["type"] == "ack" and ack["seq"] == 3, ack  # one ack for frames 2 and 3
        assert committed_seq(srv, 0) >= 3  # sent once they were committed
        assert held >= RANK_ACK_EVERY_S - 0.5, held  # held until its time came, not sent per frame

        assert r0.call(close(4)) == {"type": "ack", "seq": 4}  # a close is acked at once: it covers all

        # a refused message: what came before it is acknowledged first, then the error
        assert r1.call(frame(1))["seq"] == 1
        r1.send(frame(2))
        r1.send({"v": 1, "type": "step", "seq": 3})
        assert r1.recv() == {"type": "ack", "seq": 2, "linger": 5.0}
        code, _, error = r1.refused()
        assert code == 1003 and error is not None and "step" in error
        assert committed_seq(srv, 1) == 2


def test_a_burst_of_frames_a_few_milliseconds_apart_is_stored_as_one_batch(srv: ServerProcess) -> None:
    """A hook sends a pace's frames back to back, its sending thread waiting for the training
    process' GIL between two: the writer waits for the rest of the burst (BURST_GAP_S), and
    stores and acknowledges it as one batch (each batch costs a commit, a hand-off and an ack)."""
    whole = 0
    with Hook(srv.ws_url) as hook:
        assert hook.call(hello("burst"))["type"] == "welcome"
        for burst in range(3):
            first = 1 + 3 * burst
            for seq in range(first, first + 3):
                hook.send(frame(seq))
                time.sleep(BURST_GAP_S / 5)
            acks = [hook.recv()]
            while acks[-1]["seq"] < first + 2:
                acks.append(hook.recv())
            whole += len(acks) == 1
    # three bursts: a machine that stalls this test's thread past BURST_GAP_S once still passes
    assert whole >= 2, whole

"""/ws/live: browsers get run events and the steps of the run they watch; slow ones are dropped."""

from __future__ import annotations

import asyncio
import json

import pytest
from websockets.sync.client import connect

from gradwatch_server.live import LiveHub
from gradwatch_server.store import Run
from support.server import ServerProcess
from support.wiremsg import Hook, close, f32, hello, step, with_absent

pytestmark = pytest.mark.unit  # a test that starts a server says so (@pytest.mark.server)

RUN = Run(
    id="r",
    name="r",
    project="p",
    status="running",
    created_at=0.0,
    updated_at=0.0,
    finished_at=None,
    last_seq=0,
    steps=0,
    last_step=None,
    param_count=0,
    param_numel=0,
    optimizer=None,
    config={},
    hook_version=None,
)


@pytest.mark.server
def test_browsers_follow_runs_and_steps(server: ServerProcess) -> None:
    with connect(f"{server.ws_url}/ws/live?run=live1") as watcher, connect(f"{server.ws_url}/ws/live") as lister:
        with Hook(server.ws_url) as hook:
            hook.call(hello("live1"))
            hook.call(
                step(
                    1,
                    1,
                    scalars={"loss": "NaN", "lr/0": 0.5},
                    arrays={"grad_norm": with_absent(f32(1.5, 0.0), 1)},
                    grad_status=[2, 0],
                )
            )
            hook.call(close(2))
        events = [json.loads(watcher.recv(10)) for _ in range(3)]
        assert [e["type"] for e in events] == ["run", "step", "run"]
        assert events[0]["run"]["id"] == "live1" and events[0]["run"]["status"] == "running"
        assert events[1] == {
            "type": "step",
            "run_id": "live1",
            "step": 1,
            "time": 1_700_000_001.0,
            "scalars": {"loss": "NaN", "lr/0": 0.5},
            "params": {"grad_norm": [1.5, None]},
            "grad_status": [2, 0],
        }
        assert events[2]["run"]["status"] == "finished" and events[2]["run"]["steps"] == 1
        listed = [json.loads(lister.recv(10)) for _ in range(2)]
        assert [(e["type"], e["run"]["status"]) for e in listed] == [("run", "running"), ("run", "finished")]


def test_a_browser_that_falls_behind_is_dropped() -> None:
    async def scenario() -> None:
        hub = LiveHub(queue_size=2)
        slow, fast = hub.subscribe(None), hub.subscribe(None)
        for _ in range(3):
            hub.publish_run(RUN)
            assert json.loads(fast.queue.get_nowait())["run"]["id"] == "r"
        # The slow browser's queue now holds only the order to close (1013).
        assert slow.queue.qsize() == 1 and slow.queue.get_nowait() is None
        hub.publish_run(RUN)  # the dropped browser gets nothing more
        assert slow.queue.empty() and fast.queue.qsize() == 1

    asyncio.run(scenario())

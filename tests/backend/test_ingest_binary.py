"""Binary step frames (protocol version 3) on /ws/ingest against a real `gradwatch serve`: the
stored norms are the arrays sent, for a `step` and a `steps` frame, a single process's run and a
job's ranks; every malformed frame is refused with a message that says what is wrong, nothing of
it stored, and a run beside it carries on. Frames are built by hand (support.wiremsg.binary), per
docs/protocol.md, not by the hook's encoder.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from websockets.exceptions import ConnectionClosed

from support.server import ServerProcess, start_server
from support.wiremsg import Hook, binary, close, f32, hello, rank_hello, step, steps, with_absent

pytestmark = pytest.mark.server

PARAMS = ("a.weight", "b.weight", "c.bias")


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = start_server(tmp_path_factory.mktemp("binary"), args=("--rank-timeout", "60"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def http(srv: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=srv.url, timeout=10) as client:
        yield client


def norms(http: httpx.Client, run_id: str, metric: str, params: tuple[str, ...] = PARAMS) -> list[list[Any]]:
    """The stored values of `metric`, one list per stored step, in parameter order."""
    body = http.get(f"/api/runs/{run_id}/params/series", params={"metric": metric, "param": list(params)}).json()
    return [list(values) for values in zip(*(s["value"] for s in body["series"]))]


def as_stored(values: np.ndarray) -> list[Any]:
    """The oracle: what the API gives for float32 values (ABSENT: None, NaN and infinities as strings)."""
    out: list[Any] = []
    for v, bits in zip(values.astype("<f4"), values.astype("<f4").view("<u4")):
        if bits == 0x7FDEAD00:
            out.append(None)
        elif math.isnan(v):
            out.append("NaN")
        elif math.isinf(v):
            out.append("Infinity" if v > 0 else "-Infinity")
        else:
            out.append(float(v))
    return out


def test_the_norms_of_binary_step_and_steps_frames_are_stored_as_sent(srv: ServerProcess, http: httpx.Client) -> None:
    rng = np.random.default_rng(7)
    grads = [with_absent(rng.random(3).astype("<f4"), 2) for _ in range(4)]
    grads[1][0] = np.inf
    params = [rng.random(3).astype("<f4") for _ in range(4)]
    status = [[2, 3, 0], [3, 2, 0], [2, 2, 0], [1, 2, 0]]
    with Hook(srv.ws_url) as hook:
        welcome = hook.call(hello("bin-run", params=PARAMS))
        assert 3 in welcome["versions"]
        one = step(
            1, 1, scalars={"loss": 1.0}, arrays={"grad_norm": grads[0], "param_norm": params[0]}, grad_status=status[0]
        )
        assert hook.call(binary(one)) == {"type": "ack", "seq": 1, "linger": welcome["linger"]}
        many = steps(
            2,
            [2, 3],
            scalars={"loss": [2.0, "NaN"]},
            arrays={"grad_norm": np.stack(grads[1:3]), "param_norm": np.stack(params[1:3])},
            grad_status=status[1:3],
        )
        assert hook.call(binary(many))["seq"] == 2
        json_step = step(
            3, 4, scalars={"loss": 4.0}, arrays={"grad_norm": grads[3], "param_norm": params[3]}, grad_status=status[3]
        )
        assert hook.call(json_step)["seq"] == 3  # the JSON frames still read, on the same connection
        assert hook.call(close(4))["seq"] == 4
    assert norms(http, "bin-run", "grad_norm") == [as_stored(g) for g in grads]
    assert norms(http, "bin-run", "param_norm") == [as_stored(p) for p in params]
    assert norms(http, "bin-run", "grad_status") == status
    assert http.get("/api/runs/bin-run/series", params={"key": "loss"}).json()["value"] == [1.0, 2.0, "NaN", 4.0]


def test_a_jobs_global_norms_from_binary_and_json_rank_frames_are_the_oracles(
    srv: ServerProcess, http: httpx.Client
) -> None:
    """Rank 0 sends JSON, rank 1 binary: the job's step is the counted pieces' global norm."""
    pieces = {"local_numel": [3, 3], "counted": [True, True]}
    w = {0: f32(3.0, 0.5), 1: f32(4.0, 1.5)}
    with Hook(srv.ws_url) as r0, Hook(srv.ws_url) as r1:
        r0.call(rank_hello("bin-job", 0, 2, **pieces))
        r1.call(rank_hello("bin-job", 1, 2, **pieces))
        for rank, hook in ((0, r0), (1, r1)):
            message = step(1, 1, scalars={"loss": 1.0}, arrays={"grad_norm": w[rank]}, grad_status=[2, 2])
            assert hook.call(binary(message) if rank == 1 else message)["type"] == "ack"
        r0.call(close(2))
        r1.call(close(2))
    lines = http.get("/api/runs/bin-job/export", params={"format": "json"}).text
    stored = [d for d in map(json.loads, lines.splitlines()) if d["type"] == "step" and d.get("rank") is None]
    oracle = [float(np.float32(np.linalg.norm(np.stack([w[0][i], w[1][i]]).astype(np.float64)))) for i in range(2)]
    assert [d["params"]["grad_norm"] for d in stored] == [oracle]
    assert norms(http, "bin-job.r1", "grad_norm", ("fc.weight", "fc.bias")) == [as_stored(w[1])]


def good_step(seq: int) -> dict[str, Any]:
    return step(seq, seq, scalars={"loss": 1.0}, arrays={"grad_norm": f32(1, 2, 3)}, grad_status=[2, 2, 2])


def _frames() -> dict[str, tuple[bytes, int, str | None]]:
    good = binary(good_step(1))
    size = int.from_bytes(good[:4], "little")
    two = steps(1, [1, 2], arrays={"grad_norm": np.ones((2, 3), "<f4")})
    huge = np.zeros((16 << 20) // 4 + 1, "<f4")  # past the 16 MiB frame limit
    return {
        "no header length": (b"\x01\x00", 1003, "has no header length"),
        "header past the end": (good[: 4 + size - 2], 1003, "truncated"),
        "arrays cut short": (good[:-1], 1003, "expected 15"),
        "a byte too many": (good + b"\x00", 1003, "expected 15"),
        "header not JSON": (len(b"{nope").to_bytes(4, "little") + b"{nope", 1003, "header is not valid JSON"),
        "version 2 header": (binary(good_step(1), {"v": 2}), 1003, '"v": 3'),
        "a hello in binary": (binary(good_step(1), {"type": "hello"}), 1003, "step or steps message"),
        "a status code too high": (binary(step(1, 1, grad_status=[2, 9, 2])), 1003, "code above 3"),
        "steps and arrays disagree": (binary(two, {"step": [1, 2, 3], "time": [1.0, 2.0, 3.0]}), 1003, "expected 36"),
        "names repeated": (binary(good_step(1), {"params": ["grad_norm", "grad_norm"]}), 1003, "distinct metric names"),
        "oversized": (binary(step(1, 1)) + huge.tobytes(), 1009, None),
    }


FRAMES = _frames()


@pytest.mark.parametrize("case", list(FRAMES))
def test_a_bad_binary_frame_is_refused_and_harms_no_other_run(
    srv: ServerProcess, http: httpx.Client, case: str
) -> None:
    frame, expected_code, why = FRAMES[case]
    run_id = "bad-" + case.replace(" ", "-")
    with Hook(srv.ws_url) as other, Hook(srv.ws_url) as hook:
        other.call(hello(f"{run_id}-beside", params=PARAMS))
        assert other.call(binary(good_step(1)))["seq"] == 1
        hook.call(hello(run_id, params=PARAMS))
        assert hook.call(binary(good_step(1)))["seq"] == 1
        with contextlib.suppress(ConnectionClosed):  # the server may close while a huge frame is sent
            hook.send(frame)
        code, _, error = hook.refused()
        assert code == expected_code
        assert why is None or (error is not None and why in error), error
        assert other.call(binary(good_step(2)))["seq"] == 2  # the run beside it carries on
        other.call(close(3))
    assert http.get(f"/api/runs/{run_id}").json()["steps"] == 1  # nothing of the bad frame
    assert norms(http, f"{run_id}-beside", "grad_norm") == [[1.0, 2.0, 3.0]] * 2

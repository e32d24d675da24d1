"""Diagnostics through a real `gradwatch serve`: findings go to the hook (before the ack of their
step), to the browsers (/ws/live) and to GET .../diagnostics; they survive a restart and are
derived for imported runs. Messages are built by hand (wiremsg), on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from websockets.sync.client import connect

from gradwatch_server.live import LIVE_LINGER_S
from gradwatch_server.store import open_store
from support.server import server_command, server_env, start_server
from support.wiremsg import Hook, close, f32, hello, step, steps, with_absent

pytestmark = pytest.mark.server

PARAMS = ("enc.weight", "enc.bias", "head.weight")


def healthy(seq: int, n: int, *, clear: float = 1.0, status: tuple[int, ...] = (2, 2, 2)) -> dict[str, Any]:
    """A step message with the hook's accumulation counters (clear 0: a forgotten zero_grad())."""
    norm = f32(*[float("nan") if s == 3 else 0.5 for s in status])
    norm = with_absent(norm, *[i for i, s in enumerate(status) if s == 0])
    clears = with_absent(f32(0, 0, 0), 0, 1, 2) if n == 1 else f32(clear, clear, clear)
    return step(
        seq,
        n,
        scalars={"loss": 1.0 / n},
        grad_status=list(status),
        arrays={"grad_norm": norm, "backward_passes": f32(1, 1, 1), "grad_clear": clears},
    )


def frames_until_ack(hook: Hook, seq: int) -> list[dict[str, Any]]:
    """Every frame the server sends up to and including the ack of `seq`, in order."""
    out = []
    while True:
        frame = json.loads(hook.ws.recv(10))
        out.append(frame)
        if frame.get("type") == "ack" and frame["seq"] >= seq:
            return out


def test_findings_reach_the_hook_the_browsers_and_the_api(tmp_path: Path, db_url: str) -> None:
    server = start_server(tmp_path, db_url=db_url)
    try:
        with connect(f"{server.ws_url}/ws/live?run=diag", open_timeout=10) as live, Hook(server.ws_url) as hook:
            welcome = hook.call(hello("diag", params=PARAMS, config={"every": 1, "unoptimized_params": ["extra.bias"]}))
            assert welcome["type"] == "welcome"
            for n in (1, 2, 3):
                assert hook.call(healthy(n, n)) == {
                    "type": "ack",
                    "seq": n,
                    "linger": LIVE_LINGER_S,
                }  # a browser watches
            # Known from the hello: sent right after the welcome.
            assert [f["code"] for f in hook.findings] == ["param_not_in_optimizer"]

            hook.send(healthy(4, 4, clear=0.0))
            frames = frames_until_ack(hook, 4)
            assert [f["type"] for f in frames] == ["finding", "ack"]  # the finding comes first
            piled = frames[0]["finding"]
            assert piled["code"] == "grad_accumulation_unbounded" and piled["first_step"] == 4
            assert piled["severity"] == "error" and piled["params"] == list(PARAMS)
            assert piled["figure"] == {
                "label": "backward passes summed in .grad",
                "value": 2.0,
                "unit": "passes",
                "text": "2",
                "step": 4,
            }

            # The same code is not sent again; a new one is.
            hook.send(healthy(5, 5, clear=0.0, status=(2, 3, 2)))
            frames = frames_until_ack(hook, 5)
            assert [(f["type"], f.get("finding", {}).get("code")) for f in frames] == [
                ("finding", "nonfinite_grad"),
                ("ack", None),
            ]
            assert hook.call(close(6)) == {"type": "ack", "seq": 6}

            got: dict[str, dict[str, Any]] = {}
            while len(got) < 3:
                message = json.loads(live.recv(10))
                if message["type"] == "finding":
                    assert message["run_id"] == "diag"
                    got[message["finding"]["code"]] = message["finding"]
            assert got["grad_accumulation_unbounded"] == piled

        with httpx.Client(base_url=server.url, timeout=10) as http:
            found = http.get("/api/runs/diag/diagnostics").json()
        assert [(f["code"], f["first_step"]) for f in found] == [
            ("param_not_in_optimizer", None),
            ("grad_accumulation_unbounded", 4),
            ("nonfinite_grad", 5),
        ]
        assert found[1] == as_in_the_api(piled)
        assert found[2]["params"] == ["enc.bias"]
        assert all(f == as_in_the_api(got[f["code"]]) for f in found)
    finally:
        server.stop()
    store = open_store(db_url)
    try:
        assert [f.code for f in store.get_findings("diag")] == [f["code"] for f in found]
        mark = store.get_diagnosis("diag")
        assert mark is not None and (mark.steps, mark.last_step) == (5, 5)
    finally:
        store.close()


def test_a_restarted_server_rebuilds_the_state_and_the_hook_resumes(tmp_path: Path, db_url: str) -> None:
    server = start_server(tmp_path, db_url=db_url)
    try:
        with Hook(server.ws_url) as hook:
            hook.call(hello("resume", params=PARAMS))
            for n in range(1, 13):  # head.weight never gets a gradient
                hook.call(healthy(n, n, status=(2, 2, 0)))
            assert [f["code"] for f in hook.findings] == ["param_never_gets_grad"]
    finally:
        server.stop()  # the hook never said close
    server = start_server(tmp_path, db_url=db_url)
    try:
        with httpx.Client(base_url=server.url, timeout=10) as http:
            found = http.get("/api/runs/resume/diagnostics").json()
            assert [(f["code"], f["first_step"], f["params"]) for f in found] == [
                ("param_never_gets_grad", 1, ["head.weight"])
            ]
            with Hook(server.ws_url) as hook:
                assert hook.call(hello("resume", params=PARAMS))["last_seq"] == 12
                hook.call(healthy(13, 13, clear=0.0, status=(2, 2, 0)))
                assert hook.call(close(14)) == {"type": "ack", "seq": 14}
                # A new connection hears every finding again (the hook shows each code once anyway).
                assert [f["code"] for f in hook.findings] == ["param_never_gets_grad", "grad_accumulation_unbounded"]
                piled = hook.findings[1]
            # The rebuilt state knew step 12's gradient: step 13 summed two batches.
            assert "step 13 used the sum of 2 batches' gradients" in piled["message"]
            assert [f["code"] for f in http.get("/api/runs/resume/diagnostics").json()] == [
                "param_never_gets_grad",
                "grad_accumulation_unbounded",
            ]
    finally:
        server.stop()


def test_imported_runs_are_diagnosed(tmp_path: Path, db_url: str) -> None:
    (tmp_path / "source").mkdir()
    source = start_server(tmp_path / "source")  # on SQLite; the import goes to db_url
    try:
        with Hook(source.ws_url) as hook:
            hook.call(hello("imported", params=PARAMS))
            for n in range(1, 8):
                hook.call(healthy(n, n, clear=2.0))  # zero_grad(set_to_none=False)
            hook.call(close(8))
        with httpx.Client(base_url=source.url, timeout=10) as http:
            expected = http.get("/api/runs/imported/diagnostics").json()
            exported = http.get("/api/runs/imported/export", params={"format": "json"}).text
    finally:
        source.stop()
    assert [f["code"] for f in expected] == ["zero_filled_grad_buffers"]
    assert expected[0]["figure"]["value"] == 6 * 4 + 3 * 4 + 6 * 4  # wiremsg shapes, float32
    path = tmp_path / "run.jsonl"
    path.write_text(exported)
    result = subprocess.run(
        [*server_command(), "import", str(path), "--db", db_url],
        capture_output=True,
        text=True,
        timeout=120,
        env=server_env(),
    )
    assert result.returncode == 0, result.stderr
    target = start_server(tmp_path, db_url=db_url)
    try:
        with httpx.Client(base_url=target.url, timeout=10) as http:
            assert http.get("/api/runs/imported/diagnostics").json() == expected
            assert http.delete("/api/runs/imported").status_code == 204
    finally:
        target.stop()
    store = open_store(db_url)
    try:
        assert store.get_findings("imported") == [] and store.get_diagnosis("imported") is None
    finally:
        store.close()


def as_in_the_api(live: dict[str, Any]) -> dict[str, Any]:
    """A finding as a live frame carries it, as the API shows it: the API's schema always has the
    figure's `evidence` (null but for instability findings); a live frame leaves a null one out."""
    figure = live.get("figure")
    if isinstance(figure, dict) and "evidence" not in figure:
        return {**live, "figure": {**figure, "evidence": None}}
    return live


def measured(seq: int, n: int, spike: float = 1.0, *, resent: bool = False) -> dict[str, Any]:
    """A measured step of steady gradient norms (a little noise), `enc.weight`'s times `spike`;
    `resent`: the flight recorder's norms of a step sent before without them."""
    noise = 1.0 + 0.02 * ((n * 7) % 5 - 2)
    scalars = {"loss": 1.0, "flight/resent": 1.0} if resent else {"loss": 1.0}
    norms = f32(0.5 * noise * spike, 0.2 * noise, 0.3 * noise)
    return step(seq, n, scalars=scalars, grad_status=[2, 2, 2], arrays={"grad_norm": norms})


def test_the_recorders_late_norms_are_judged_live_and_reach_the_browsers(tmp_path: Path) -> None:
    """Steps 25-30 are sent unmeasured (sampled), then the flight recorder sends 26-28 again
    with their norms, a 50x spike at 28: the spike is found then, before the ack, told once,
    and the browsers get the late values and the finding; a window of steady norms finds nothing."""
    server = start_server(tmp_path)
    try:
        for run, spike in (("late", 50.0), ("quiet", 1.0)):
            with connect(f"{server.ws_url}/ws/live?run={run}", open_timeout=10) as live, Hook(server.ws_url) as hook:
                assert hook.call(hello(run, params=PARAMS, config={"every": 1}))["type"] == "welcome"
                for n in range(1, 25):
                    assert hook.call(measured(n, n))["type"] == "ack"
                for n in range(25, 31):
                    assert hook.call(step(n, n, scalars={"loss": 1.0}))["type"] == "ack"
                assert hook.findings == []  # the spike at 28 is not known yet
                for seq, n in ((31, 26), (32, 27), (33, 28)):
                    hook.send(measured(seq, n, spike if n == 28 else 1.0, resent=True))
                frames = frames_until_ack(hook, 33)
                hook.send(measured(34, 31))  # the next measured step: judged after the window, nothing new
                frames += frames_until_ack(hook, 34)
                found = [f["finding"] for f in frames if f["type"] == "finding"]
                if spike == 1.0:
                    assert found == []
                    continue
                assert [(f["code"], f["first_step"], f["params"]) for f in found] == [
                    ("grad_norm_spike", 28, ["enc.weight"])
                ]
                late, published = {}, None
                while published is None or 28 not in late:
                    message = json.loads(live.recv(10))
                    if message["type"] == "step" and "flight/resent" in message["scalars"]:
                        late[message["step"]] = message["params"]["grad_norm"]
                    elif message["type"] == "finding":
                        published = message["finding"]
                assert published == found[0]
                assert late[28] == pytest.approx(
                    [25.0 * (1 + 0.02 * ((28 * 7) % 5 - 2)), 0.2 * 0.98, 0.3 * 0.98], rel=1e-6
                )
                with httpx.Client(base_url=server.url, timeout=10) as http:
                    api = http.get(f"/api/runs/{run}/diagnostics").json()
                assert [(f["code"], f["first_step"]) for f in api] == [("grad_norm_spike", 28)]
    finally:
        server.stop()


def measured_block(seq: int, numbers: range) -> dict[str, Any]:
    """`measured`'s steps as one `steps` message."""
    noise = 1.0 + 0.02 * (np.array([(n * 7) % 5 - 2 for n in numbers]) * 1.0)
    return steps(
        seq,
        numbers,
        scalars={"loss": [1.0] * len(numbers)},
        arrays={"grad_norm": np.stack([0.5 * noise, 0.2 * noise, 0.3 * noise], axis=1)},
        grad_status=[[2, 2, 2]] * len(numbers),
    )


def test_late_norms_are_judged_at_any_step_and_beyond_the_snapshots_after_the_ack(tmp_path: Path) -> None:
    """A run past step 2,000: the recorder's window before a spike at 2,375 is judged from the
    diagnosis' snapshot, its finding told before the ack. Late norms from far back (a NaN at step
    1,005, older than every snapshot) have the run judged again whole after that batch's ack: the
    finding comes after it, before the next ack, and both are in the API."""
    server = start_server(tmp_path)
    try:
        with Hook(server.ws_url) as hook:
            assert hook.call(hello("long", params=PARAMS, config={"every": 10}))["type"] == "welcome"
            seq = 0
            for lo, hi in ((1, 500), (500, 1_000), (1_011, 1_511), (1_511, 2_011), (2_011, 2_367)):
                seq += 1
                assert hook.call(measured_block(seq, range(lo, hi)))["type"] == "ack"
                if hi == 1_000:
                    seq += 1
                    cheap = steps(seq, range(1_000, 1_011), scalars={"loss": [1.0] * 11})
                    assert hook.call(cheap)["type"] == "ack"
            seq += 1
            assert hook.call(steps(seq, range(2_367, 2_376), scalars={"loss": [1.0] * 9}))["type"] == "ack"
            for n in range(2_369, 2_376):
                seq += 1
                hook.send(measured(seq, n, 50.0 if n == 2_375 else 1.0, resent=True))
            frames = frames_until_ack(hook, seq)
            assert [(f["type"], f.get("finding", {}).get("first_step")) for f in frames][-2:] == [
                ("finding", 2_375),
                ("ack", None),
            ]
            assert frames[-2]["finding"]["code"] == "grad_norm_spike"

            seq += 1
            nan = step(
                seq, 1_005, scalars={"loss": 1.0, "flight/resent": 1.0}, arrays={"grad_norm": f32(0.5, np.nan, 0.3)}
            )
            hook.send(nan)
            # the late batch's ack does not wait for the whole re-diagnosis; the next batch's does
            assert [f["type"] for f in frames_until_ack(hook, seq)] == ["ack"]
            seq += 1
            hook.send(measured(seq, 2_376))
            frames = frames_until_ack(hook, seq)
            assert [(f["type"], f.get("finding", {}).get("code")) for f in frames] == [
                ("finding", "nonfinite_grad"),
                ("ack", None),
            ]
            assert (frames[0]["finding"]["first_step"], frames[0]["finding"]["params"]) == (1_005, ["enc.bias"])
        with httpx.Client(base_url=server.url, timeout=10) as http:
            api = http.get("/api/runs/long/diagnostics").json()
        assert [(f["code"], f["first_step"]) for f in api] == [("nonfinite_grad", 1_005), ("grad_norm_spike", 2_375)]
    finally:
        server.stop()

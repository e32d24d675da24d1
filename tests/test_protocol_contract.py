"""What the hook emits is valid under the server's protocol models: one definition, both sides."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from gradwatch import wire
from gradwatch.layout import build_layout
from gradwatch.measure import Probe
from gradwatch_server import protocol
from support.probing import after_step, before_step

pytestmark = pytest.mark.unit


def test_protocol_constants_agree() -> None:
    assert wire.PROTOCOL_VERSION == protocol.PROTOCOL_VERSION
    assert wire.ABSENT_BITS == protocol.ABSENT_BITS
    codes = (wire.GRAD_STATUS_NONE, wire.GRAD_STATUS_ZERO, wire.GRAD_STATUS_NONZERO, wire.GRAD_STATUS_NONFINITE)
    assert [protocol.GRAD_STATUS_NAMES[c] for c in codes] == ["none", "zero", "nonzero", "nonfinite"]


def test_hook_messages_validate_and_round_trip() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2), torch.nn.Linear(2, 2))
    opt = torch.optim.Adam(list(model[0].parameters()) + list(model[1].parameters()), lr=1e-3)
    layout = build_layout([opt], model)
    probe = Probe(layout)
    hello = wire.hello(
        {
            "id": "abc123",
            "name": "n",
            "project": "p",
            "started_at": 1.0,
            "hook_version": "0.1.0",
            "optimizer": "Adam",
            "config": {"every": 1, "unoptimized_params": layout.unoptimized},
        },
        layout.hello_params(),
        layout.hello_groups(),
    )
    parsed = protocol.parse_message(wire.dumps(hello))
    assert isinstance(parsed, protocol.Hello)
    assert [p.name for p in parsed.params] == ["0.weight", "0.bias", "1.weight", "1.bias"]

    model(torch.randn(2, 3)).sum().backward()
    model[0].bias.grad[0] = float("nan")
    model[1].bias.grad = None
    before_step(probe, 1)
    opt.step()
    snapshot = after_step(probe, {"loss": float("inf")})
    metrics, status, scalars = snapshot.resolve()
    text = wire.dumps(wire.step(7, 1, 2.0, scalars, metrics, status))
    step = protocol.parse_message(text, param_count=len(layout.params))
    assert isinstance(step, protocol.Step) and step.seq == 7
    assert step.scalars["loss"] == float("inf")
    arrays = step.arrays()
    for name, values in metrics.items():
        assert protocol.decode_floats(arrays[name]).tobytes() == values.tobytes()  # bit-exact, ABSENT too
    assert protocol.decode_status(arrays["grad_status"]).tolist() == status.tolist()
    assert protocol.absent_mask(protocol.decode_floats(arrays["grad_norm"])).tolist() == [False, False, False, True]

    close = protocol.parse_message(wire.dumps(wire.close(8)))
    assert isinstance(close, protocol.Close) and close.status == "finished"


def test_wire_json_is_strict() -> None:
    text = wire.dumps(
        wire.step(
            1,
            1,
            0.0,
            {"a": float("nan"), "b": float("-inf")},
            {"grad_norm": np.zeros(1, np.float32)},
            np.zeros(1, np.uint8),
        )
    )
    assert json.loads(text)["scalars"] == {"a": "NaN", "b": "-Infinity"}


def test_hook_steps_batches_validate_and_stand_for_their_steps() -> None:
    records = [
        wire.UnsentStep(
            step=s,
            time=float(s),
            scalars={"loss": float(s), "bad": float("nan")},
            metrics={"grad_norm": np.array([s, np.inf], np.float32)},
            grad_status=np.array([2, 3], np.uint8),
        )
        for s in (4, 5, 7)
    ]
    message = protocol.parse_message(wire.dumps(wire.steps(9, records)), param_count=2)
    assert isinstance(message, protocol.Steps)
    for record, step in zip(records, message.expand()):
        assert (step.seq, step.step, step.time, step.scalars["loss"]) == (9, record.step, record.time, record.step)
        assert step.arrays()["grad_norm"] == record.metrics["grad_norm"].tobytes()
        assert protocol.decode_status(step.arrays()["grad_status"]).tolist() == [2, 3]
    single = protocol.parse_message(wire.dumps(wire.steps(10, records[:1])), param_count=2)
    assert isinstance(single, protocol.Step) and single.step == 4  # one record: a plain `step`


@pytest.mark.skipif(
    "local_numel" not in protocol.ParamInfo.model_fields,
    reason="this server's protocol has no distributed fields yet (params' local_numel/counted)",
)
def test_distributed_rank_params_and_update_norms_validate() -> None:
    """A rank's `params` (local_numel, counted) and, with updates, `param_before_norm`."""
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    layout = build_layout([opt], model, rank=1)
    params = layout.hello_params()
    assert [(p["local_numel"], p["counted"]) for p in params] == [(6, False), (2, False)]
    for p in params:
        parsed = protocol.ParamInfo.model_validate(p)
        assert (parsed.local_numel, parsed.counted) == (p["local_numel"], False)
    probe = Probe(layout, updates=True)
    model(torch.randn(2, 3)).sum().backward()
    before_step(probe, 1)
    opt.step()
    metrics, status, scalars = after_step(probe, {}).resolve()
    assert set(metrics) >= {"update_norm", "update_ratio", "param_before_norm"}
    step = protocol.parse_message(wire.dumps(wire.step(1, 1, 0.0, scalars, metrics, status)), param_count=2)
    assert isinstance(step, protocol.Step)
    assert step.arrays()["param_before_norm"] == metrics["param_before_norm"].tobytes()


def test_a_ranks_v2_hellos_validate_and_name_the_jobs_list_by_the_servers_digest() -> None:
    """wire.rank_hellos: the digest hello, the full v2 hello and the v1 hello all validate; the
    hook's digest is the server's (a real optimizer's hparams: floats, a tuple, bools, None); and
    every rank's pieces come out as its v1 params give them."""
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95))
    digests = set()
    for rank in (0, 1):
        layout = build_layout([opt], model, rank=rank)
        run = {"id": f"job.r{rank}", "started_at": 1.0, "config": {}}
        v1 = wire.hello(
            run, layout.hello_params(), layout.hello_groups(), {"job": "job", "rank": rank, "world_size": 2}
        )
        tried = wire.rank_hellos(v1)
        assert [h["v"] for h in tried] == ([2] if rank else []) + [2, 1]
        full_v1 = protocol.parse_message(wire.dumps(tried[-1]))
        assert isinstance(full_v1, protocol.Hello)
        expected = protocol.params_digest(full_v1.params, full_v1.groups)
        for message in tried[:-1]:
            parsed = protocol.parse_message(wire.dumps(message))
            assert isinstance(parsed, protocol.Hello) and parsed.params_digest == expected
            assert parsed.rank_pieces().counted_flags(4) == [p.counted for p in full_v1.params]
        assert tried[0].get("params") is (None if rank else tried[0]["params"])
        digests.add(expected)
    assert len(digests) == 1  # the job's list, whatever the rank's pieces


def test_the_hooks_binary_frames_read_as_its_json_messages() -> None:
    """A `step` and a `steps` frame (v3), a replica's digested steps among them: the server reads
    each binary frame as the JSON message built from the same records, arrays bit for bit, and
    `binary_as_json` (what a hook resends to a server older than v3) gives that JSON message."""
    assert wire.PROTOCOL_VERSION_3 == protocol.BINARY_VERSION and wire.BINARY_ALIGN == protocol.BINARY_ALIGN
    rng = np.random.default_rng(5)
    absent = np.frombuffer(np.uint32(wire.ABSENT_BITS).tobytes(), "<f4")[0]

    def record(s: int, digest: bool = False) -> wire.UnsentStep:
        grad = rng.random(3).astype(np.float32)
        grad[2] = absent
        full = wire.UnsentStep(
            s,
            1.0 + s,
            {"loss": float("nan"), "lr/0": 1e-3},
            {"grad_norm": grad, "param_norm": grad * 2},
            np.array([2, 3, 0], np.uint8),
        )
        return wire.digested(full) if digest else full

    for records in ([record(1)], [record(2), record(3), record(4)], [record(5, True), record(6, True)]):
        frame = wire.binary_steps(9, records)
        size = int.from_bytes(frame[:4], "little")
        assert (4 + size) % wire.BINARY_ALIGN == 0
        from_json = protocol.parse_message(wire.dumps(wire.steps(9, records)), param_count=3)
        from_binary = protocol.parse_binary(frame, param_count=3)
        assert type(from_binary) is type(from_json)
        assert repr(from_binary.model_dump(exclude={"v"})) == repr(from_json.model_dump(exclude={"v"}))  # NaN too
        assert wire.binary_as_json(frame) == wire.steps(9, records)

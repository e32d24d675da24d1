"""The v1 wire models: what is accepted, what is refused and how the refusal reads."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from pydantic import ValidationError

from gradwatch_server.jsonvalues import float_list, metric_array, metric_list
from gradwatch_server.protocol import (
    ABSENT_BITS,
    Close,
    Hello,
    ProtocolError,
    Step,
    Steps,
    absent_mask,
    decode_floats,
    parse_message,
)
from support.wiremsg import b64, close, f32, hello, rank_hello, step, steps, with_absent

pytestmark = pytest.mark.unit


def parse(message: dict[str, object], param_count: int | None = 2) -> object:
    return parse_message(json.dumps(message), param_count)


def test_valid_messages() -> None:
    h = parse(hello("run_1-x"), None)
    assert isinstance(h, Hello) and [p.name for p in h.params] == ["fc.weight", "fc.bias"]
    s = parse(
        step(
            3, 2, scalars={"loss": "NaN", "n": 3, "m": "-Infinity"}, arrays={"grad_norm": f32(1, 2)}, grad_status=[0, 3]
        )
    )
    assert isinstance(s, Step)
    assert math.isnan(s.scalars["loss"]) and s.scalars["n"] == 3.0 and s.scalars["m"] == -math.inf
    assert s.arrays() == {"grad_norm": f32(1, 2).tobytes(), "grad_status": bytes([0, 3])}
    c = parse(close(4))
    assert isinstance(c, Close) and c.status == "finished"


@pytest.mark.parametrize(
    ("change", "text"),
    [
        ({"v": 3}, "unsupported protocol version 3"),
        ({"v": "1"}, "unsupported protocol version '1'"),
        ({"v": 1.0}, "unsupported protocol version 1.0"),
        ({"type": "bye"}, "unknown message type 'bye'"),
        ({"seq": 0}, "seq"),
        ({"seq": True}, "seq"),
        ({"time": "now"}, "time"),
        ({"scalars": {"loss": True}}, 'must be a number or one of the strings "NaN"'),
        ({"scalars": {"loss": "nan"}}, "scalars.loss"),
        ({"scalars": {"loss": 10**400}}, "scalars.loss: is too large for a float64"),
        ({"scalars": {"x" * 129: 1.0}}, "scalars"),
        ({"params": {"grad_norm": b64(f32(1, 2, 3))}}, "decodes to 12 bytes, expected 8 (2 parameters x 4 bytes)"),
        ({"params": {"grad_norm": "AAA"}}, "not valid base64"),
        ({"params": {"grad_norm": 5}}, "must be a base64 string"),
        ({"params": {"grad_status": b64(f32(1, 2))}}, "top-level grad_status"),
        ({"grad_status": b64(np.array([0, 4], "u1"))}, "has a code above 3"),
        ({"grad_status": b64(np.array([0], "u1"))}, "expected 2"),
        ({"extra": 1}, "extra: Extra inputs are not permitted"),
    ],
)
def test_invalid_steps_are_refused_with_a_clear_message(change: dict[str, object], text: str) -> None:
    with pytest.raises(ProtocolError) as info:
        parse({**step(1, 1), **change})
    assert text in str(info.value)


def test_a_steps_message_stands_for_its_steps_exactly() -> None:
    grads = np.array([[1.5, np.nan], [-0.0, np.inf], [3.0, 4.0]], dtype="<f4")
    grads.view("<u4")[0, 1] = ABSENT_BITS
    m = parse(
        steps(
            7,
            [4, 5, 9],
            scalars={"loss": [1.0, "NaN", "-Infinity"]},
            arrays={"grad_norm": grads},
            grad_status=[[2, 0], [1, 3], [2, 2]],
            times=[10.0, 11.0, 12.5],
        )
    )
    assert isinstance(m, Steps)
    expanded = m.expand()
    assert [(s.seq, s.step, s.time) for s in expanded] == [(7, 4, 10.0), (7, 5, 11.0), (7, 9, 12.5)]
    for i, s in enumerate(expanded):
        assert isinstance(s, Step)
        assert s.arrays() == {"grad_norm": grads[i].tobytes(), "grad_status": bytes([[2, 0], [1, 3], [2, 2]][i])}
    assert expanded[0].scalars == {"loss": 1.0} and math.isnan(expanded[1].scalars["loss"])
    assert expanded[2].scalars["loss"] == -math.inf
    one = parse(steps(1, [3]))  # no arrays, no scalars: a step with its time only
    assert isinstance(one, Steps) and [s.step for s in one.expand()] == [3]


def test_an_expanded_step_is_the_step_pydantic_would_make() -> None:
    """`Steps.expand` sets a Step's attributes itself (pydantic's model_construct costs most of a
    frame's parsing): what it makes equals model_construct's and a validated `step` message's."""
    m = parse(steps(7, [4, 5], scalars={"loss": [1.0, 2.0]}, arrays={"grad_norm": np.ones((2, 2))}, times=[1.0, 2.0]))
    assert isinstance(m, Steps)
    for i, s in enumerate(m.expand()):
        made = Step.model_construct(**dict(vars(s)))
        assert s == made and list(vars(s)) == list(vars(made)) == list(Step.model_fields)
        assert s.model_fields_set == made.model_fields_set
        assert (s.__pydantic_extra__, s.__pydantic_private__) == (made.__pydantic_extra__, made.__pydantic_private__)
        alone = parse(
            step(7, [4, 5][i], scalars={"loss": [1.0, 2.0][i]}, arrays={"grad_norm": np.ones(2)}, time=[1.0, 2.0][i])
        )
        assert s.model_dump(exclude={"v"}) == alone.model_dump(exclude={"v"})
        with pytest.raises(ValidationError):  # frozen, as a validated one
            s.step = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("change", "text"),
    [
        ({"step": []}, "step: List should have at least 1 item"),
        ({"step": [1, 1]}, "step must be strictly increasing"),
        ({"step": [2, 1]}, "step must be strictly increasing"),
        ({"step": list(range(4097)), "time": [0.0] * 4097}, "at most 4096 items"),
        ({"time": [1.0]}, "time has 1 values for 2 steps"),
        ({"scalars": {"loss": [1.0]}}, "scalars.loss has 1 values for 2 steps"),
        ({"scalars": {"loss": [1.0, "nan"]}}, "scalars.loss"),
        (
            {"params": {"grad_norm": b64(f32(1, 2))}},
            "params.grad_norm decodes to 8 bytes, expected 16 (2 steps x 2 parameters x 4 bytes)",
        ),
        ({"params": {"grad_norm": "AAA"}}, "not valid base64"),
        ({"params": {"grad_status": b64(f32(1, 2, 3, 4))}}, "top-level grad_status"),
        ({"grad_status": b64(np.array([0, 1, 2, 4], "u1"))}, "grad_status has a code above 3"),
        ({"grad_status": b64(np.array([0, 1], "u1"))}, "grad_status decodes to 2 bytes, expected 4"),
        ({"seq": 0}, "seq"),
        ({"extra": 1}, "extra: Extra inputs are not permitted"),
    ],
)
def test_invalid_steps_messages_are_refused_with_a_clear_message(change: dict[str, object], text: str) -> None:
    with pytest.raises(ProtocolError) as info:
        parse({**steps(1, [1, 2]), **change})
    assert text in str(info.value)


def test_invalid_hellos() -> None:
    bad_id = hello("x")
    bad_id["run"]["id"] = "has space"
    twice = hello("x", params=("a.weight", "a.weight"))
    wrong_numel = hello("x")
    wrong_numel["params"][0]["numel"] = 7
    for message, text in ((bad_id, "run.id"), (twice, "appears twice"), (wrong_numel, "does not match shape")):
        with pytest.raises(ProtocolError, match=text):
            parse(message, None)


def test_a_ranks_hello_carries_its_job_and_its_pieces() -> None:
    message = parse(rank_hello("job-1", 1, 2, local_numel=[3, 0], counted=[True, False]), None)
    assert isinstance(message, Hello) and message.dist is not None
    assert (message.run.id, message.dist.job, message.dist.rank, message.dist.world_size) == ("job-1.r1", "job-1", 1, 2)
    assert [(p.piece_numel, p.counted) for p in message.params] == [(3, True), (0, False)]
    plain = parse(hello("x"), None)
    assert isinstance(plain, Hello) and plain.dist is None
    assert [(p.piece_numel, p.counted) for p in plain.params] == [(6, True), (3, True)]


def _with(message: dict[str, object], **changes: object) -> dict[str, object]:
    out = json.loads(json.dumps(message))
    for path, value in changes.items():
        *parents, leaf = path.split("__")
        node = out
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[leaf] = value
    return out


@pytest.mark.parametrize(
    ("message", "text"),
    [
        (_with(rank_hello("job", 1, 2), run__id="job.r0"), "must be the stream id 'job.r1'"),
        (_with(rank_hello("job", 1, 2), run__id="other"), "must be the stream id 'job.r1'"),
        (_with(hello("x"), run__id="job.r1"), "is a rank's stream id"),
        (_with(rank_hello("job", 1, 2), dist__rank=2), "rank 2 is not below world_size 2"),
        (_with(rank_hello("job", 1, 2), dist__world_size=0), "dist.world_size"),
        (_with(rank_hello("job", 1, 2), dist__world_size=65537), "dist.world_size"),
        (_with(rank_hello("job", 0, 2), dist__job="j" * 57, run__id="j" * 57 + ".r0"), "dist.job"),
        (_with(rank_hello("job", 0, 2), dist__job="a.b", run__id="a.b.r0"), "run.id"),
        (_with(rank_hello("job", 0, 2), dist__extra=1), "dist.extra"),
        (_with(rank_hello("job", 0, 2), params__0__local_numel=7), "local_numel 7 is above numel 6"),
        (_with(rank_hello("job", 0, 2), params__0__local_numel=-1), "local_numel"),
        (_with(rank_hello("job", 0, 2), params__0__counted=1), "counted"),
    ],
)
def test_invalid_rank_hellos_are_refused_with_a_clear_message(message: dict[str, object], text: str) -> None:
    with pytest.raises(ProtocolError) as info:
        parse(message, None)
    assert text in str(info.value)


def test_job_ids_leave_room_for_every_rank_in_64_characters() -> None:
    job = "j" * 56
    message = parse(_with(rank_hello(job, 65535, 65536)), None)
    assert isinstance(message, Hello) and len(message.run.id) == 63


def test_frames_that_are_not_json_objects() -> None:
    for frame, text in (("{", "not valid JSON"), ("[1]", "JSON object"), ('{"v": NaN}', "bare NaN")):
        with pytest.raises(ProtocolError, match=text):
            parse_message(frame)


def test_arrays_need_the_parameter_count() -> None:
    with pytest.raises(ProtocolError, match="send hello first"):
        parse(step(1, 1, arrays={"grad_norm": f32(1, 2)}), None)


def test_absent_is_told_from_other_nans_by_its_bits() -> None:
    values = with_absent(f32(np.nan, 1.0, np.nan), 2)
    assert absent_mask(values).tolist() == [False, False, True]
    assert metric_list(values) == ["NaN", 1.0, None]
    back = metric_array(metric_list(values))
    assert back.view("<u4")[2] == ABSENT_BITS and math.isnan(back[0]) and back[1] == 1.0
    assert decode_floats(values.tobytes()).tobytes() == values.tobytes()


def test_float_list_words() -> None:
    values = np.array([1.5, np.nan, np.inf, -np.inf, -0.0])
    out = float_list(values, np.array([False, False, False, False, False]))
    assert out[:4] == [1.5, "NaN", "Infinity", "-Infinity"] and math.copysign(1, out[4]) == -1
    assert float_list(values, np.array([True, False, False, False, False]))[0] is None

"""What the framework callbacks share: JSON-safe configs, run names, logged numbers."""

from __future__ import annotations

import enum
import json
import logging
from pathlib import Path

import pytest
import torch

import gradwatch
from gradwatch.integrations.common import forward, json_safe, run_name, scalars
from support.sent import sent_steps

pytestmark = pytest.mark.unit


class Color(enum.Enum):
    RED = "red"


def test_json_safe_makes_any_config_strict_json() -> None:
    config = {
        "lr": 0.1,
        "nan": float("nan"),
        "inf": float("-inf"),
        "color": Color.RED,
        "path": Path("/tmp/x"),
        "t": torch.tensor(2.5),
        "nested": {1: (1, 2), "set": {3}},
        "obj": object,
        "none": None,
        "flag": True,
    }
    safe = json_safe(config)
    json.dumps(safe, allow_nan=False)  # raises if anything is left that strict JSON cannot carry
    assert safe["lr"] == 0.1 and safe["nan"] == "nan" and safe["inf"] == "-inf"
    assert (safe["color"], safe["path"], safe["t"], safe["none"], safe["flag"]) == ("red", "/tmp/x", 2.5, None, True)
    assert safe["nested"] == {"1": [1, 2], "set": [3]} and safe["obj"] == repr(object)


def test_json_safe_stops_at_a_cycle() -> None:
    loop: dict[str, object] = {}
    loop["self"] = loop
    json.dumps(json_safe(loop), allow_nan=False)


@pytest.mark.parametrize(
    "name, expected",
    [
        (None, None),
        ("", None),
        ("  ", None),
        ("lightning_logs/version_3", "lightning_logs/version_3"),
        ("a\nb", "a b"),
        ("/very/long/" + "x" * 300 + "/end", ("x" * 300 + "/end")[-200:]),
    ],
)
def test_run_name(name: object, expected: object) -> None:
    assert run_name(name) == expected


def test_scalars_keep_numbers_under_valid_names() -> None:
    logs = {
        "loss": 1.5,
        "step": 3,
        "flag": True,
        "text": "x",
        "bad name": 1.0,
        "t": torch.tensor(0.5),
        "vec": torch.ones(3),
        "lr/pg0": 1e-3,
    }
    out = scalars(logs)
    assert set(out) == {"loss", "step", "t", "lr/pg0"} and out["step"] == 3.0 and float(out["t"]) == 0.5


def test_a_failure_to_forward_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w = gradwatch.watch(opt, model=model, server="http://127.0.0.1:9", warn=False)

    def broken() -> dict[str, float]:
        raise RuntimeError("the framework's metrics cannot be read now")

    with caplog.at_level(logging.ERROR, logger="gradwatch"):
        assert forward(w, broken) is False
    assert "stopped recording the framework's logged numbers" in caplog.text
    assert forward(w, lambda: {"loss": 2.0}) is True
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
    assert sent_steps(w)[-1]["scalars"]["loss"] == 2.0
    w.close(timeout=0.1)

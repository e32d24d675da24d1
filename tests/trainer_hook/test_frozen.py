"""Parameters in the optimizer with requires_grad=False are reported as frozen in hello."""

from __future__ import annotations

import pytest
import torch

from gradwatch.layout import build_layout

pytestmark = pytest.mark.unit


def test_frozen_parameters_are_listed() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    model[0].weight.requires_grad_(False)
    layout = build_layout([torch.optim.SGD(model.parameters(), lr=0.1)], model)
    assert layout.frozen == ["0.weight"]
    assert layout.unoptimized == []

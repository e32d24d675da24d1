"""Parameters are named as the framework shows them to its users (its own `state_dict()` keys),
not with the path components of its wrappers: Lightning Fabric's `_forward_module.`, accelerate's
`prepare` (with torch.compile's `_orig_mod.`, the names of the model given to it). Each against the real framework, as watch() names
them (build_layout over the unwrapped optimizer, the framework's model)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch import nn

from gradwatch.layout import build_layout
from gradwatch.unwrap import unwrap

pytestmark = pytest.mark.unit


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Sequential(nn.Linear(8, 2)))


NAMES = ["0.weight", "0.bias", "2.0.weight", "2.0.bias"]


def watched_names(optimizer: object, wrapped: nn.Module) -> list[str]:
    inner, _ = unwrap(optimizer)
    return [w.name for w in build_layout([inner], wrapped, rank=None).params]


def test_lightning_fabric_names_are_its_state_dict_keys() -> None:
    fabric_mod = pytest.importorskip("lightning.fabric", reason="Lightning is installed by requirements-test.txt")
    fabric = fabric_mod.Fabric(accelerator="cpu", devices=1)
    net = model()
    wrapped, opt = fabric.setup(net, torch.optim.AdamW(net.parameters(), lr=1e-3))
    assert [n for n, _ in wrapped.named_parameters()][0] == "_forward_module.0.weight"  # the premise
    assert list(wrapped.state_dict()) == NAMES
    assert watched_names(opt, wrapped) == NAMES


@pytest.fixture
def accelerate_state() -> Iterator[None]:
    accelerate = pytest.importorskip("accelerate", reason="accelerate is installed by requirements-test.txt")
    accelerate.state.AcceleratorState._reset_state(True)
    yield
    accelerate.state.AcceleratorState._reset_state(True)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.compile's own imports
def test_accelerate_with_torch_compile_names_are_its_state_dict_keys(accelerate_state: None) -> None:
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True, dynamo_backend="eager")
    net = model()
    wrapped, opt = accelerator.prepare(net, torch.optim.AdamW(net.parameters(), lr=1e-3))
    assert [n for n, _ in wrapped.named_parameters()][0] == "_orig_mod.0.weight"  # the premise
    # the model the user gave prepare(): torch.compile's `_orig_mod.` is no name of theirs (accelerate's
    # get_state_dict() keeps it by default, unwrap_model(keep_torch_compile=False) does not)
    assert list(accelerator.unwrap_model(wrapped, keep_torch_compile=False).state_dict()) == NAMES
    assert watched_names(opt, wrapped) == NAMES

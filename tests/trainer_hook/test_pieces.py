"""Reported parameters in one process: names without wrapper components, and a hello that says
nothing of pieces unless the run is distributed (real distributed jobs: test_pieces_dist.py)."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

import gradwatch
from gradwatch.distributed import job_rank
from gradwatch.layout import build_layout
from gradwatch.measure import Probe
from gradwatch.pieces import strip_names
from support.probing import after_step, before_step
from support.sent import measured, sent_steps

pytestmark = pytest.mark.unit

NOWHERE = "http://127.0.0.1:9"
SINGLE_PROCESS_KEYS = {"name", "shape", "numel", "dtype", "group", "optimizer"}


def test_strip_names_drops_the_components_that_are_wrappers_wherever_they_are() -> None:
    wrappers = frozenset({"module", "_orig_mod", "_orig_mod.enc._checkpoint_wrapped_module"})
    assert strip_names(
        [
            "module.0.weight",
            "_orig_mod.enc._checkpoint_wrapped_module.lin.weight",
            "_orig_mod.enc.module.bias",  # `module` here is no wrapper's
            "modules.x",
        ],
        wrappers,
    ) == ["0.weight", "enc.lin.weight", "enc.module.bias", "modules.x"]


def test_strip_names_keeps_the_originals_that_would_collide() -> None:
    assert strip_names(["weight", "module.weight", "module.bias"], frozenset({"module"})) == [
        "weight",
        "module.weight",
        "bias",
    ]


class Holder(torch.nn.Module):
    """A model whose own names use a wrapper's component: `module.weight` beside `weight`."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(2))
        self.module = torch.nn.Linear(2, 2)


class Block(torch.nn.Module):
    """A user's block whose attribute is called `module`, as wrappers name theirs."""

    def __init__(self) -> None:
        super().__init__()
        self.module = torch.nn.Linear(2, 2)


def test_a_users_own_attribute_named_like_a_wrappers_is_kept() -> None:
    model = torch.nn.Sequential()
    model.add_module("enc", Block())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    assert [w.name for w in build_layout([opt], model, rank=None).params] == [
        "enc.module.weight",
        "enc.module.bias",
    ]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.compile's own imports
def test_a_users_module_attribute_is_kept_inside_a_compiled_and_checkpointed_model() -> None:
    inner = torch.nn.Sequential(Block(), checkpoint_wrapper(Block()))
    model = torch.compile(inner)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    names = [w.name for w in build_layout([opt], model, rank=None).params]
    assert names == ["0.module.weight", "0.module.bias", "1.module.weight", "1.module.bias"]


def test_names_given_as_pairs_are_kept_as_given() -> None:
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    pairs = list(model.named_parameters("module"))
    assert [w.name for w in build_layout([opt], pairs, rank=None).params] == ["module.weight", "module.bias"]


def test_layout_names_stay_unique() -> None:
    model = Holder()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    assert [w.name for w in build_layout([opt], model, rank=None).params] == ["weight", "module.weight", "module.bias"]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.compile's own imports
def test_compiled_and_checkpointed_models_report_the_original_names() -> None:
    """torch.compile's `_orig_mod.` and activation checkpointing's `_checkpoint_wrapped_module.`
    (naming needs no compilation: the wrappers' names are read, no forward runs)."""
    inner = torch.nn.Sequential(torch.nn.Linear(3, 4), checkpoint_wrapper(torch.nn.Linear(4, 2)))
    model = torch.compile(inner)
    names = [n for n, _ in model.named_parameters()]
    assert names[0].startswith("_orig_mod.") and "_checkpoint_wrapped_module" in names[2]  # the premise
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    layout = build_layout([opt], model, rank=None)
    assert [w.name for w in layout.params] == ["0.weight", "0.bias", "1.weight", "1.bias"]
    frozen = torch.optim.Adam(list(inner[0].parameters()), lr=1e-3)  # the others are left out
    assert build_layout([frozen], model, rank=None).unoptimized == ["1.weight", "1.bias"]


def test_single_process_hello_is_unchanged() -> None:
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    params = build_layout([opt], model, rank=None).hello_params()
    assert [set(p) for p in params] == [SINGLE_PROCESS_KEYS] * 2
    assert [(p["shape"], p["numel"]) for p in params] == [([2, 3], 6), ([2], 2)]


def test_distributed_hello_counts_plain_params_on_rank_0_only() -> None:
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for rank, counted in ((0, True), (1, False)):
        params = build_layout([opt], model, rank=rank).hello_params()
        assert [(p["local_numel"], p["counted"]) for p in params] == [(6, counted), (2, counted)]


@pytest.mark.parametrize(
    ("env", "rank"),
    [({}, None), ({"WORLD_SIZE": "1", "RANK": "0"}, None), ({"WORLD_SIZE": "4", "RANK": "3"}, 3)],
)
def test_job_rank_from_torchrun_environment(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], rank: int) -> None:
    assert not torch.distributed.is_initialized()
    for key in ("WORLD_SIZE", "RANK"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert job_rank() == rank


def test_param_before_norm_only_in_a_distributed_job() -> None:
    """With updates=True a rank also sends the local norm before the update (the server divides
    the global norms for update_ratio); a single process sends what it always sent."""
    for rank, sent in ((None, False), (0, True)):
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        probe = Probe(build_layout([opt], model, rank=rank), updates=True)
        before = [torch.linalg.vector_norm(p.detach()).item() for p in model.parameters()]
        model(torch.randn(4, 3)).sum().backward()
        before_step(probe, 1)
        opt.step()
        metrics, _, _ = after_step(probe, {}).resolve()
        assert ("param_before_norm" in metrics) is sent
        if sent:
            assert metrics["param_before_norm"].tolist() == pytest.approx(before, rel=1e-6)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.compile's own imports
def test_compiled_model_trains_under_its_original_names() -> None:
    """A real torch.compile'd model (inductor on CPU, a few seconds) stepped under watch()."""
    torch.manual_seed(0)
    model = torch.compile(torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w = gradwatch.watch(opt, model=model, server=NOWHERE, warn=False)
    want = []
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(5, 3)).pow(2).sum().backward()
        want.append({n.removeprefix("_orig_mod."): p.grad.norm().item() for n, p in model.named_parameters()})
        opt.step()
    msgs = measured(sent_steps(w))
    w.close(timeout=0.1)
    assert [p["name"] for p in w._sender.hello["params"]] == ["0.weight", "0.bias", "2.weight", "2.bias"]
    for m, grads in zip(msgs, want):
        assert m["params"]["grad_norm"] == pytest.approx(grads, rel=1e-6)

"""autowatch (what gradwatch-run installs), in this process: which optimizers one set is, what
names the parameters, and a script's own watch() taking its optimizers from the launcher. The
whole path, against a real server, is tests/trainer_hook/test_launch.py."""

from __future__ import annotations

import gc

import pytest
import torch
from torch import nn

import gradwatch
from gradwatch import autowatch
from gradwatch.options import WatchOptions

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def no_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing listens there: the runs spool into the test's own folder (conftest's spool_dir).
    The optimizers other tests left alive are no part of this test's sets."""
    monkeypatch.setenv("GRADWATCH_SERVER", "http://127.0.0.1:9")
    gc.collect()
    for obj in gc.get_objects():
        if issubclass(type(obj), torch.optim.Optimizer):
            autowatch._decided.add(obj)


def test_a_watch_after_the_first_step_closes_the_launchers_run_and_one_before_is_left_alone() -> None:
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    auto = autowatch.watch_new(opt)
    assert auto is not None and [n.name for n in auto.layout.params] == ["weight", "bias"]
    own = gradwatch.watch(opt, model=model, warn=False)
    try:
        assert auto._closed and not own._closed  # the script's own watch() takes over
        assert autowatch._first_step(opt, (), {}) is None and opt in autowatch._decided
    finally:
        own.close(timeout=0.5)
    mine = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    theirs = gradwatch.watch(mine, warn=False)  # before any step: the launcher never watches it
    try:
        assert autowatch.watch_new(mine) is None
    finally:
        theirs.close(timeout=0.5)


def test_an_optimizer_kept_inside_another_is_not_a_set_of_its_own() -> None:
    class Holder(torch.optim.Optimizer):
        """Steps an inner optimizer it keeps, as ZeroRedundancyOptimizer keeps `.optim`."""

        def __init__(self, params: list[nn.Parameter]) -> None:
            super().__init__(params, {"lr": 0.1})
            self.optim = torch.optim.SGD(params, lr=0.1)

        def step(self, closure: object = None) -> None:  # type: ignore[override]
            self.optim.step()

    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 1))
    holder = Holder(list(model.parameters()))
    w = autowatch.watch_new(holder)
    try:
        assert w is not None and w.layout.optimizers == [holder] and holder.optim in autowatch._decided
        assert [p.name for p in w.layout.params] == ["0.weight", "0.bias", "1.weight", "1.bias"]
    finally:
        w.close(timeout=0.5)


def test_parameters_of_two_models_are_named_after_each_model() -> None:
    gen, disc = nn.Linear(2, 3), nn.Sequential(nn.Linear(3, 1))
    opts = [torch.optim.SGD(gen.parameters(), lr=0.1), torch.optim.SGD(disc.parameters(), lr=0.1)]
    named = autowatch.owner(opts, [disc, disc[0], gen])
    assert isinstance(named, list)
    assert [n for n, _ in named] == ["Linear.weight", "Linear.bias", "Sequential.0.weight", "Sequential.0.bias"]
    assert autowatch.owner(opts[:1], [disc, disc[0], gen]) is gen
    assert autowatch.owner(opts, []) is None


def test_the_launchers_setting_is_checked() -> None:
    assert autowatch.settings_from_env('{"project": "p", "run": null, "every": 1}') == WatchOptions(
        project="p", run=None, every=1, warn=False
    )
    for bad in ("", "[1]", '{"bogus": 1}'):
        with pytest.raises(ValueError, match="GRADWATCH_AUTOWATCH"):
            autowatch.settings_from_env(bad)

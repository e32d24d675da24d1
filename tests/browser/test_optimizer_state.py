"""The run page's optimizer-state cards, for runs the real hook sent from real training.

A tiny model is trained here with `gradwatch.watch()` into a real `gradwatch serve`; the run page
in a real Chromium must draw one card per `<key>_norm` state metric the hook sent (SGD's
`momentum_buffer_norm`, RMSprop's `square_avg_norm`), titled for what it is, and its values
must be the norms torch computes of the optimizer's state (the oracle, taken after each step).

Run: .venv/bin/python -m pytest tests/browser/test_optimizer_state.py
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from playwright import sync_api

import gradwatch
from support.browser import Page
from support.server import ServerProcess

STEPS = 12


def train(
    server: ServerProcess, name: str, make_opt: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer], key: str
) -> tuple[str, dict[str, float]]:
    """Train a small MLP; the run's id and each parameter's ‖state[key]‖ after the last step."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = make_opt(list(model.parameters()))
    w = gradwatch.watch(opt, model=model, run=name, project="optimizer-state", server=server.url, warn=False)
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        loss = model(torch.randn(16, 6)).pow(2).mean()
        loss.backward()
        w.log(loss=loss)
        opt.step()
    w.close(timeout=30)
    assert w.pending == 0
    oracle = {n: float(torch.linalg.vector_norm(opt.state[p][key].double())) for n, p in model.named_parameters()}
    return w.run_id, oracle


@pytest.mark.parametrize(
    ("optimizer", "key", "card", "title"),
    [
        ("sgd", "momentum_buffer", "momentum-buffer-norm", "Momentum buffer norm"),
        ("rmsprop", "square_avg", "square-avg-norm", "RMSprop square average"),
    ],
)
def test_state_cards_follow_the_state_the_hook_sent(
    dash: ServerProcess, page: Page, optimizer: str, key: str, card: str, title: str
) -> None:
    make = {
        "sgd": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
        "rmsprop": lambda ps: torch.optim.RMSprop(ps, lr=0.01),
    }[optimizer]
    run_id, oracle = train(dash, f"state-{optimizer}", make, key)
    p = page.open(f"{dash.url}/runs/{run_id}")
    section = p.locator(f'[data-card="{card}"]')
    sync_api.expect(section).to_be_visible()
    sync_api.expect(section.locator("h2")).to_have_text(title)
    section.scroll_into_view_if_needed()
    page.wait_points(card, STEPS)
    # No card for a state this optimizer has not got.
    assert p.locator('[data-card="exp-avg-norm"]').is_hidden()
    traces = p.evaluate(
        """c => document.querySelector(`[data-chart="${c}"]`).data
        .filter(t => t.name !== 'NaN / Inf').map(t => [t.name, t.x, t.y])""",
        card,
    )
    assert {name for name, _, _ in traces} == set(oracle)  # four parameters: all in the top 5
    for name, xs, ys in traces:
        assert xs == list(range(1, STEPS + 1)), name
        assert math.isclose(ys[-1], oracle[name], rel_tol=1e-5), (name, ys[-1], oracle[name])

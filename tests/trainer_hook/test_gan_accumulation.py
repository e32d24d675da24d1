"""A GAN: the generator's backward pass runs through the discriminator after D's step and fills
D's `.grad`, which D's `zero_grad()` clears before D's own backward. Passes that land before a
clear count toward no step, so a correct GAN loop shows one backward pass per step, cleared.

How each backward pass of one round is attributed, for D's parameters:
1. D's loss backward, after `opt_d.zero_grad()`: the first pass since the clear, the one D's
   step uses (`backward_passes` 1, `grad_clear` 1 = set to None).
2. G's loss backward, through D: lands after D's step, on D's `.grad`; the next round's
   `opt_d.zero_grad()` clears it before pass 1 of that round, so it counts toward no step.
For G's parameters only pass 2 lands, after `opt_g.zero_grad()`: one pass, cleared.
Gradient norms are checked against an oracle: step pre-hooks registered before gradwatch's.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import gradwatch
from support.sent import measured, sent_steps

pytestmark = pytest.mark.unit

NOWHERE = "http://127.0.0.1:9"
ROUNDS = 5


def norm(t: torch.Tensor | None) -> float | None:
    return None if t is None else float(torch.linalg.vector_norm(t.detach().float()))


def gan_rounds(watch_both: bool, clear_d: str = "zero_grad") -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """ROUNDS rounds of D then G; returns the steps sent and, per D step, the oracle's D norms."""
    torch.manual_seed(0)
    gen = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 5))
    disc = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    model = torch.nn.ModuleDict({"gen": gen, "disc": disc})
    opt_d = torch.optim.Adam(disc.parameters(), lr=1e-3)
    opt_g = torch.optim.Adam(gen.parameters(), lr=1e-3)
    oracle: list[dict[str, Any]] = []
    opt_d.register_step_pre_hook(
        lambda o, a, k: oracle.append({f"disc.{n}": norm(p.grad) for n, p in disc.named_parameters()})
    )
    if watch_both:
        w = gradwatch.watch([opt_d, opt_g], model=model, server=NOWHERE, warn=False)
    else:
        w = gradwatch.watch(opt_d, model=model, server=NOWHERE, warn=False)
    for _ in range(ROUNDS):
        if clear_d == "zero_grad":
            opt_d.zero_grad()
        elif clear_d == "zero-filled":
            opt_d.zero_grad(set_to_none=False)
        fake = gen(torch.randn(4, 3))
        (disc(fake.detach()).mean() - disc(torch.randn(4, 5)).mean()).backward()
        opt_d.step()
        opt_g.zero_grad()
        (-disc(fake).mean()).backward()  # fills D's .grad as well as G's
        opt_g.step()
    msgs = sent_steps(w)
    w.close(timeout=0.1)
    assert [m["step"] for m in measured(msgs)] == list(range(1, ROUNDS + 1))
    return msgs, oracle


D_PARAMS = ["disc.0.weight", "disc.0.bias", "disc.2.weight", "disc.2.bias"]


@pytest.mark.parametrize("watch_both", [False, True], ids=["D-alone", "D-and-G"])
def test_a_correct_gan_loop_is_one_cleared_pass_per_step(watch_both: bool) -> None:
    msgs, oracle = gan_rounds(watch_both)
    params = D_PARAMS + (["gen.0.weight", "gen.2.bias"] if watch_both else [])
    for m, want in zip(msgs, oracle, strict=True):
        for name in params:
            assert m["params"]["backward_passes"][name] == 1.0, (m["step"], name)
            assert m["params"]["grad_clear"][name] == (None if m["step"] == 1 else 1.0), (m["step"], name)
        for name in D_PARAMS:
            assert m["params"]["grad_norm"][name] == pytest.approx(want[name], rel=1e-5), (m["step"], name)
        assert m["scalars"]["backward_passes"] == 1.0


def test_a_zero_filled_clear_between_passes_is_seen_as_one() -> None:
    """`zero_grad(set_to_none=False)` between G's pass and D's: the same tensor, written in place."""
    msgs, _ = gan_rounds(watch_both=False, clear_d="zero-filled")
    assert [m["params"]["grad_clear"]["disc.0.weight"] for m in msgs] == [None] + [2.0] * (ROUNDS - 1)
    assert all(m["params"]["backward_passes"]["disc.0.weight"] == 1.0 for m in msgs)


def test_a_forgotten_zero_grad_of_d_is_still_caught() -> None:
    """D never cleared: each D step uses the sum of G's pass and D's own on top of everything
    before (`grad_clear` 0 = not cleared), which the server reports as an error."""
    msgs, _ = gan_rounds(watch_both=False, clear_d="never")
    assert [m["params"]["grad_clear"]["disc.0.weight"] for m in msgs] == [None] + [0.0] * (ROUNDS - 1)
    assert [m["params"]["backward_passes"]["disc.0.weight"] for m in msgs] == [1.0] + [2.0] * (ROUNDS - 1)


def test_a_clear_between_micro_batches_restarts_the_count() -> None:
    """Two passes, a clear, then three passes: the step used three, after a clear (seen at step 1
    too, where there is no earlier step to compare with)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w = gradwatch.watch(opt, model=model, server=NOWHERE, warn=False)
    for _ in range(2):
        for micro in (2, 3):
            opt.zero_grad()
            for _ in range(micro):
                model(torch.randn(2, 3)).sum().backward()
        opt.step()
    msgs = sent_steps(w)
    w.close(timeout=0.1)
    assert [m["params"]["backward_passes"]["weight"] for m in msgs] == [3.0, 3.0]
    assert [m["params"]["grad_clear"]["weight"] for m in msgs] == [1.0, 1.0]

"""Several optimizers in one run (`watch([opt_d, opt_g])`): a step is a round in which each
optimizer stepped; each one's gradients are read before its own step and its state after,
checked against a naive torch oracle taken by hooks registered before gradwatch's."""

from __future__ import annotations

import math

import pytest
import torch

import gradwatch
from support.sent import measured, sent_steps

pytestmark = pytest.mark.unit

NOWHERE = "http://127.0.0.1:9"


def norm(t: torch.Tensor | None) -> float | None:
    return None if t is None else float(torch.linalg.vector_norm(t.detach().float()))


class Gan(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gen = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 5))
        self.disc = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def oracle_hooks(
    opt: torch.optim.Optimizer,
    params: dict[str, torch.Tensor],
    oracle: dict[tuple[int, str], dict[str, float | None]],
    round_of: list[int],
) -> None:
    """Record, at the first step of `opt` in each round, grad norms before and state after."""
    seen: set[int] = set()

    def before(o, args, kwargs):
        if round_of[0] in seen:
            return
        for n, p in params.items():
            oracle[(round_of[0], n)] = {"grad_norm": norm(p.grad)}

    def after(o, args, kwargs):
        if round_of[0] in seen:
            return
        seen.add(round_of[0])
        for n, p in params.items():
            st = o.state.get(p, {})
            oracle[(round_of[0], n)].update(
                param_norm=norm(p),
                **{f"{k}_norm": norm(v) for k, v in st.items() if isinstance(v, torch.Tensor) and v.shape == p.shape},
            )

    opt.register_step_pre_hook(before)
    opt.register_step_post_hook(after)


@pytest.mark.parametrize("critic_steps", [1, 3])
def test_gan_rounds_match_the_oracle(critic_steps: int) -> None:
    torch.manual_seed(0)
    gan = Gan()
    opt_d = torch.optim.Adam(gan.disc.parameters(), lr=1e-3)
    opt_g = torch.optim.SGD(gan.gen.parameters(), lr=1e-2, momentum=0.9)
    oracle: dict[tuple[int, str], dict[str, float | None]] = {}
    round_of = [0]
    oracle_hooks(opt_d, {f"disc.{n}": p for n, p in gan.disc.named_parameters()}, oracle, round_of)
    oracle_hooks(opt_g, {f"gen.{n}": p for n, p in gan.gen.named_parameters()}, oracle, round_of)
    w = gradwatch.watch([opt_d, opt_g], model=gan, server=NOWHERE, warn=False)
    rounds = 6
    for r in range(1, rounds + 1):
        round_of[0] = r
        for _ in range(critic_steps):
            opt_d.zero_grad()
            fake = gan.gen(torch.randn(4, 3)).detach()
            (gan.disc(fake).mean() - gan.disc(torch.randn(4, 5)).mean()).backward()
            opt_d.step()
        opt_g.zero_grad()
        gan.disc.zero_grad()
        (-gan.disc(gan.gen(torch.randn(4, 3))).mean()).backward()
        opt_g.step()
    msgs = sent_steps(w)
    w.close(timeout=0.1)

    assert w.step == rounds
    assert [m["step"] for m in msgs] == list(range(1, rounds + 1))
    assert len(measured(msgs)) == rounds
    names = {p.name for p in w.layout.params}
    assert names == {f"gen.{n}" for n, _ in gan.gen.named_parameters()} | {
        f"disc.{n}" for n, _ in gan.disc.named_parameters()
    }
    for m in msgs:
        r = m["step"]
        assert m["scalars"]["opt/0/steps"] == r * critic_steps
        assert m["scalars"]["opt/1/steps"] == r
        assert m["scalars"]["lr/0"] == pytest.approx(1e-3) and m["scalars"]["lr/1"] == pytest.approx(1e-2)
        for name in names:
            want = oracle[(r, name)]
            for metric, value in want.items():
                got = m["params"][metric][name]
                assert got is not None and value is not None, (r, name, metric)
                assert math.isclose(got, value, rel_tol=1e-5, abs_tol=1e-7), (r, name, metric, got, value)
        # Adam's moments exist only for the discriminator, momentum only for the generator
        assert m["params"]["exp_avg_norm"]["gen.0.weight"] is None
        assert m["params"]["momentum_buffer_norm"]["disc.0.weight"] is None
        # each optimizer's own backward passes: the generator's round-trip also fills disc grads
        # (zeroed by gan.disc.zero_grad() before), the disc's counters are from its own first step
        assert m["params"]["backward_passes"]["gen.0.weight"] == 1.0


def test_sampling_and_cheap_facts_span_rounds() -> None:
    gan = Gan()
    opt_d = torch.optim.SGD(gan.disc.parameters(), lr=0.1)
    opt_g = torch.optim.SGD(gan.gen.parameters(), lr=0.2)
    w = gradwatch.watch([opt_d, opt_g], model=gan, server=NOWHERE, every=2, warn=False)
    for _ in range(5):
        for opt in (opt_d, opt_g):
            opt.zero_grad()
            gan.disc(gan.gen(torch.randn(2, 3))).sum().backward()
            opt.step()
    msgs = sent_steps(w)
    w.close(timeout=0.1)
    assert [m["step"] for m in msgs] == [1, 2, 3, 4, 5]
    assert [m["step"] for m in measured(msgs)] == [1, 3, 5]
    assert all(m["scalars"]["lr/1"] == pytest.approx(0.2) for m in msgs)


def test_a_round_left_open_is_sent_at_close() -> None:
    gan = Gan()
    opt_d = torch.optim.SGD(gan.disc.parameters(), lr=0.1)
    opt_g = torch.optim.SGD(gan.gen.parameters(), lr=0.1)
    w = gradwatch.watch([opt_d, opt_g], model=gan, server=NOWHERE, warn=False)
    gan.disc(torch.randn(2, 5)).sum().backward()
    opt_d.step()  # the generator never steps
    assert sent_steps(w) == []
    w._rounds._emit()  # what close() does with an open round, without closing the sender
    msgs = sent_steps(w)
    w.close(timeout=0.1)
    assert [m["step"] for m in msgs] == [1]
    assert msgs[0]["params"]["grad_norm"]["disc.0.weight"] is not None
    assert msgs[0]["params"]["grad_norm"]["gen.0.weight"] is None  # measured nothing for it


def test_amp_with_two_optimizers_reports_unscaled_norms() -> None:
    torch.manual_seed(0)
    gan = Gan()
    opt_d = torch.optim.SGD(gan.disc.parameters(), lr=0.01)
    opt_g = torch.optim.SGD(gan.gen.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    seen: dict[str, float] = {}
    w = gradwatch.watch([opt_d, opt_g], model=gan, server=NOWHERE, scaler=scaler, warn=False)
    opt_d.zero_grad()
    opt_g.zero_grad()
    loss = gan.disc(gan.gen(torch.randn(4, 3))).pow(2).mean()
    scaler.scale(loss).backward()
    for n, p in gan.named_parameters():
        seen[n] = norm(p.grad) / 1024.0
    scaler.unscale_(opt_d)  # the user unscaled one optimizer only
    scaler.step(opt_d)
    scaler.step(opt_g)
    scaler.update()
    msgs = sent_steps(w)
    w.close(timeout=0.1)
    assert len(msgs) == 1
    for n, want in seen.items():
        assert math.isclose(msgs[0]["params"]["grad_norm"][n], want, rel_tol=1e-5), n


def test_names_from_named_parameters_pairs() -> None:
    """Two models, no common Module: name their parameters with (name, parameter) pairs."""
    gen, disc = torch.nn.Linear(3, 5), torch.nn.Linear(5, 1)
    opt_g, opt_d = torch.optim.SGD(gen.parameters(), lr=0.1), torch.optim.SGD(disc.parameters(), lr=0.1)
    frozen = torch.nn.Parameter(torch.ones(2))  # requires grad, in no optimizer
    pairs = [*gen.named_parameters("G"), *disc.named_parameters("D"), ("extra", frozen)]
    w = gradwatch.watch([opt_g, opt_d], model=iter(pairs), server=NOWHERE, warn=False)
    w.close(timeout=0.1)
    assert [p.name for p in w.layout.params] == ["G.weight", "G.bias", "D.weight", "D.bias"]
    assert w.layout.unoptimized == ["extra"]


@pytest.mark.parametrize(
    "bad, error, match",
    [
        ([], ValueError, "empty list"),
        ("twice", ValueError, "same optimizer twice"),
        ("not-an-optimizer", TypeError, "a list of them"),
    ],
)
def test_bad_optimizer_lists(bad, error, match) -> None:
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    arg = {"twice": [opt, opt], "not-an-optimizer": [opt, model]}.get(bad, bad) if isinstance(bad, str) else bad
    with pytest.raises(error, match=match):
        gradwatch.watch(arg, model=model, server=NOWHERE)

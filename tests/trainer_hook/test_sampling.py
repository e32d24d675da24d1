"""Which steps are measured: every=N, every="auto" (its budget, the step time it hears), bad values."""

from __future__ import annotations

import pytest
import torch

import gradwatch
from gradwatch.sampling import AutoInterval, CostMeter, EveryN, StepTimes, make_sampler
from support.sent import measured, sent_steps

pytestmark = pytest.mark.unit

NOWHERE = "http://127.0.0.1:9"


def test_auto_interval_keeps_cost_within_budget() -> None:
    auto = AutoInterval(budget=0.01)
    assert auto(1) and not auto(1)  # step 1 is always measured, once
    auto.observe(cost_s=0.005, step_time_s=0.1)  # 5% of a step: measure every 5th step
    assert auto.interval == 5
    assert [s for s in range(2, 12) if auto(s)] == [6, 11]
    auto.observe(cost_s=0.0001, step_time_s=0.1)  # cheap now: the smoothed cost shrinks the interval
    assert auto.interval < 5
    assert EveryN(3)(1) and not EveryN(3)(2) and EveryN(3)(4)


def test_auto_interval_leaves_room_for_what_every_step_costs() -> None:
    """The cheap facts every step sends count against the budget: the measured steps get what
    is left of it, and none of it when every step's own cost already takes it all."""
    auto = AutoInterval(budget=0.01, max_interval=1000)
    auto.observe(cost_s=0.005, step_time_s=0.1, every_step_s=0.0005)  # half the budget is taken
    assert auto.interval == 10
    spent = AutoInterval(budget=0.01, max_interval=1000)
    spent.observe(cost_s=0.005, step_time_s=0.1, every_step_s=0.002)
    assert spent.interval == 1000


@pytest.mark.parametrize("cost_ms", [0.05, 0.4, 3.0, 40.0])
@pytest.mark.parametrize("every_step_ms", [0.0, 0.1, 0.3])
def test_auto_default_budget_holds_the_whole_cost_under_half_a_percent(cost_ms: float, every_step_ms: float) -> None:
    """every="auto"'s default budget (all watching costs within 0.5% of the unwatched step) bounds the
    measured steps' cost spread over the interval plus what every step costs, the latter already
    subtracted: 0.4% of the step, the rest a margin for what the estimates miss."""
    auto = make_sampler("auto")
    assert isinstance(auto, AutoInterval) and auto.budget == AutoInterval.BUDGET <= 0.005
    step_s, cost_s, every_step_s = 0.1, cost_ms / 1e3, every_step_ms / 1e3
    auto.observe(cost_s=cost_s, step_time_s=step_s, every_step_s=every_step_s)
    assert cost_s / auto.interval + every_step_s <= auto.budget * step_s
    assert cost_s / max(1, auto.interval - 1) + every_step_s > auto.budget * step_s or auto.interval == 1


def test_every_step_cost_counts_both_step_hooks_of_an_unmeasured_step() -> None:
    """What every step costs includes the unmeasured round's pre-step hooks (the flight
    recorder's pass over the gradients runs there), once per round."""
    meter = CostMeter(make_sampler("auto"), False, lambda: 0.0)
    meter.pre_hook(0.002)
    meter.pre_hook(0.0005)  # a second optimizer's step in the same round
    meter.light_hook(0.001)
    assert meter.every_step_s() == pytest.approx(0.0035)
    meter.light_hook(0.001)  # the next round had no pre-step time: none carried over
    assert meter.every_step_s() == pytest.approx(0.001)


def test_a_step_whose_hooks_all_ran_after_it_tells_its_cost_and_start_in_one_call() -> None:
    """The lean path (one post-step hook does the round's work) tells `unmeasured` where the step
    began and what its hooks cost: the same every-step cost and step times as `begin_step` and
    `light_hook` would give, pre-step time carried in."""
    meter = CostMeter(make_sampler("auto"), False, lambda: 0.0)
    meter.pre_hook(0.0005)
    meter.unmeasured(began=10.0, hooks_s=0.001)
    assert meter.every_step_s() == pytest.approx(0.0015)
    meter.unmeasured(began=10.25, hooks_s=0.002)
    meter.unmeasured(began=10.75, hooks_s=0.002)
    assert meter.step_times.last() == pytest.approx(0.5)
    assert meter.step_times.typical() == pytest.approx(0.375)
    assert meter.every_step_s() == pytest.approx(0.002)
    meter.unmeasured()  # the general path: the hooks tell their own, step times unchanged
    assert meter.every_step_s() == pytest.approx(0.002) and meter.step_times.last() == pytest.approx(0.5)


def test_auto_interval_hears_what_every_step_costs_between_measured_steps() -> None:
    """A co-located server's figure (its acks) arrives between measured steps: the interval
    follows it at once, and one figure far too high (a server that just started) neither locks
    the interval at its longest, where nothing would be measured for `max_interval` steps, nor
    moves it at all among lower ones (the median of the last figures)."""
    auto = AutoInterval(budget=0.01, max_interval=1000)
    auto.observe(cost_s=0.005, step_time_s=0.1, every_step_s=0.05)  # an early figure: 50 ms a step
    assert auto.interval == 1000
    for _ in range(3):  # the server's next figures, no measured step in between
        auto.observe_every_step(0.0005)
    assert auto.interval == 10
    auto.observe_every_step(0.05)  # one spike among them
    assert auto.interval == 10


def test_auto_interval_counts_what_a_measured_step_costs_all_told() -> None:
    """A measured step that takes longer than the hook's own clock says (the training's data
    evicted from the caches) is budgeted by its wall time; a quicker one by the hook's time."""
    auto = AutoInterval(budget=0.01)
    auto.observe(cost_s=0.001, step_time_s=0.1)  # the hook's own time: 1% of a step
    assert auto.interval == 1
    auto.observe_step(measured_s=0.105, step_time_s=0.1)  # the step took 5 ms longer
    assert auto.interval == 5
    cheap = AutoInterval(budget=0.01)
    cheap.observe(cost_s=0.003, step_time_s=0.1)
    cheap.observe_step(measured_s=0.099, step_time_s=0.1)  # noise: quicker than a typical step
    assert cheap.interval == 3
    stalled = AutoInterval(budget=0.01)
    stalled.observe(cost_s=0.001, step_time_s=0.1)
    for _ in range(3):
        stalled.observe_step(measured_s=0.105, step_time_s=0.1)
    stalled.observe_step(measured_s=2.0, step_time_s=0.1)  # the machine stalled during one measured step
    assert stalled.interval == 5  # a running average would have made it 58
    for _ in range(3):  # measured steps really are slower now: followed
        stalled.observe_step(measured_s=0.12, step_time_s=0.1)
    assert stalled.interval == 20
    fixed = EveryN(4)
    fixed.observe_step(measured_s=1.0, step_time_s=0.1)  # a fixed interval stays fixed
    assert fixed.n == 4


def test_step_time_is_the_typical_step_not_the_slow_ones() -> None:
    """The first step (one-time setup) and the measured ones (the hook's cost) are slower: the
    budget is a share of the typical step, which they do not move."""
    clock = StepTimes(window=15)
    assert clock.typical() == 0.0
    now = 0.0
    clock.tick(now)
    for k in range(1, 31):
        slow = k == 1 or k % 8 == 0  # after step 1, and every 8th step measured
        now += 0.080 if slow else 0.040
        clock.tick(now)
    assert clock.typical() == pytest.approx(0.040)
    for _ in range(15):  # the training itself slows down: followed within a window
        now += 0.100
        clock.tick(now)
    assert clock.typical() == pytest.approx(0.100)


@pytest.mark.timed
def test_every_auto_samples_less_when_the_hook_is_costly_relative_to_the_step() -> None:
    model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(30)])  # tiny steps, many tensors
    opt = torch.optim.Adam(model.parameters())
    w = gradwatch.watch(opt, model=model, server=NOWHERE, every="auto")
    for _ in range(200):
        opt.zero_grad()
        model(torch.randn(1, 4)).sum().backward()
        opt.step()
    msgs = sent_steps(w)
    w.close(timeout=0.1)
    assert len(msgs) == 200  # every step sends its cheap facts
    msgs = measured(msgs)
    assert msgs[0]["step"] == 1
    assert 1 < len(msgs) < 100, len(msgs)
    assert w.measured_steps == len(msgs) and w.step == 200
    assert w._sampler.interval > 1
    # learnt at the measured step itself, not when the paced sender gets to it (steps 1 and 2
    # are measured before the step time is known; then the interval holds)
    assert len([m for m in msgs if m["step"] <= 20]) <= 3


@pytest.mark.parametrize("every", [0, -1, 1.5, "sometimes", True, None])
def test_bad_every(every) -> None:
    with pytest.raises(ValueError, match='every must be a whole number >= 1 .* or "auto"'):
        make_sampler(every)


def test_every_step_sends_its_exact_cheap_facts_whichever_path_its_hooks_take() -> None:
    """A step between unmeasured ones takes the hooks' lean path (one optimizer, no closure);
    a step with a closure, or next to a measured one, the general path. Every step's cheap facts
    are the loop's own: its backward passes, the learning rate it stepped with, the clipped
    norm and the value it logged."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0 / (1 + i))
    w = gradwatch.watch(opt, model=model, server=NOWHERE, every=5, warn=False)
    oracle = {}
    for step in range(1, 25):
        opt.zero_grad()
        passes = 1 + step % 3

        def closure(passes: int = passes) -> torch.Tensor:
            for _ in range(passes):
                loss = model(torch.randn(3, 4)).square().mean()
                loss.backward()
            return loss

        w.log(value=step * 0.5)  # the scalars of the step to come
        if step % 7 == 0:
            opt.step(closure)
            norm = None
        else:
            closure()
            norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9))
            opt.step()
        oracle[step] = (float(passes), opt.param_groups[0]["lr"], norm, step * 0.5)
        sched.step()
    msgs = {m["step"]: m for m in sent_steps(w)}
    w.close(timeout=0.1)
    assert sorted(msgs) == list(range(1, 25))
    assert [s for s in msgs if "grad_norm" in msgs[s]["params"]] == [1, 6, 11, 16, 21]
    for step, (passes, lr, norm, value) in oracle.items():
        scalars = msgs[step]["scalars"]
        assert scalars["backward_passes"] == passes, step
        assert scalars["lr/0"] == pytest.approx(lr, rel=1e-6), step
        assert scalars.get("clip/total_norm") == (None if norm is None else pytest.approx(norm, rel=1e-6)), step
        assert scalars["value"] == value, step

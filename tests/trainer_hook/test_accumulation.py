"""Backward passes per step and how .grad was cleared, for each way people clear (or forget to)."""

from __future__ import annotations

import sys
from collections.abc import Callable

import pytest
import torch

import gradwatch
from support.sent import measured, sent_steps

pytestmark = pytest.mark.unit

NOWHERE = "http://127.0.0.1:9"  # no server: messages stay queued, where the test reads them


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)
        self.unused = torch.nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


def run(clear: Callable[[torch.nn.Module, torch.optim.Optimizer], None], micro: int = 1, steps: int = 4):
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    w = gradwatch.watch(opt, model=model, server=NOWHERE)
    for _ in range(steps):
        clear(model, opt)
        for _ in range(micro):
            (model(torch.randn(2, 4)).sum() / micro).backward()
        opt.step()
    msgs = sent_steps(w)
    w.close(timeout=0.1)
    assert [m["step"] for m in msgs] == list(range(1, steps + 1))
    return msgs


def set_none(p: torch.nn.Module) -> None:
    for q in p.parameters():
        q.grad = None


@pytest.mark.parametrize(
    "clear, code",
    [
        (lambda m, o: o.zero_grad(), 1.0),
        (lambda m, o: o.zero_grad(set_to_none=True), 1.0),
        (lambda m, o: m.zero_grad(), 1.0),
        (lambda m, o: set_none(m), 1.0),
        (lambda m, o: o.zero_grad(set_to_none=False), 2.0),
        (lambda m, o: None, 0.0),
    ],
    ids=["zero_grad", "set_to_none", "model.zero_grad", "p.grad=None", "zero-filled", "never-cleared"],
)
def test_how_grads_were_cleared(clear, code) -> None:
    msgs = run(clear)
    first, rest = msgs[0], msgs[1:]
    assert first["params"]["grad_clear"]["fc.weight"] is None  # nothing before the first step
    for m in rest:
        assert m["params"]["grad_clear"]["fc.weight"] == code
        assert m["params"]["grad_clear"]["unused.weight"] is None  # never accumulated
    for m in msgs:
        assert m["params"]["backward_passes"]["fc.weight"] == 1.0
        assert m["params"]["backward_passes"]["unused.weight"] == 0.0
        assert m["scalars"]["backward_passes"] == 1.0


def test_intentional_accumulation_counts_micro_batches() -> None:
    msgs = run(lambda m, o: o.zero_grad(), micro=4)
    assert [m["params"]["backward_passes"]["fc.bias"] for m in msgs] == [4.0] * 4
    assert [m["params"]["grad_clear"]["fc.bias"] for m in msgs] == [None, 1.0, 1.0, 1.0]


def test_every_n_samples_but_counts_per_step() -> None:
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    w = gradwatch.watch(opt, model=model, server=NOWHERE, every=3)
    hooked = []  # how many tensors carry a gradient hook during each step's backward passes
    scanned = []  # whether the others are counted by one pass over the `.grad`s per backward
    for _ in range(7):
        opt.zero_grad()
        model(torch.randn(2, 4)).sum().backward()
        model(torch.randn(2, 4)).sum().backward()
        hooked.append(w._rounds._tracker.armed)
        scanned.append(w._rounds._tracker.scanning)
        opt.step()
    msgs = sent_steps(w)
    w.close(timeout=0.1)
    assert [m["step"] for m in measured(msgs)] == [1, 4, 7]
    # per-parameter hooks are armed for the first measured step only, one sentinel otherwise; the
    # later measured steps count the others by a scan, as the first showed every backward
    # reaching the sentinel (one process, plain tensors)
    assert hooked == [4, 1, 1, 1, 1, 1, 1]
    assert scanned == [False, False, False, True, False, False, True]
    # every step is recorded; counts are per step (2, not 6) whatever the interval: per parameter
    # on measured steps, the sentinel's on the others, which send no per-parameter array
    assert [m["step"] for m in msgs] == list(range(1, 8))
    assert all(m["scalars"]["backward_passes"] == 2.0 for m in msgs)
    assert all(m["params"]["backward_passes"]["fc.weight"] == 2.0 for m in measured(msgs))
    assert all(m["params"]["backward_passes"]["unused.weight"] == 0.0 for m in measured(msgs))
    light = [m for m in msgs if m["step"] not in (1, 4, 7)]
    assert all(m["params"] == {} and "grad_status" not in m and m["scalars"]["lr/0"] == 0.01 for m in light)
    assert all("mem/grads_bytes" not in m["scalars"] and "grads/none" not in m["scalars"] for m in light)
    fc_bytes = (4 * 3 + 3) * 4  # `unused` never gets a .grad
    assert all(m["scalars"]["mem/grads_bytes"] == fc_bytes for m in measured(msgs))
    # zero_grad() sets None, exactly seen at each measured step after the first
    assert [m["params"]["grad_clear"]["fc.weight"] for m in measured(msgs)] == [None, 1.0, 1.0]


def test_a_forgotten_zero_grad_is_exact_on_every_measured_step() -> None:
    """The hooks are armed from the step before a measured one: a measured step sees how `.grad`
    was cleared since the step before it, and how many passes the step summed, whatever the interval."""
    for every in (2, 5):
        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        w = gradwatch.watch(opt, model=model, server=NOWHERE, every=every)
        for i in range(11):
            if i % 2:  # every other step forgets its zero_grad()
                opt.zero_grad()
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
        msgs = measured(sent_steps(w))
        w.close(timeout=0.1)
        want = [None] + [1.0 if (m["step"] - 1) % 2 else 0.0 for m in msgs[1:]]
        assert [m["params"]["grad_clear"]["fc.weight"] for m in msgs] == want, every
        assert all(m["params"]["backward_passes"]["fc.bias"] == 1.0 for m in msgs)


def test_the_sentinel_follows_the_parameter_with_the_most_passes() -> None:
    """Unmeasured steps say the largest count the last measured step saw: the sentinel moves to
    the parameter that got the most passes (here a second head, run twice)."""
    torch.manual_seed(0)
    first, second = torch.nn.Linear(4, 1), torch.nn.Linear(4, 1)
    model = torch.nn.ModuleDict({"a": second, "b": first})  # b's bias is the first sentinel
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    w = gradwatch.watch(opt, model=model, server=NOWHERE, every=4)
    for _ in range(6):
        opt.zero_grad()
        first(torch.randn(2, 4)).sum().backward()
        for _ in range(3):
            second(torch.randn(2, 4)).sum().backward()
        opt.step()
    msgs = sent_steps(w)
    w.close(timeout=0.1)
    assert [m["params"]["backward_passes"]["a.weight"] for m in measured(msgs)] == [3.0, 3.0]
    assert [m["scalars"]["backward_passes"] for m in msgs] == [3.0] * 6


class TwoHeads(torch.nn.Module):
    """A trunk and two heads; `b`'s bias is the first sentinel (the last parameter)."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk, self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1), torch.nn.Linear(4, 1)

    def forward(self, x: torch.Tensor, heads: str = "ab") -> torch.Tensor:
        h = self.trunk(x)
        return sum(getattr(self, k)(h).sum() for k in heads)


def heads_run(clear: Callable[[torch.optim.Optimizer], None], steps: int):
    """Step 1 runs one backward through both heads; the later steps one through head `a` alone
    (which reaches no sentinel), then one through both. Returns the measured steps (every=1)
    and whether the passes were scanned during each step."""
    torch.manual_seed(0)
    model = TwoHeads()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    w = gradwatch.watch(opt, model=model, server=NOWHERE)
    scanned = []
    for i in range(steps):
        clear(opt)
        if i:
            model(torch.randn(2, 4), "a").backward()
        model(torch.randn(2, 4)).backward()
        scanned.append(w._rounds._tracker.scanning)
        opt.step()
    msgs = measured(sent_steps(w))
    w.close(timeout=0.1)
    return msgs, scanned


def test_a_scan_in_doubt_goes_back_to_hooks() -> None:
    """The scan counts only backward passes that reach a sentinel: one that did not shows as a
    `.grad` that moved by more than a clear and a pass, and the next steps go back to hooks,
    which count every parameter exactly again (`zero_grad(set_to_none=False)`)."""
    msgs, scanned = heads_run(lambda o: o.zero_grad(set_to_none=False), 5)
    assert scanned == [False, True, False, False, False]
    for m in msgs[2:]:
        assert m["params"]["backward_passes"]["trunk.weight"] == 2.0
        assert m["params"]["backward_passes"]["a.bias"] == 2.0
        assert m["params"]["backward_passes"]["b.bias"] == 1.0
        assert m["params"]["grad_clear"]["trunk.weight"] == 2.0


def test_hooks_count_a_measured_round_now_and_then_to_check_the_scan() -> None:
    """A pass that reached no sentinel into a `.grad` set to None leaves nothing to doubt: one
    measured round in VERIFY_EVERY is counted with hooks, which see the passes differ, and the
    steps after it are counted with hooks for good."""
    from gradwatch.rounds import VERIFY_EVERY

    steps = VERIFY_EVERY + 4
    msgs, scanned = heads_run(lambda o: o.zero_grad(), steps)
    assert scanned == [False] + [True] * VERIFY_EVERY + [False] * 3
    for m in msgs[VERIFY_EVERY + 1 :]:
        assert m["params"]["backward_passes"]["trunk.weight"] == 2.0
        assert m["params"]["backward_passes"]["b.weight"] == 1.0
        assert m["params"]["grad_clear"]["trunk.weight"] == 1.0


@pytest.mark.parametrize(
    "make",
    [lambda p: torch.optim.SparseAdam(p, lr=0.01), lambda p: torch.optim.SGD(p, lr=0.1)],
    ids=["SparseAdam", "SGD"],
)
def test_sparse_gradients_are_measured_not_fatal(make) -> None:
    """nn.Embedding(sparse=True) gives a sparse `.grad`, whose `nbytes` raises and which fused
    norms refuse: the hook must measure it (its norm, the bytes of its indices and values) at
    measured and unmeasured steps alike, and never raise into the training step."""
    torch.manual_seed(0)
    model = torch.nn.Embedding(50, 8, sparse=True)
    opt = make(model.parameters())
    w = gradwatch.watch(opt, model=model, server=NOWHERE, every=2)
    norms, sizes, states = [], [], []
    for _ in range(4):
        opt.zero_grad()
        model(torch.tensor([[1, 2, 2, 7]])).pow(2).sum().backward()  # index 2 twice: an uncoalesced grad
        g = model.weight.grad
        assert g.is_sparse and not g.is_coalesced()
        norms.append(float(g.to_dense().norm()))
        sizes.append(g._indices().nbytes + g._values().nbytes)
        opt.step()
        states.append(
            float(opt.state[model.weight]["exp_avg"].norm()) if "exp_avg" in opt.state[model.weight] else None
        )
    msgs = sent_steps(w)
    w.close(timeout=0.1)
    assert [m["step"] for m in msgs] == [1, 2, 3, 4]
    assert [m["scalars"].get("mem/grads_bytes") for m in msgs] == [sizes[0], None, sizes[2], None]
    assert [m["params"]["backward_passes"]["weight"] for m in measured(msgs)] == [1.0] * 2
    assert [m["scalars"]["backward_passes"] for m in msgs] == [1.0] * 4
    got = [m["params"]["grad_norm"]["weight"] for m in measured(msgs)]
    assert got == pytest.approx([norms[0], norms[2]], rel=1e-6)
    if isinstance(opt, torch.optim.SparseAdam):  # its state is dense
        got = [m["params"]["exp_avg_norm"]["weight"] for m in measured(msgs)]
        assert got == pytest.approx([states[0], states[2]], rel=1e-6)


def test_unmeasured_steps_count_the_sentinels_passes_at_the_step_with_no_callback(monkeypatch) -> None:
    """One process, only the sentinel hooked: its hook's notes are counted at the step, with no
    end-of-backward callback queued, and the counts are those a watcher measuring every step (its
    hooks on every parameter, counted by the callback) sends: accumulation, a clear to None or a
    zero-fill between passes (a GAN's D cleared after G's pass), and more passes between two steps
    than the notes held for the step (counted as they come)."""
    from gradwatch import accumulation
    from gradwatch.accumulation import MAX_NOTED

    queued = []
    queue = accumulation._QUEUE_CALLBACK
    monkeypatch.setattr(accumulation, "_QUEUE_CALLBACK", lambda f: (queued.append(f), queue(f)))
    passes_between = [1, 3, 2, MAX_NOTED + 5, 2, 1]

    def train(every: int):
        torch.manual_seed(0)
        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        w = gradwatch.watch(opt, model=model, server=NOWHERE, every=every)
        callbacks, held = [], []
        for step, n in enumerate(passes_between):
            opt.zero_grad()
            queued.clear()
            for k in range(n):
                if step == 2 and k == 1:  # a pass, then a clear: only the passes after it count
                    model.zero_grad(set_to_none=step % 2 == 0)
                if step == 4 and k == 1:
                    opt.zero_grad(set_to_none=False)
                model(torch.randn(2, 4)).sum().backward()
                held.append(len(w._rounds._tracker._seen))
            callbacks.append(len(queued))
            opt.step()
        msgs = sent_steps(w)
        w.close(timeout=0.1)
        return [m["scalars"]["backward_passes"] for m in msgs], callbacks, max(held)

    counts, callbacks, held = train(every=10**9)
    oracle, oracle_callbacks, _ = train(every=1)
    assert counts == oracle == [1.0, 3.0, 1.0, MAX_NOTED + 5.0, 1.0, 1.0]
    assert callbacks[0] > 0 and callbacks[1:] == [0] * (len(passes_between) - 1)  # step 1 is measured
    assert all(n > 0 for n in oracle_callbacks)  # the watcher measuring every step settles each backward
    assert held <= MAX_NOTED + 1


@pytest.mark.parametrize("every, steps", [(1, 20), (10**9, 6)])
def test_a_loop_that_keeps_its_loss_calls_the_hook_of_the_sentinel_alone_on_unmeasured_steps(
    every: int, steps: int
) -> None:
    """A loop that keeps its last loss until its next forward keeps that graph's gradient
    accumulator nodes alive, and autograd reuses them: the hooks a round counted with hooks put
    on them are removed when it ends, so the other steps call gradwatch's hook once per backward
    pass (the sentinel's), not once per parameter, and a node hooked again (the round that checks
    the scan, `VERIFY_EVERY`) counts each pass once."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(5)])  # 10 tensors
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    w = gradwatch.watch(opt, model=model, server=NOWHERE, every=every)
    calls: list[int] = []

    def profile(frame, event, arg) -> None:
        if event == "call" and frame.f_code.co_name in ("on_accumulate", "on_pass"):  # gradwatch's hooks
            calls[-1] += 1

    for _ in range(steps):
        calls.append(0)
        sys.setprofile(profile)
        try:
            opt.zero_grad()
            for _ in range(2):
                loss = model(torch.randn(2, 4)).sum()  # the last pass's graph is alive meanwhile
                loss.backward()
            opt.step()
        finally:
            sys.setprofile(None)
    # torch keeps no hook dict on a tensor that gradwatch hooked for a round (all but the
    # sentinel, the last parameter): an empty one costs every backward a call (docs/benchmarks.md)
    assert [p._backward_hooks for p in list(model.parameters())[:-1]] == [None] * 9
    msgs = sent_steps(w)
    w.close(timeout=0.1)
    hooked = 10 * 2  # every parameter's hook, at each of the two passes
    assert calls[0] == hooked
    assert set(calls[1:]) == ({2, hooked} if every == 1 else {2})
    assert calls.count(hooked) == (2 if every == 1 else 1)  # the first round, and one that checks the scan
    assert all(m["scalars"]["backward_passes"] == 2.0 for m in msgs)
    assert all(set(m["params"]["backward_passes"].values()) == {2.0} for m in measured(msgs))

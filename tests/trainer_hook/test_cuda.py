"""The CUDA path: no synchronisation on the training thread at any step, exact values in every
precision and optimizer implementation, AMP, the allocator's counters, a compiled model's names,
the flight recorder, the optimizer signals and updates.

Runs wherever a CUDA device is present (`scripts/gpu-check.sh` on a lent GPU machine); skipped
with the reason elsewhere. `torch.cuda.set_sync_debug_mode("error")` makes any synchronising call
raise: each test runs the whole training step under it (zero_grad, forward, backward, log, step),
and leaves it only to read its own oracles between steps.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import gradwatch
from gradwatch.recorder import AFTER, BEFORE
from support.sent import sent_steps
from support.signals import signals_oracle

pytestmark = [
    pytest.mark.unit,
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none on this machine)"),
]

NOWHERE = "http://127.0.0.1:9"  # nothing listens: the sender spools, the training never waits
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@contextlib.contextmanager
def no_sync() -> Iterator[None]:
    """Any synchronising CUDA call inside raises."""
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


@contextlib.contextmanager
def counting_syncs(counts: list[int]) -> Iterator[None]:
    """Appends the number of synchronising CUDA calls made inside (warned, not raised)."""
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield
    finally:
        torch.cuda.set_sync_debug_mode("default")
    counts.append(sum("synchroniz" in str(w.message) for w in caught))


def model_and_batch(dtype: torch.dtype = torch.float32) -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 8))
    return model.to("cuda", dtype), torch.randn(32, 64, device="cuda", dtype=dtype)


def norm(t: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(t.detach().float()))


def state_oracle(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {"param_norm": {}, "exp_avg_norm": {}, "exp_avg_sq_norm": {}}
    for name, p in model.named_parameters():
        out["param_norm"][name] = norm(p)
        out["exp_avg_norm"][name] = norm(opt.state[p]["exp_avg"])
        out["exp_avg_sq_norm"][name] = norm(opt.state[p]["exp_avg_sq"])
    return out


@pytest.mark.parametrize("every", [1, 3])
@pytest.mark.parametrize("impl", ["foreach", "fused"])
@pytest.mark.parametrize("precision", list(DTYPES))
def test_no_step_synchronises_and_every_norm_is_exact(precision: str, impl: str, every: int) -> None:
    model, x = model_and_batch(DTYPES[precision])
    # eps 1e-8 is 0 in fp16: the foreach step would divide by sqrt(v) = 0 (fused works in fp32)
    eps = 1e-4 if precision == "fp16" else 1e-8
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, eps=eps, **{impl: True})
    w = gradwatch.watch(opt, model=model, server=NOWHERE, every=every)
    oracle: dict[int, dict[str, dict[str, float]]] = {}
    for step in range(1, 7):  # from the first step: buffers, plans and pinned memory are made there
        with no_sync():
            opt.zero_grad()
            loss = model(x).float().pow(2).mean()
            loss.backward()
        grads = {n: norm(p.grad) for n, p in model.named_parameters()}  # type: ignore[arg-type]
        with no_sync():
            w.log(loss=loss)  # a CUDA tensor: copied with the step, never read on this thread
            opt.step()
        oracle[step] = {"grad_norm": grads, **state_oracle(model, opt), "loss": {"": float(loss)}}
    msgs = sent_steps(w, timeout=30)
    w.close(timeout=0.1)
    measured = [m for m in msgs if "grad_norm" in m["params"]]
    assert [m["step"] for m in measured] == list(range(1, 7, every))
    rel = 2e-5 if precision == "fp32" else 1e-4  # fp32 sums of the same values in another order
    for m in measured:
        want = oracle[m["step"]]
        for metric in ("grad_norm", "param_norm", "exp_avg_norm", "exp_avg_sq_norm"):
            for name, value in want[metric].items():
                assert m["params"][metric][name] == pytest.approx(value, rel=rel), (m["step"], metric, name)
        assert m["scalars"]["loss"] == pytest.approx(want["loss"][""], rel=1e-6)


@pytest.mark.parametrize("impl", ["foreach", "fused"])
def test_amp_norms_are_unscaled_skips_counted_and_the_hook_adds_no_sync(impl: str) -> None:
    fused = impl == "fused"
    runs: dict[bool, dict[str, Any]] = {}
    for watched in (False, True):
        model, x = model_and_batch()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, **{impl: True})
        scaler = torch.amp.GradScaler("cuda", init_scale=2.0**14)
        w = gradwatch.watch(opt, model=model, server=NOWHERE, scaler=scaler) if watched else None
        syncs: list[int] = []
        oracle: dict[int, dict[str, float]] = {}
        hook_step = 0
        for i in range(6):
            skip = i == 2
            with counting_syncs(syncs):
                opt.zero_grad()
                with torch.autocast("cuda", dtype=torch.float16):
                    loss = model(x).float().pow(2).mean()
                scaler.scale(loss).backward()
            if skip:
                model[0].weight.grad[0, 0] = float("inf")  # type: ignore[index]
            scale = scaler.get_scale()
            grads = {n: norm(p.grad) / scale for n, p in model.named_parameters()}  # type: ignore[arg-type]
            with counting_syncs(syncs):
                scaler.step(opt)  # foreach: GradScaler itself reads found_inf (a sync of its own)
                scaler.update()
            if fused or not skip:  # a fused optimizer is stepped and skips in its kernel
                hook_step += 1
                if not skip:
                    oracle[hook_step] = grads
        runs[watched] = {"syncs": syncs}
        if w is not None:
            msgs = sent_steps(w, timeout=30)
            w.close(timeout=0.1)
            runs[watched]["msgs"] = msgs
            assert [m["step"] for m in msgs] == list(range(1, hook_step + 1))
            for m in msgs:
                for name, value in oracle.get(m["step"], {}).items():
                    assert m["params"]["grad_norm"][name] == pytest.approx(value, rel=2e-5)
            assert msgs[-1]["scalars"]["amp/skipped_steps"] == 1
            assert msgs[0]["scalars"]["amp/skipped_steps"] == 0
    assert runs[True]["syncs"] == runs[False]["syncs"]  # every sync is the scaler's, none the hook's


def test_memory_counters_equal_the_allocator_as_the_step_begins() -> None:
    model, x = model_and_batch()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    seen: list[dict[str, float]] = []

    def read(*_: Any) -> None:  # registered before watch(): its pre-hook runs just before the hook's
        stats = torch.cuda.memory_stats()
        seen.append(
            {
                "allocated": stats["allocated_bytes.all.current"],
                "reserved": stats["reserved_bytes.all.current"],
                "peak": stats["allocated_bytes.all.peak"],
            }
        )

    opt.register_step_pre_hook(read)
    w = gradwatch.watch(opt, model=model, server=NOWHERE, every=2)
    big = None
    for i in range(6):
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        if i == 3:
            big = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")  # moves every counter
        opt.step()
    msgs = sent_steps(w, timeout=30)
    w.close(timeout=0.1)
    del big
    assert len(msgs) == len(seen) == 6
    for m, want in zip(msgs, seen):  # measured and unmeasured steps alike
        for key, value in want.items():
            assert m["scalars"][f"mem/cuda:0/{key}"] == value, (m["step"], key)
    assert msgs[4]["scalars"]["mem/cuda:0/allocated"] >= msgs[2]["scalars"]["mem/cuda:0/allocated"] + (64 << 20)


def test_a_compiled_model_is_named_as_the_original_and_measured_exactly() -> None:
    model, x = model_and_batch()
    compiled = torch.compile(model)
    opt = torch.optim.AdamW(compiled.parameters(), lr=1e-3, fused=True)
    w = gradwatch.watch(opt, model=compiled, server=NOWHERE)
    oracle = []
    for _ in range(3):
        opt.zero_grad()
        compiled(x).pow(2).mean().backward()
        oracle.append({n: norm(p.grad) for n, p in model.named_parameters()})  # type: ignore[arg-type]
        opt.step()
    msgs = sent_steps(w, timeout=30)
    w.close(timeout=0.1)
    assert [p.name for p in w.layout.params] == [n for n, _ in model.named_parameters()]
    for m, want in zip(msgs, oracle):
        assert m["params"]["grad_norm"] == pytest.approx(want, rel=2e-5)


def test_the_flight_recorder_sends_the_spikes_window_exactly_without_a_sync() -> None:
    """On a GPU the recorder is on by default: every unmeasured step's norms go into a ring on the
    device and the held steps are copied to pinned memory with an event; no step waits."""
    model, x = model_and_batch()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    w = gradwatch.watch(opt, model=model, server=NOWHERE, every=50)  # measured: 1 and 51 only
    assert w._rounds._recorder is not None, "the recorder is on by default on a GPU"
    oracle: dict[int, dict[str, float]] = {}
    for step in range(1, 61):
        with no_sync():
            opt.zero_grad()
            model(x * (50.0 if step == 40 else 1.0)).pow(2).mean().backward()
        oracle[step] = {n: norm(p.grad) for n, p in model.named_parameters()}  # type: ignore[arg-type]
        with no_sync():
            opt.step()
    msgs = sent_steps(w, timeout=30)
    w.close(timeout=0.1)
    full = {m["step"]: m for m in msgs if "grad_norm" in m["params"]}
    assert sorted(full) == [1, *range(40 - BEFORE, 40 + AFTER + 1), 51]
    for step in range(40 - BEFORE, 40 + AFTER + 1):
        assert full[step]["params"]["grad_norm"] == pytest.approx(oracle[step], rel=2e-5), step
    assert [m["step"] for m in msgs] == list(range(1, 61))


@pytest.mark.parametrize("impl", ["foreach", "fused"])
def test_optimizer_signals_and_updates_are_exact_without_a_sync(impl: str) -> None:
    model, x = model_and_batch()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, eps=1e-3, **{impl: True})
    names = {p: n for n, p in model.named_parameters()}
    w = gradwatch.watch(opt, model=model, server=NOWHERE, optimizer_signals=True, updates=True)
    wanted = []
    for _ in range(4):
        with no_sync():
            opt.zero_grad()
            model(x).pow(2).mean().backward()
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        with no_sync():
            opt.step()
        want = signals_oracle(opt, names)
        want["update_norm"] = {n: norm(p - before[n]) for n, p in model.named_parameters()}
        wanted.append(want)
    msgs = sent_steps(w, timeout=30)
    w.close(timeout=0.1)
    assert len(msgs) == len(wanted)
    for m, want in zip(msgs, wanted):
        for metric, per_param in want.items():
            assert m["params"][metric] == pytest.approx(per_param, rel=1e-4, abs=1e-6), (m["step"], metric)

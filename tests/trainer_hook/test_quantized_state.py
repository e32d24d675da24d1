"""Quantized optimizer state, exact: each `<key>_norm` equals the norm of the library's own
dequantization (torchao's `.dequantize()`, bitsandbytes' `dequantize_blockwise`), step after step,
from the real libraries (pinned in constraints.txt), on the CPU and, where there is one, on a CUDA
device (bitsandbytes steps only there). The hook reads the codes a chunk at a time."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from gradwatch import states
from gradwatch.layout import build_layout
from gradwatch.measure import Probe, is_absent
from support.probing import after_step, before_step

pytestmark = pytest.mark.unit


def torchao_optimizer(name: str) -> Callable[[Any], torch.optim.Optimizer]:
    def make(params: Any) -> torch.optim.Optimizer:
        optim = pytest.importorskip("torchao.optim", reason="torchao is installed by requirements-test.txt")
        return getattr(optim, name)(params, lr=1e-2)  # type: ignore[no-any-return]

    return make


def bnb_optimizer(name: str) -> Callable[[Any], torch.optim.Optimizer]:
    def make(params: Any) -> torch.optim.Optimizer:
        bnb = pytest.importorskip("bitsandbytes", reason="bitsandbytes is installed by requirements-test.txt")
        return getattr(bnb.optim, name)(params, lr=1e-2)  # type: ignore[no-any-return]

    return make


def torchao_oracle(opt: torch.optim.Optimizer, p: torch.Tensor, key: str) -> float | None:
    value = opt.state[p].get(key)
    if value is None:
        return None
    dense = value.dequantize() if hasattr(value, "dequantize") else value  # small tensors stay float
    return float(torch.linalg.vector_norm(dense.float()))


def bnb_oracle(opt: torch.optim.Optimizer, p: torch.Tensor, key: str) -> float | None:
    import bitsandbytes.functional as F

    state = opt.state[p]
    value = state.get(key)
    if value is None:
        return None
    if value.dtype == torch.uint8:
        n = key[len("state") :]
        value = F.dequantize_blockwise(value, absmax=state[f"absmax{n}"], code=state[f"qmap{n}"], blocksize=256)
    return float(torch.linalg.vector_norm(value.float()))


CASES = {
    "torchao-AdamW8bit": (torchao_optimizer("AdamW8bit"), torchao_oracle, ("exp_avg", "exp_avg_sq")),
    "torchao-AdamW4bit": (torchao_optimizer("AdamW4bit"), torchao_oracle, ("exp_avg", "exp_avg_sq")),
    "torchao-AdamWFp8": (torchao_optimizer("AdamWFp8"), torchao_oracle, ("exp_avg", "exp_avg_sq")),
    "bnb-AdamW8bit": (bnb_optimizer("AdamW8bit"), bnb_oracle, ("state1", "state2")),
    "bnb-PagedAdamW8bit": (bnb_optimizer("PagedAdamW8bit"), bnb_oracle, ("state1", "state2")),
}


ON_CUDA = pytest.param(
    "cuda",
    marks=[
        pytest.mark.cuda,
        pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none on this machine)"),
    ],
)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("device", ["cpu", ON_CUDA])
@pytest.mark.parametrize("case", list(CASES))
def test_quantized_state_norms_are_the_dequantized_states(
    case: str, device: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    make, oracle, keys = CASES[case]
    monkeypatch.setattr(states, "CHUNK", 1024)  # several chunks per tensor: the chunks add up
    torch.manual_seed(0)
    # 64x128 is quantized by both libraries; 70x90 by bitsandbytes only (a short last block of 156
    # codes); the biases are too small to be quantized (float state, read as before)
    model = torch.nn.Sequential(
        torch.nn.Linear(128, 64), torch.nn.Tanh(), torch.nn.Linear(64, 90), torch.nn.Linear(90, 70)
    ).to(device)
    try:
        opt = make(model.parameters())
        model(torch.randn(4, 128, device=device)).pow(2).mean().backward()
        opt.step()
    except (RuntimeError, NotImplementedError, AssertionError) as exc:  # a library without a CPU path here
        if device == "cuda":
            raise
        pytest.skip(f"{case} cannot step on this CPU-only machine ({type(exc).__name__}: {str(exc)[:200]}); GPU only")
    opt.zero_grad()
    probe = Probe(build_layout([opt], model, rank=None))
    params = [w.param for w in probe.layout.params]
    quantized = 0
    for step in (1, 2, 3):
        opt.zero_grad()
        model(torch.randn(4, 128, device=device)).pow(2).mean().backward()
        before_step(probe, step)
        opt.step()
        metrics, *_ = after_step(probe, {}).resolve()
        for key in keys:
            got = metrics[f"{key}_norm"]
            for i, p in enumerate(params):
                want = oracle(opt, p, key)
                if want is None:
                    assert is_absent(got[i : i + 1])[0]
                    continue
                quantized += states.quantized(key, opt.state[p][key], opt.state[p], p) is not None
                assert float(got[i]) == pytest.approx(want, rel=2e-5), (case, step, key, i)
    # torchao quantizes tensors of 4096 elements or more that its blocks divide (64x128 at least),
    # bitsandbytes every tensor of 4096 elements or more (the three weights)
    assert quantized == 3 * 2 * 3 if case.startswith("bnb") else quantized >= 3 * 2


def test_a_short_chunk_adds_up_to_the_whole() -> None:
    """`Quantized.norm` against the dense formula, a chunk of one block and a short last block."""
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 256, (1000,), dtype=torch.uint8, generator=g)
    qmap = torch.linspace(-1, 1, 256)
    scale = torch.rand(4, generator=g) + 0.5
    q = states.Quantized(codes, qmap.square(), scale, 256)
    dense = qmap[codes.long()] * torch.repeat_interleave(scale, 256)[:1000]
    for chunk in (1, 256, 1 << 20):
        states.CHUNK = chunk
        try:
            assert float(q.norm()) == pytest.approx(float(torch.linalg.vector_norm(dense)), rel=1e-5)
        finally:
            states.CHUNK = 1 << 20

"""The combination of a distributed job's per-rank steps (assemble.py) against an oracle written
here, parameter by parameter in plain Python floats, from the rules of docs/protocol.md."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gradwatch_server.jobs.assemble import (
    DESYNC_METRIC,
    DESYNC_PREFIX,
    RANKS_SCALAR,
    RankStep,
    combine,
    desync,
    with_desync,
)
from support.wiremsg import ABSENT_BITS

pytestmark = pytest.mark.unit

NONE, ZERO, NONZERO, NONFINITE = 0, 1, 2, 3


def is_absent(x: np.float32) -> bool:
    return int(np.array([x], dtype="<f4").view("<u4")[0]) == ABSENT_BITS


def oracle_norm(values: list[np.float32]) -> float | None:
    """None for ABSENT; else sqrt of the sum of squares in Python floats (float64)."""
    present = [float(v) for v in values if not is_absent(v)]
    if not present:
        return None
    if any(math.isnan(v) for v in present):
        return math.nan
    if any(math.isinf(v) for v in present):
        return math.inf
    return math.sqrt(math.fsum(v * v for v in present))


def oracle_status(codes: list[int]) -> int:
    if all(c == NONE for c in codes):
        return NONE
    for code in (NONFINITE, NONZERO):
        if code in codes:
            return code
    return ZERO


def random_pieces(rng: np.random.Generator, ranks: int, count: int) -> list[RankStep]:
    pieces = []
    for r in range(ranks):
        arrays = {}
        for metric in ("grad_norm", "param_norm", "exp_avg_sq_norm", "update_norm", "param_before_norm"):
            v = np.exp(rng.uniform(-30, 45, count)).astype("<f4")  # up to 3e19: squares overflow float32
            special = rng.random(count)
            v[special < 0.05] = np.nan
            v[(special >= 0.05) & (special < 0.08)] = np.inf
            v.view("<u4")[(special >= 0.08) & (special < 0.25)] = ABSENT_BITS
            v[(special >= 0.25) & (special < 0.3)] = 0.0
            arrays[metric] = v
        arrays["grad_status"] = rng.integers(0, 4, count).astype("u1")
        arrays["backward_passes"] = rng.integers(1, 5, count).astype("<f4")
        pieces.append(
            RankStep(
                rank=r,
                time=1000.0 + rng.random(),
                scalars={"loss": float(r + 1), "time/step_s": float(rng.random())},
                arrays=arrays,
                counted=rng.random(count) < 0.7,
            )
        )
    return pieces


@pytest.mark.parametrize("seed", range(5))
def test_norms_statuses_and_per_rank_values_match_the_oracle(seed: int) -> None:
    rng = np.random.default_rng(seed)
    count = 200
    pieces = random_pieces(rng, 3, count)
    got = combine(list(reversed(pieces)))  # the order given does not matter
    for metric in ("grad_norm", "param_norm", "exp_avg_sq_norm", "update_norm", "param_before_norm"):
        out = got.arrays[metric]
        for i in range(count):
            want = oracle_norm([p.arrays[metric][i] for p in pieces if p.counted[i]])
            if want is None and metric == "exp_avg_sq_norm":  # state held elsewhere: the lowest rank having it
                want = next(
                    (oracle_norm([p.arrays[metric][i]]) for p in pieces if not is_absent(p.arrays[metric][i])), None
                )
            if want is None:
                assert is_absent(out[i]), (metric, i)
            elif math.isnan(want):
                assert math.isnan(out[i]) and not is_absent(out[i]), (metric, i)
            else:
                assert float(out[i]) == pytest.approx(want, rel=1e-6), (metric, i)
    for i in range(count):
        counted = [p for p in pieces if p.counted[i]]
        assert got.arrays["grad_status"][i] == oracle_status([int(p.arrays["grad_status"][i]) for p in counted])
        passes = got.arrays["backward_passes"][i]
        if counted:
            assert passes == counted[0].arrays["backward_passes"][i]
        else:
            assert is_absent(passes)


def test_squares_are_added_in_float64() -> None:
    """Local norms above 1.8e19 have squares beyond float32's range; the global norm is finite."""
    big = np.array([3e19, 1e-30], dtype="<f4")
    pieces = [RankStep(r, 0.0, {}, {"grad_norm": big}, np.ones(2, dtype=bool)) for r in range(2)]
    got = combine(pieces).arrays["grad_norm"]
    assert np.isfinite(got).all()
    assert float(got[0]) == pytest.approx(math.sqrt(2) * float(big[0]), rel=1e-6)
    assert float(got[1]) == pytest.approx(math.sqrt(2) * float(big[1]), rel=1e-6)


def cheap(rank: int, counted: np.ndarray, **scalars: float) -> RankStep:
    """A rank's unmeasured step: cheap facts only (no grad_status, no norms); `mem__x` is `mem/x`."""
    count = len(counted)
    return RankStep(rank, 0.0, slashed(scalars), {"backward_passes": f32s(*[rank + 1] * count)}, counted)


def sampled(rank: int, grad: list[float], counted: np.ndarray, **scalars: float) -> RankStep:
    """A rank's measured step: grad_status, grad_norm, param_norm and the cheap facts."""
    arrays = {
        "grad_norm": f32s(*grad),
        "param_norm": f32s(*[g + 1 for g in grad]),
        "grad_status": np.full(len(grad), NONZERO, "u1"),
        "backward_passes": f32s(*[rank + 1] * len(grad)),
    }
    return RankStep(rank, 0.0, slashed(scalars), arrays, counted)


def slashed(scalars: dict[str, float]) -> dict[str, float]:
    return {k.replace("__", "/"): v for k, v in scalars.items()}


def test_a_step_that_a_rank_holding_counted_pieces_did_not_measure_is_stored_unmeasured() -> None:
    """FSDP, each rank sampling alone: rank 1's pieces count but it sent only cheap facts. The
    job's step is unmeasured (no norms, no status, no grad_norm_total), never the norms and
    status of rank 0's pieces alone, which would be too small."""
    both = np.ones(3, bool)
    got = combine(
        [
            sampled(0, [3.0, 4.0, 5.0], both, grad_norm_total=7.0, loss=1.0, **BYTES, mem__optimizer_bytes=8.0),
            cheap(1, np.array([True, False, True]), loss=2.0, **BYTES),
        ]
    )
    assert sorted(got.arrays) == ["backward_passes"]
    assert got.arrays["backward_passes"].tolist() == [1.0, 1.0, 1.0]  # the lowest counted rank's
    assert got.scalars == {"loss": 1.0, "mem/params_bytes": 200.0, RANKS_SCALAR: 2.0}
    # the same ranks both measuring: a measured step of the global values
    full = combine([sampled(0, [3.0, 4.0, 5.0], both, grad_norm_total=7.0), sampled(1, [4.0, 3.0, 12.0], both)])
    assert full.arrays["grad_norm"].tolist() == [5.0, 5.0, 13.0]
    assert full.arrays["grad_status"].tolist() == [NONZERO] * 3
    assert full.scalars["grad_norm_total"] == pytest.approx(math.sqrt(25 + 25 + 169))


BYTES = {"mem__params_bytes": 100.0}


def test_ddp_needs_only_rank_0_to_measure_where_only_rank_0_counts() -> None:
    ddp = np.ones(2, bool), np.zeros(2, bool)  # replicas count on rank 0 only
    got = combine([sampled(0, [3.0, 4.0], ddp[0], grad_norm_total=0.0), cheap(1, ddp[1])])
    assert got.arrays["grad_norm"].tolist() == [3.0, 4.0]
    assert got.arrays["param_norm"].tolist() == [4.0, 5.0]
    assert got.arrays["grad_status"].tolist() == [NONZERO, NONZERO]
    assert got.scalars["grad_norm_total"] == 5.0
    # rank 0 did not measure, rank 1 did: rank 1's pieces count nowhere, so nothing is known
    flipped = combine([cheap(0, ddp[0]), sampled(1, [3.0, 4.0], ddp[1], grad_norm_total=5.0)])
    assert sorted(flipped.arrays) == ["backward_passes"] and "grad_norm_total" not in flipped.scalars
    # rank 0 lost: no rank present holds a counted piece, so the step is unmeasured too
    alone = combine([sampled(1, [3.0, 4.0], ddp[1], grad_norm_total=5.0)])
    assert sorted(alone.arrays) == ["backward_passes"] and "grad_norm_total" not in alone.scalars


def test_a_norm_a_rank_holding_a_counted_piece_did_not_send_is_absent_there() -> None:
    """Both ranks measured, but only rank 0 sent exp_avg_norm: where rank 1's piece counts, the
    global exp_avg_norm is unknown (ABSENT), not rank 0's piece alone."""
    r0 = sampled(0, [1.0, 1.0], np.ones(2, bool))
    r0.arrays = {**r0.arrays, "exp_avg_norm": f32s(2.0, 2.0)}
    r1 = sampled(1, [1.0, 1.0], np.array([True, False]))
    got = combine([r0, r1]).arrays["exp_avg_norm"]
    assert is_absent(got[0]) and float(got[1]) == 2.0


def test_state_that_exists_on_one_rank_only_counts_once() -> None:
    """ZeroRedundancyOptimizer under DDP: the parameters count on rank 0, but each one's Adam state
    is on its owner rank only (ABSENT on the other): the global state norm is the owner's; the
    gradient of a parameter is never taken from a rank where it does not count."""
    ddp = np.ones(3, bool), np.zeros(3, bool)
    r0 = sampled(0, [1.0, 2.0, 3.0], ddp[0])
    r0.arrays = {**r0.arrays, "exp_avg_norm": f32s(5.0, ABSENT, ABSENT)}
    r1 = sampled(1, [9.0, 9.0, 9.0], ddp[1])
    r1.arrays = {**r1.arrays, "exp_avg_norm": f32s(ABSENT, 6.0, ABSENT)}
    got = combine([r0, r1]).arrays
    assert got["exp_avg_norm"][:2].tolist() == [5.0, 6.0] and is_absent(got["exp_avg_norm"][2])
    assert got["grad_norm"].tolist() == [1.0, 2.0, 3.0]


ABSENT = float(np.array([ABSENT_BITS], dtype="<u4").view("<f4")[0])


def f32s(*values: float) -> np.ndarray:
    return np.array(values, dtype="<f4")


def test_update_ratio_is_the_ratio_of_the_global_norms() -> None:
    rng = np.random.default_rng(7)
    pieces = random_pieces(rng, 2, 100)
    for p in pieces:
        p.arrays = {**p.arrays, "update_ratio": np.full(100, 123.0, dtype="<f4")}
    got = combine(pieces)
    update, before = got.arrays["update_norm"], got.arrays["param_before_norm"]
    for i in range(100):
        u = oracle_norm([p.arrays["update_norm"][i] for p in pieces if p.counted[i]])
        b = oracle_norm([p.arrays["param_before_norm"][i] for p in pieces if p.counted[i]])
        ratio = got.arrays["update_ratio"][i]
        if u is None or b is None:
            assert is_absent(ratio)
        else:
            with np.errstate(divide="ignore", invalid="ignore"):
                want = np.float64(update[i]) / np.float64(before[i])
            np.testing.assert_allclose(ratio, want, rtol=1e-6, equal_nan=True)


def test_optimizer_signals_of_pieces_are_those_of_the_joined_vectors() -> None:
    """Two ranks' pieces of two parameters (the second without optimizer state: ABSENT): the
    signals made from the pieces' norms equal those of the joined vectors, in float64."""
    rng = np.random.default_rng(3)
    g, m, v = (rng.normal(size=(2, 50)) for _ in range(3))
    v, thr = v * v, 0.3
    absent = np.array([ABSENT_BITS], dtype="<u4").view("<f4")[0]
    pieces = []
    for rank, part in enumerate((slice(0, 20), slice(20, 50))):
        gs, ms, vs = g[:, part], m[:, part], v[:, part]

        def norm(x: np.ndarray, held: bool = True) -> np.ndarray:
            out = np.sqrt((x * x).sum(axis=1)).astype("<f4")
            out[1] = out[1] if held else absent
            return out

        held = False
        arrays = {
            "eps_regime_norm": norm((vs < thr).astype(float), held),
            "eps_numel_norm": norm(np.ones_like(vs), held),
            "v_hat_root_norm": norm(np.sqrt(vs), held),
            "signal_grad_norm": norm(gs, held),
            "momentum_norm": norm(ms, held),
            "grad_momentum_norm": norm(gs + ms, held),
            "eps_share": np.full(2, 9.0, dtype="<f4"),  # a rank's own: replaced
            "grad_norm": norm(gs),  # a measured step
        }
        pieces.append(RankStep(rank, 0.0, {}, arrays, np.ones(2, dtype=bool)))
    got = combine(pieces).arrays
    share, decoupling, cosine = (
        (v[0] < thr).mean(),
        (g[0] ** 2).mean() / v[0].mean(),
        g[0] @ m[0] / (np.linalg.norm(g[0]) * np.linalg.norm(m[0])),
    )
    np.testing.assert_allclose(
        [got["eps_share"][0], got["v_decoupling"][0], got["momentum_cosine"][0]], [share, decoupling, cosine], rtol=1e-5
    )
    assert all(is_absent(got[s][1]) for s in ("eps_share", "v_decoupling", "momentum_cosine"))
    assert "signal_grad_norm" not in got and "eps_regime_norm" not in got


def test_scalars_by_family() -> None:
    def piece(rank: int, scalars: dict[str, float], grad: list[float]) -> RankStep:
        return RankStep(rank, 10.0 + rank, scalars, {"grad_norm": np.array(grad, dtype="<f4")}, np.ones(2, dtype=bool))

    a = piece(
        0,
        {
            "loss": 1.5,
            "lr/0": 1e-3,
            "mem/params_bytes": 100,
            "mem/optimizer_bytes": 10,
            "mem/rss_bytes": 5e8,
            "mem/cuda:0/allocated": 7.0,
            "time/step_s": 0.2,
            "hook/cpu_s": 0.01,
            "grad_norm_total": 999.0,
        },
        [3.0, 4.0],
    )
    b = piece(
        1,
        {
            "loss": 2.5,
            "lr/0": 5.0,
            "mem/params_bytes": 50,
            "mem/optimizer_bytes": 20,
            "mem/rss_bytes": 6e8,
            "mem/cuda:1/allocated": 9.0,
            "time/step_s": 0.9,
            "hook/cpu_s": 0.02,
            "grad_norm_total": 1.0,
        },
        [0.0, 12.0],
    )
    got = combine([b, a])
    assert got.time == 11.0
    assert got.scalars == {
        "loss": 1.5,
        "lr/0": 1e-3,
        "mem/params_bytes": 150.0,
        "mem/optimizer_bytes": 30.0,
        "mem/rss_bytes": 6e8,
        "mem/cuda:0/allocated": 7.0,
        "mem/cuda:1/allocated": 9.0,
        "time/step_s": 0.9,
        "hook/cpu_s": 0.02,
        "grad_norm_total": pytest.approx(math.sqrt(9 + 16 + 144)),
        RANKS_SCALAR: 2.0,
    }


def test_grad_norm_total_is_inf_with_an_inf_nan_with_a_nan_and_leaves_out_absent_entries() -> None:
    """The hook's own rule (sqrt of the sum of squares of every entry but ABSENT, in float64): an
    infinite gradient makes the total infinite, a NaN makes it NaN whatever else is there."""
    absent = np.array([ABSENT_BITS], dtype="<u4").view("<f4")[0]

    def total(*grad: float) -> float:
        one = RankStep(0, 1.0, {"grad_norm_total": 0.0}, {"grad_norm": np.array(grad, dtype="<f4")}, np.ones(4, bool))
        return combine([one]).scalars["grad_norm_total"]

    assert total(3.0, 0.0, absent, 4.0) == 5.0
    assert total(3.0, np.inf, absent, 4.0) == math.inf
    assert math.isnan(total(np.nan, np.inf, absent, 4.0))
    assert math.isnan(total(3.0, np.nan, absent, 4.0))
    # the oracle on random arrays: Python floats, ABSENT left out
    rng = np.random.default_rng(3)
    for _ in range(20):
        grad = np.exp(rng.uniform(-30, 45, 50)).astype("<f4")
        special = rng.random(50)
        grad[special < 0.03] = np.nan
        grad[(special >= 0.03) & (special < 0.08)] = np.inf
        grad.view("<u4")[(special >= 0.08) & (special < 0.2)] = ABSENT_BITS
        piece = RankStep(0, 1.0, {"grad_norm_total": 0.0}, {"grad_norm": grad}, np.ones(50, bool))
        want = oracle_norm(list(grad))
        got = combine([piece]).scalars["grad_norm_total"]
        assert want is not None
        if math.isnan(want):
            assert math.isnan(got)
        else:
            assert got == pytest.approx(want, rel=1e-9)


def test_desync_counts_the_replicas_that_differ_from_rank_0() -> None:
    count = 4
    replicated = np.array([True, True, True, False])
    base = np.array([1.0, 2.0, 3.0, 4.0], dtype="<f4")

    def piece(rank: int, grad: np.ndarray, status: list[int]) -> RankStep:
        return RankStep(rank, 0.0, {}, {"grad_norm": grad, "grad_status": np.array(status, "u1")}, np.ones(count, bool))

    same = piece(1, base * np.float32(1 + 1e-7), [2, 2, 2, 2])
    off = piece(2, np.array([1.0, 2.5, 3.0, 9.0], dtype="<f4"), [2, 2, 1, 2])  # param 3 is sharded: not judged
    found = desync([piece(0, base, [2, 2, 2, 2]), same, off], replicated)
    assert found is not None
    counts, ranks = found
    assert counts[:3].tolist() == [0.0, 1.0, 1.0] and is_absent(counts[3])
    assert ranks == {2: 2}
    step = with_desync(combine([piece(0, base, [2] * 4), off]), [piece(0, base, [2] * 4), off], replicated)
    assert step.scalars[f"{DESYNC_PREFIX}2"] == 2.0 and DESYNC_METRIC in step.arrays
    # a rank that did not measure the step is not compared; nor is an unmeasured job step
    unmeasured = RankStep(1, 0.0, {}, {"backward_passes": f32s(1, 1, 1, 1)}, np.zeros(count, bool))
    found = desync([piece(0, base, [2] * 4), unmeasured, off], replicated)
    assert found is not None and found[1] == {2: 2}
    sharded = np.array([True, True, True, True])
    halves = [piece(0, base, [2] * 4), RankStep(1, 0.0, {}, {"backward_passes": f32s(1, 1, 1, 1)}, sharded)]
    assert DESYNC_METRIC not in with_desync(combine(halves), halves, replicated).arrays
    # no replicated parameter, or rank 0 missing: the rule does not apply
    assert desync([piece(0, base, [2] * 4), off], np.zeros(count, bool)) is None
    assert desync([same, off], replicated) is None

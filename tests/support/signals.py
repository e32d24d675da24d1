"""The optimizer signals' oracle (gradwatch/signals.py), computed with plain torch in float64 from
the optimizer's own state as the step left it."""

from __future__ import annotations

import torch

from gradwatch.signals import EPS_FACTOR


def signals_oracle(opt: torch.optim.Optimizer, names: dict[torch.Tensor, str]) -> dict[str, dict[str, float]]:
    """Per metric and parameter name: eps_share, v_decoupling (Adam-style second moments) and
    momentum_cosine (any first moment or momentum buffer)."""
    out: dict[str, dict[str, float]] = {"eps_share": {}, "v_decoupling": {}, "momentum_cosine": {}}
    for group in opt.param_groups:
        for p in group["params"]:
            state, g, name = opt.state[p], p.grad.double(), names[p]
            m = state.get("exp_avg", state.get("momentum_buffer"))
            if m is not None:
                out["momentum_cosine"][name] = float(
                    torch.dot(g.flatten(), m.double().flatten()) / (g.norm() * m.norm())
                )
            if "exp_avg_sq" in state:
                t = float(state["step"])
                v_hat = state["exp_avg_sq"].double() / (1 - group["betas"][1] ** t)
                out["eps_share"][name] = float((v_hat < (EPS_FACTOR * group["eps"]) ** 2).double().mean())
                out["v_decoupling"][name] = float((g * g).mean() / v_hat.mean())
    return out

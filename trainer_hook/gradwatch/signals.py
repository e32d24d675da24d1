"""Optimizer signals that warn of instabilities (`watch(..., optimizer_signals=True)`), measured
at measured steps after the step, on the training device, with fused tensor math and no sync;
they ride with the step's one device-to-host copy (measure.py).

Per parameter:
- `eps_share` (the Adam family: a state with `exp_avg_sq`, a group with `eps` and `betas`): the
  share of entries whose bias-corrected second moment v̂ = v / (1 − β2^t) is below
  (EPS_FACTOR · eps)²: there the update is about lr · m / eps, not lr · m / √v̂, and a gradient
  that comes back is divided by almost nothing (Wortsman et al. 2023, Molybog et al. 2023).
- `v_decoupling`: mean(g²) / mean(v̂), the squared gradient against Adam's estimate of it: near 1
  (within the noise) while v̂ follows the gradient; far above 1 when the gradient outgrew a
  second moment that decayed, the moment before a blow-up.
- `momentum_cosine` (a state with `exp_avg` or `momentum_buffer`): the cosine between the
  gradient and the momentum after the step; a gradient turning against its momentum shows
  oscillation, one aligned with it for long a steady drift.

Each costs passes over the state (docs/diagnostics.md gives the figures): `eps_share` one
subtraction into a temporary the size of v, two in-place passes and a norm; `v_decoupling` one
L1 norm of v (the gradient's norm is read with the cosine); `momentum_cosine` one addition into
a temporary the size of the momentum and two norms.

A rank of a distributed job measures its local piece of each parameter (a DTensor's local tensor,
an FSDP1 slice: pieces.py), and its three signals are its piece's own. A ratio or a cosine of the
whole tensor is not a combination of the pieces' ratios, so with `pieces=True` each signal also
goes as the L2 norms it is made of (PIECE_NORMS), all of them computed above anyway; the server
adds them over the pieces as it adds every norm and divides the sums (docs/protocol.md,
"Distributed training"): no collective, no extra pass over a tensor.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, Optional

import torch

from .pieces import View

#: v̂ below (EPS_FACTOR · eps)² is the epsilon regime: eps is at least a third of the denominator.
EPS_FACTOR = 2.0

#: With `pieces=True`, the local L2 norms each signal is made of (a rank's piece): `eps_share` =
#: ‖1[v̂ < thr]‖² / ‖1‖² (`eps_regime_norm`, `eps_numel_norm`: the square roots of the entries in
#: the regime and of all entries), `v_decoupling` = ‖g‖² / ‖√v̂‖² (`signal_grad_norm`,
#: `v_hat_root_norm`: √Σv̂), `momentum_cosine` = (‖g + m‖² − ‖g‖² − ‖m‖²) / (2 ‖g‖ ‖m‖)
#: (`grad_momentum_norm`, `signal_grad_norm`, `momentum_norm`).
PIECE_NORMS = (
    "eps_regime_norm",
    "eps_numel_norm",
    "v_hat_root_norm",
    "signal_grad_norm",
    "momentum_norm",
    "grad_momentum_norm",
)

#: The state keys that hold a momentum (first moment) shaped like the parameter.
MOMENTUM_KEYS = ("exp_avg", "momentum_buffer")


def _step_count(state: dict[str, Any]) -> Optional[float | torch.Tensor]:
    """The optimizer's step count of a parameter: a number where it is on the host, the 0-d
    tensor itself where it lives on a device (fused and capturable Adam): read there, it would
    synchronise, so the bias correction is computed on that device."""
    step = state.get("step")
    if isinstance(step, (int, float)) and not isinstance(step, bool):
        return float(step)
    if isinstance(step, torch.Tensor) and step.numel() == 1:
        return float(step.item()) if step.device.type == "cpu" else step.reshape(())
    return None


def _on(device: torch.device, value: float | torch.Tensor) -> torch.Tensor:
    """`value` as a 0-d float32 tensor on `device`, made there (a fill, not a copy from the host)."""
    if isinstance(value, torch.Tensor):
        return value.to(device=device, dtype=torch.float32)
    return torch.full((), value, dtype=torch.float32, device=device)


def optimizer_signals(
    params: Sequence[torch.Tensor],
    indices: Iterable[int],
    states: Sequence[dict[Any, Any]],
    groups: Sequence[dict[str, Any]],
    views: Optional[Sequence[Optional[View]]] = None,
    pieces: bool = False,
) -> list[tuple[str, list[int], list[torch.Tensor]]]:
    """(metric, parameter indices, 0-d float32 tensors) for the parameters `indices`:
    `params[i]`'s optimizer state is `states[i]` and its param group `groups[i]`; `views[i]`, where
    given, takes this rank's piece of the parameter, its gradient and its state (pieces.py).
    `pieces`: also the norms of PIECE_NORMS, for the server to combine the ranks' pieces."""
    eps_idx: list[int] = []
    eps_v: list[torch.Tensor] = []
    eps_thr: list[float | torch.Tensor] = []
    eps_bc: list[float | torch.Tensor] = []
    cos_idx: list[int] = []
    cos_g: list[torch.Tensor] = []
    cos_m: list[torch.Tensor] = []
    grads: dict[int, torch.Tensor] = {}
    for i in indices:
        p = params[i]
        state, group = states[i], groups[i]
        g = p.grad
        if not state or g is None or g.is_sparse or g.shape != p.shape:
            continue
        view = None if views is None else views[i]
        if view is not None:  # this rank's piece of the parameter, its gradient and its state
            p, g = view(p), view(g)
            state = {
                k: view(t) if isinstance(t, torch.Tensor) and t.shape == params[i].shape else t
                for k, t in state.items()
            }
        grads[i] = g
        v = state.get("exp_avg_sq")
        eps, betas = group.get("eps"), group.get("betas")
        t = _step_count(state)
        if (
            isinstance(v, torch.Tensor)
            and v.shape == p.shape
            and v.dtype in (torch.float32, torch.float16, torch.bfloat16)
            and isinstance(eps, float)
            and isinstance(betas, (tuple, list))
            and len(betas) == 2
            and t is not None
            and (isinstance(t, torch.Tensor) or t >= 1)
        ):
            bc = 1.0 - float(betas[1]) ** t if isinstance(t, float) else 1.0 - torch.pow(float(betas[1]), t.double())
            eps_idx.append(i)
            eps_v.append(v)
            eps_thr.append((EPS_FACTOR * eps) ** 2 * bc)
            eps_bc.append(bc)
        m = next((state[k] for k in MOMENTUM_KEYS if isinstance(state.get(k), torch.Tensor)), None)
        if m is not None and m.shape == p.shape and m.dtype == g.dtype and m.device == g.device:
            cos_idx.append(i)
            cos_g.append(g)
            cos_m.append(m)
    out: list[tuple[str, list[int], list[torch.Tensor]]] = []
    grad_sq: dict[int, torch.Tensor] = {}
    if cos_idx:
        g_norm = torch.stack(_norms(cos_g))
        m_norm = torch.stack(_norms(cos_m))
        both = torch.stack(_norms(torch._foreach_add(cos_g, cos_m)))
        # <g, m> = (‖g + m‖² − ‖g‖² − ‖m‖²) / 2: two norms instead of a product and a sum per tensor
        cosine = (both * both - g_norm * g_norm - m_norm * m_norm) / (2 * g_norm * m_norm)
        out.append(("momentum_cosine", cos_idx, list(cosine.unbind())))
        grad_sq = {i: n * n for i, n in zip(cos_idx, g_norm.unbind())}
        if pieces:
            out.append(("signal_grad_norm", cos_idx, list(g_norm.unbind())))
            out.append(("momentum_norm", cos_idx, list(m_norm.unbind())))
            out.append(("grad_momentum_norm", cos_idx, list(both.unbind())))
    if eps_idx:
        on_host = all(isinstance(x, float) for x in eps_bc)
        if not on_host:  # a step count on the device: thresholds and corrections made there
            eps_thr = [_on(v.device, x) for v, x in zip(eps_v, eps_thr)]
            eps_bc = [_on(v.device, x) for v, x in zip(eps_v, eps_bc)]
        below = torch._foreach_sub(eps_v, eps_thr)  # type: ignore[arg-type]  # v − threshold; its sign is kept
        torch._foreach_clamp_max_(below, 0.0)
        torch._foreach_sign_(below)  # −1 where v̂ is in the epsilon regime, else 0
        counts = torch.stack(_norms(below))  # ‖·‖₂ of ±1 entries: √count
        # divided by host numbers as foreach scalars: a tensor of them made on the device would
        # be a synchronising copy
        shares = torch._foreach_div(list((counts * counts).unbind()), [float(v.numel()) for v in eps_v])
        out.append(("eps_share", eps_idx, list(shares)))
        v_sum = torch.stack([n.float() for n in torch._foreach_norm(eps_v, 1)])  # Σv (v >= 0)
        if pieces:  # √numel made on the device (a fill), √Σv̂ from Σv
            out.append(("eps_regime_norm", eps_idx, list(counts.unbind())))
            out.append(("eps_numel_norm", eps_idx, [_on(v.device, math.sqrt(v.numel())) for v in eps_v]))
            v_hat = torch._foreach_div(list(v_sum.unbind()), eps_bc)  # type: ignore[arg-type]
            out.append(("v_hat_root_norm", eps_idx, list(torch._foreach_sqrt(v_hat))))
        missing = [i for i in eps_idx if i not in grad_sq]
        if missing:
            for i, n in zip(missing, _norms([grads[i] for i in missing])):
                grad_sq[i] = n * n
                if pieces:
                    out.append(("signal_grad_norm", [i], [n]))
        g_sq = torch.stack([grad_sq[i].to(v_sum.device) for i in eps_idx])
        corrected = torch._foreach_div(list(v_sum.unbind()), eps_bc)  # type: ignore[arg-type]
        out.append(("v_decoupling", eps_idx, list(torch._foreach_div(list(g_sq.unbind()), corrected))))
    return out


def _norms(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """L2 norms as float32 0-d tensors, one fused call."""
    return [n.float() for n in torch._foreach_norm(list(tensors), 2)]

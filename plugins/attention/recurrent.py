"""Fused single-token step of causal momentum attention (eq. 12), for decoding."""
from typing import Optional, Tuple

import torch

from ..exported_eps import plus_eps
from .rule import MomentumRule
from .state import MomentumAttentionState


def fused_recurrent_step(fq: torch.Tensor, fk: torch.Tensor, v: torch.Tensor,
                         state: MomentumAttentionState, *, rule: MomentumRule,
                         eps: float, real: Optional[torch.Tensor] = None,
                         ) -> Tuple[torch.Tensor, MomentumAttentionState]:
    """Eq. 12 for one new position: fq, fk (B, H, Dk), v (B, H, Dv), in the state's dtype. For the
    momentum rule m_i = βm_{i−1} − φ(k_i)v_iᵀ, s_i = s_{i−1} − γm_i; for any rule (with m = −m′)
    m_i = r·m_{i−1} − φ(k_i)v_iᵀ, s_i = s_{i−1} − p·m_{i−1} + q·φ(k_i)v_iᵀ;  z_i = z_{i−1} + φ(k_i);
    v̂_i = φ(q_i)ᵀs_i / (φ(q_i)ᵀz_i + eps).
    `real` (B,) bool: rows where it is False keep their state and output 0."""
    outer = fk[..., :, None] * v[..., None, :]
    m = rule.decay * state.m - outer
    s = state.s - rule.carry * state.m + rule.direct * outer
    z = state.z + fk
    out = (fq[..., None, :] @ s)[..., 0, :] / plus_eps((fq * z).sum(-1, keepdim=True), eps)
    if real is not None:
        keep = real[:, None]
        m = torch.where(keep[..., None, None], m, state.m)
        s = torch.where(keep[..., None, None], s, state.s)
        z = torch.where(keep[..., None], z, state.z)
        out = torch.where(keep[..., None], out, torch.zeros((), dtype=out.dtype, device=out.device))
    return out, MomentumAttentionState.trusted(s, z, m)

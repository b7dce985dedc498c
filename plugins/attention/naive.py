"""Literal references for momentum attention: the quadratic forms eq. 13 / eq. 14 and the
recurrence eq. 12 (Momentum Transformer, Section 3.1). O(N²) or one token at a time; used
by the tests (in float64) and by the benchmark as the naive baseline. Padding follows the
fast path's contract: padded tokens are removed from the sequence, so exponents count real
tokens only, and outputs at padded causal positions are 0."""
from typing import Optional, Tuple

import torch

from .feature_maps import FeatureMap, resolve_feature_map
from .state import MomentumAttentionState


def momentum_weight(distance: torch.Tensor, momentum: float, step_size: float) -> torch.Tensor:
    """γ(1 − β^(d+1)) / (1 − β): the weight eq. 13 gives a key d real tokens before the query
    (eq. 14 uses d = N − j). At β = 0 it is γ for every d ≥ 0."""
    beta = torch.as_tensor(momentum, dtype=torch.float64)
    return step_size * (1.0 - beta ** (distance.to(torch.float64) + 1.0)) / (1.0 - beta)


def naive_causal_momentum_attention(q, k, v, *, momentum: float, step_size: float = 1.0,
                                    feature_map: FeatureMap = "elu",
                                    padding_mask: Optional[torch.Tensor] = None,
                                    eps: float = 1e-6) -> torch.Tensor:
    """Eq. 13, quadratic:
    v̂_i = γφ(q_i)ᵀ Σ_{j≤i} (1−β^(i−j+1))/(1−β) φ(k_j)v_jᵀ / (φ(q_i)ᵀ Σ_{j≤i} φ(k_j) + eps)."""
    phi = resolve_feature_map(feature_map)
    B, H, N, _ = q.shape
    mask = torch.ones(B, N, dtype=torch.bool, device=q.device) if padding_mask is None else padding_mask
    count = mask.cumsum(-1)                                     # real tokens in [0, i]
    distance = count[:, :, None] - count[:, None, :]            # real tokens in (j, i]
    lower = torch.ones(N, N, dtype=torch.bool, device=q.device).tril()
    allowed = mask[:, :, None] & mask[:, None, :] & (distance >= 0) & lower
    weight = torch.where(allowed, momentum_weight(distance, momentum, step_size).to(q.dtype),
                         torch.zeros((), dtype=q.dtype, device=q.device))
    fq, fk = phi(q), phi(k)
    scores = fq @ fk.transpose(-1, -2)                          # φ(q_i)ᵀφ(k_j)
    numerator = (scores * weight[:, None]) @ v
    denominator = (scores * allowed[:, None].to(q.dtype)).sum(-1, keepdim=True) + eps
    return numerator / denominator * mask[:, None, :, None].to(q.dtype)


def naive_noncausal_momentum_attention(q, k, v, *, momentum: float, step_size: float = 1.0,
                                       feature_map: FeatureMap = "elu",
                                       padding_mask: Optional[torch.Tensor] = None,
                                       eps: float = 1e-6) -> torch.Tensor:
    """Eq. 14, quadratic: v̂_i = γφ(q_i)ᵀ Σ_j (1−β^(N−j+1))/(1−β) φ(k_j)v_jᵀ / (φ(q_i)ᵀ Σ_j φ(k_j) + eps),
    with N and j counted over each sequence's real keys."""
    phi = resolve_feature_map(feature_map)
    B, Nk = k.shape[0], k.shape[2]
    mask = torch.ones(B, Nk, dtype=torch.bool, device=k.device) if padding_mask is None else padding_mask
    after = mask.flip(-1).cumsum(-1).flip(-1) - 1               # real keys after j = N − j
    zero = torch.zeros((), dtype=q.dtype, device=q.device)
    weight = torch.where(mask, momentum_weight(after, momentum, step_size).to(q.dtype), zero)
    fq, fk = phi(q), phi(k)
    scores = fq @ fk.transpose(-1, -2)
    numerator = (scores * weight[:, None, None, :]) @ v
    denominator = (scores * mask[:, None, None, :].to(q.dtype)).sum(-1, keepdim=True) + eps
    return numerator / denominator


def naive_recurrent_momentum_attention(q, k, v, state: Optional[MomentumAttentionState] = None, *,
                                       momentum: float, step_size: float = 1.0,
                                       feature_map: FeatureMap = "elu",
                                       padding_mask: Optional[torch.Tensor] = None,
                                       eps: float = 1e-6) -> Tuple[torch.Tensor, MomentumAttentionState]:
    """Eq. 12, one token at a time:
    m_i = βm_{i−1} − φ(k_i)v_iᵀ;  s_i = s_{i−1} − γm_i;  z_i = z_{i−1} + φ(k_i);
    v̂_i = φ(q_i)ᵀs_i / (φ(q_i)ᵀz_i + eps).
    A padded token leaves the state unchanged and outputs 0."""
    phi = resolve_feature_map(feature_map)
    B, H, N = q.shape[:3]
    fq_all, fk_all = phi(q), phi(k)                             # the map may change Dk
    if state is None:
        state = MomentumAttentionState.zeros(B, H, fk_all.shape[-1], v.shape[-1], dtype=q.dtype,
                                             device=q.device)
    s, z, m = state.s, state.z, state.m
    outputs = []
    for i in range(N):
        fq, fk, vi = fq_all[:, :, i], fk_all[:, :, i], v[:, :, i]
        m_new = momentum * m - fk[..., :, None] * vi[..., None, :]
        s_new = s - step_size * m_new
        z_new = z + fk
        out = (fq[..., None, :] @ s_new)[..., 0, :] / ((fq * z_new).sum(-1, keepdim=True) + eps)
        if padding_mask is not None:
            real = padding_mask[:, i, None, None]
            m_new = torch.where(real[..., None], m_new, m)
            s_new = torch.where(real[..., None], s_new, s)
            z_new = torch.where(real, z_new, z)
            out = out * real.to(out.dtype)
        m, s, z = m_new, s_new, z_new
        outputs.append(out)
    out = torch.stack(outputs, dim=2) if outputs else q.new_zeros(B, H, 0, v.shape[-1])
    return out, MomentumAttentionState(s=s, z=z, m=m)

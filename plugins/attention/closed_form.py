"""Eq. 12's closed form: the state after a run of tokens without stepping the recurrence. A rule
(`rule.MomentumRule`: m'_i = r·m'_{i−1} + φ(k_i)v_iᵀ, s_i = s_{i−1} + p·m'_{i−1} + q·φ(k_i)v_iᵀ,
z_i = z_{i−1} + φ(k_i); eq. 12 with m' = −m is r = β, p = γβ, q = γ) is affine in the state it
starts from, so the state after L real tokens entered with (s₀, m'₀, z₀) is
    m'_L = m_on_m(L)·m'₀ + M,   s_L = s₀ + m_on_s(L)·m'₀ + S,   z_L = z₀ + Z,
where (S, Z, M) is the run's state from a zero start (`run_state`) and the map is `advance`. The
chunked kernels' returned state and context parallelism's exchanged states are both this."""
from typing import Optional

import torch

from .rule import MomentumRule
from .state import MomentumAttentionState


def run_state(fk: torch.Tensor, v: torch.Tensor, after: torch.Tensor, real: Optional[torch.Tensor], *,
              rule: MomentumRule) -> MomentumAttentionState:
    """The state a rule reaches over a run of tokens from a zero start (Momentum Transformer,
    eq. 12): with a_j the real tokens after j in the run,
    m'_L = Σ_j input_on_m(a_j) φ(k_j)v_jᵀ,  s_L = Σ_j input_on_s(a_j) φ(k_j)v_jᵀ,  z_L = Σ_j φ(k_j)
    (eq. 13's weight γ(1−β^(a_j+1))/(1−β) on s for eq. 12). fk (B, H, N, D′) and v (B, H, N, Dv)
    are zero at padded positions; after (B, N) holds a_j; real (B, N) True = real token, any
    pattern, or None (every token real)."""
    after = after.clamp(min=0)
    weights = torch.stack([rule.input_on_m(after), rule.input_on_s(after)], dim=1)
    if real is not None:
        weights = torch.where(real[:, None], weights, torch.zeros((), dtype=torch.float64, device=fk.device))
    both = torch.einsum("bhnd,bwn,bhne->bwhde", fk, weights.to(fk.dtype), v)
    return MomentumAttentionState(s=both[:, 1], z=fk.sum(2), m=-both[:, 0])


def advance(state: MomentumAttentionState, local: MomentumAttentionState, length: torch.Tensor, *,
            rule: MomentumRule) -> MomentumAttentionState:
    """The state after a run of `length` (B,) real tokens whose zero-start state is `local`, entered
    with `state` (Momentum Transformer, eq. 12, which is affine in its initial state; m' = −m):
    m'_L = m_on_m(L)·m'₀ + M,  s_L = s₀ + m_on_s(L)·m'₀ + S,  z_L = z₀ + Z."""
    decay = rule.m_on_m(length).to(local.s.dtype)[:, None, None, None]
    carry = rule.m_on_s(length).to(local.s.dtype)[:, None, None, None]
    m0 = -state.m.to(local.m.dtype)
    return MomentumAttentionState(s=local.s + state.s + carry * m0, z=local.z + state.z,
                                  m=local.m - decay * m0)

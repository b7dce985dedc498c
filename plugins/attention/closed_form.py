"""Eq. 12's closed form: the state after a run of tokens without stepping the recurrence. With
m' = −m, eq. 12 (m'_i = βm'_{i−1} + φ(k_i)v_iᵀ, s_i = s_{i−1} + γm'_i, z_i = z_{i−1} + φ(k_i)) is
affine in the state it starts from, so the state after L real tokens entered with (s₀, m'₀, z₀) is
    m'_L = β^L m'₀ + M,   s_L = s₀ + γβ(1−β^L)/(1−β) m'₀ + S,   z_L = z₀ + Z,
where (S, Z, M) is the run's state from a zero start (`run_state`) and the map is `advance`. The
chunked kernels' returned state and context parallelism's exchanged states are both this."""
from typing import Optional

import torch

from .coefficients import geometric
from .state import MomentumAttentionState


def run_state(fk: torch.Tensor, v: torch.Tensor, after: torch.Tensor, real: Optional[torch.Tensor], *,
              momentum: float, step_size: float) -> MomentumAttentionState:
    """The state eq. 12 reaches over a run of tokens from a zero start (Momentum Transformer,
    eq. 12): with a_j the real tokens after j in the run,
    m'_L = Σ_j β^(a_j) φ(k_j)v_jᵀ,  s_L = Σ_j γ(1−β^(a_j+1))/(1−β) φ(k_j)v_jᵀ,  z_L = Σ_j φ(k_j).
    fk (B, H, N, D′) and v (B, H, N, Dv) are zero at padded positions; after (B, N) holds a_j;
    real (B, N) True = real token, any pattern, or None (every token real)."""
    after = after.clamp(min=0).to(torch.float64)
    beta = torch.tensor(momentum, dtype=torch.float64, device=fk.device)
    weights = torch.stack([beta ** after, step_size * geometric(momentum, after + 1)], dim=1)
    if real is not None:
        weights = torch.where(real[:, None], weights, torch.zeros((), dtype=torch.float64, device=fk.device))
    both = torch.einsum("bhnd,bwn,bhne->bwhde", fk, weights.to(fk.dtype), v)
    return MomentumAttentionState(s=both[:, 1], z=fk.sum(2), m=-both[:, 0])


def advance(state: MomentumAttentionState, local: MomentumAttentionState, length: torch.Tensor, *,
            momentum: float, step_size: float) -> MomentumAttentionState:
    """The state after a run of `length` (B,) real tokens whose zero-start state is `local`, entered
    with `state` (Momentum Transformer, eq. 12, which is affine in its initial state; m' = −m):
    m'_L = β^L m'₀ + M,  s_L = s₀ + γβ(1−β^L)/(1−β) m'₀ + S,  z_L = z₀ + Z."""
    length = length.to(torch.float64)
    beta = torch.tensor(momentum, dtype=torch.float64, device=length.device)
    decay = (beta ** length).to(local.s.dtype)[:, None, None, None]
    carry = (step_size * momentum * geometric(momentum, length)).to(local.s.dtype)[:, None, None, None]
    m0 = -state.m.to(local.m.dtype)
    return MomentumAttentionState(s=local.s + state.s + carry * m0, z=local.z + state.z,
                                  m=local.m - decay * m0)

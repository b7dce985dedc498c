"""Chunked O(N) causal momentum attention (eq. 13), exact.

The weight γ(1−β^(i−j+1))/(1−β) of eq. 13 is what the recurrence eq. 12 accumulates with
m' = −m:  m'_i = βm'_{i−1} + φ(k_i)v_iᵀ,  s_i = s_{i−1} + γm'_i.  Inside a chunk the weights are
applied as a C×C matrix (matmuls); across chunks only (s, m') at chunk boundaries are carried:
s at local position a = s_in + carry[a]·m'_in + Σ_{j≤a} intra[a, j] φ(k_j)v_jᵀ.
With β = 0 (plain linear attention) m' never reaches s and is not carried at all.
"""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from .coefficients import ChunkCoefficients, geometric
from .state import MomentumAttentionState


def chunk_causal_momentum_attention(
    fq: torch.Tensor, fk: torch.Tensor, v: torch.Tensor, *, momentum: float, step_size: float,
    eps: float, chunk_size: int, initial_state: Optional[MomentumAttentionState] = None,
    lengths: Optional[torch.Tensor] = None, return_state: bool = False,
) -> Tuple[torch.Tensor, Optional[MomentumAttentionState]]:
    """Causal momentum attention on feature-mapped inputs fq, fk (B, H, N, Dk) and v (B, H, N, Dv),
    all in the compute dtype. Padded keys must already be zero and padding must be on the right
    (`lengths` (B,) = real tokens per row, needed only for the returned state). Returns the
    output (B, H, N, Dv) and, if asked, the state after each row's last real token."""
    B, H, N, Dk = fq.shape
    Dv = v.shape[-1]
    C = min(chunk_size, N)
    nc = -(-N // C)
    pad = nc * C - N
    coef = ChunkCoefficients.build(momentum, step_size, C, fq.dtype, fq.device)

    z = fk.cumsum(2)
    if initial_state is not None:
        z = z + initial_state.z[:, :, None, :]
    denominator = (fq * z).sum(-1, keepdim=True) + eps

    Q, K, V = (F.pad(t, (0, 0, 0, pad)).reshape(B, H, nc, C, t.shape[-1]) for t in (fq, fk, v))
    numerator = ((Q @ K.transpose(-1, -2)) * coef.intra) @ V
    s0 = initial_state.s if initial_state is not None else fq.new_zeros(B, H, Dk, Dv)
    if momentum == 0.0:
        local_s = K.transpose(-1, -2) @ V * step_size
        s_in = _exclusive_cumsum(local_s, s0)
        numerator = numerator + Q @ s_in
    else:
        weighted = torch.cat([K * coef.to_end_m[:, None], K * coef.to_end_s[:, None]], dim=-1)
        local = weighted.transpose(-1, -2) @ V                       # (B, H, nc, 2Dk, Dv)
        local_m, local_s = local[..., :Dk, :], local[..., Dk:, :]
        m_in = _decayed_states(local_m, coef.decay, -initial_state.m if initial_state is not None else None)
        s_in = _exclusive_cumsum(local_s + coef.carry[-1] * m_in, s0)
        both = Q @ torch.cat([s_in, m_in], dim=-1)                   # (B, H, nc, C, 2Dv)
        numerator = numerator + both[..., :Dv] + coef.carry[:, None] * both[..., Dv:]
    out = numerator.reshape(B, H, nc * C, Dv)[:, :, :N] / denominator

    state = None
    if return_state:
        state = final_state(fk, v, momentum=momentum, step_size=step_size,
                            initial_state=initial_state, lengths=lengths)
    return out, state


def final_state(fk: torch.Tensor, v: torch.Tensor, *, momentum: float, step_size: float,
                initial_state: Optional[MomentumAttentionState] = None,
                lengths: Optional[torch.Tensor] = None) -> MomentumAttentionState:
    """Closed form of eq. 12 after L_b real tokens (right padding), from state (s₀, m₀, z₀):
    m'_L = β^L m'₀ + Σ_j β^(L−1−j) φ(k_j)v_jᵀ,
    s_L  = s₀ + γβ(1−β^L)/(1−β) m'₀ + Σ_j γ(1−β^(L−j))/(1−β) φ(k_j)v_jᵀ,   z_L = z₀ + Σ_j φ(k_j)."""
    B, H, N, Dk = fk.shape
    if lengths is None:
        lengths = torch.full((B,), N, dtype=torch.long, device=fk.device)
    j = torch.arange(N, device=fk.device, dtype=torch.float64)
    after = lengths.to(torch.float64)[:, None] - 1 - j                       # (B, N)
    real = after >= 0
    zero = torch.zeros((), dtype=torch.float64, device=fk.device)
    beta = torch.tensor(momentum, dtype=torch.float64, device=fk.device)
    w_m = torch.where(real, beta ** after.clamp(min=0), zero)
    w_s = torch.where(real, step_size * geometric(momentum, after.clamp(min=0) + 1), zero)
    weights = torch.stack([w_m, w_s], dim=1).to(fk.dtype)                  # (B, 2, N)
    both = torch.einsum("bhnd,bwn,bhne->bwhde", fk, weights, v)
    m_prime, s = both[:, 0], both[:, 1]
    z = fk.sum(2)
    if initial_state is not None:
        length = lengths.to(torch.float64)
        m0 = -initial_state.m.to(fk.dtype)
        decay = (beta ** length).to(fk.dtype)[:, None, None, None]
        carry = (step_size * momentum * geometric(momentum, length)).to(fk.dtype)[:, None, None, None]
        m_prime = m_prime + decay * m0
        s = s + initial_state.s + carry * m0
        z = z + initial_state.z
    return MomentumAttentionState(s=s, z=z, m=-m_prime)


def _exclusive_cumsum(local: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
    """State entering each chunk: start + Σ_{c' < c} local[c'] along the chunk axis (dim 2)."""
    total = local.cumsum(2) - local
    return total + start[:, :, None]


def _decayed_states(local: torch.Tensor, decay: float, start: Optional[torch.Tensor]) -> torch.Tensor:
    """m' entering each chunk: m'_{c+1} = β^C m'_c + local[c]. A loop over N/C chunks of cheap
    (Dk, Dv) updates; the heavy work stays in the batched matmuls above."""
    state = start if start is not None else torch.zeros_like(local[:, :, 0])
    states = [state]
    for c in range(local.shape[2] - 1):
        state = decay * state + local[:, :, c]
        states.append(state)
    return torch.stack(states, dim=2)

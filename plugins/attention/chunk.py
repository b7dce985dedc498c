"""Chunked O(N) causal momentum attention (eq. 13), exact.

The weight γ(1−β^(i−j+1))/(1−β) of eq. 13 is what the recurrence eq. 12 accumulates with
m' = −m:  m'_i = βm'_{i−1} + φ(k_i)v_iᵀ,  s_i = s_{i−1} + γm'_i.  Inside a chunk the weights are
applied as a C×C matrix (matmuls); across chunks only (s, m') at chunk boundaries are carried:
s at local position a = s_in + carry[a]·m'_in + Σ_{j≤a} intra[a, j] φ(k_j)v_jᵀ.
With β = 0 (plain linear attention) m' never reaches s and is not carried at all.

Causality holds entry by entry, NaN and inf included: a later position is kept out of an
earlier one with `where` (within a chunk) or by never entering its sum (across chunks), not by
a zero weight, since 0 × NaN = NaN. Only a matmul's zero-weighted v rows remain, which is why
the API hands this kernel finite inputs (`nonfinite.py`).
"""
import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from .closed_form import advance, run_state
from .coefficients import ChunkCoefficients
from .state import MomentumAttentionState

SCAN_BLOCK = 16


def chunk_causal_momentum_attention(
    fq: torch.Tensor, fk: torch.Tensor, v: torch.Tensor, *, momentum: float, step_size: float,
    eps: float, chunk_size: int, initial_state: Optional[MomentumAttentionState] = None,
    lengths: Optional[torch.Tensor] = None, return_state: bool = False,
) -> Tuple[torch.Tensor, Optional[MomentumAttentionState]]:
    """Causal momentum attention on feature-mapped inputs fq, fk (B, H, N, Dk) and v (B, H, N, Dv),
    all finite and in the compute dtype, N ≥ 1. Padded keys must already be zero and padding
    must be on the right (`lengths` (B,) = real tokens per row, needed only for the returned
    state). Returns the output (B, H, N, Dv) and, if asked, the state after each row's last
    real token."""
    B, H, N, Dk = fq.shape
    Dv = v.shape[-1]
    C = min(chunk_size, N)
    nc = -(-N // C)
    pad = nc * C - N
    coef = ChunkCoefficients.build(momentum, step_size, C, fq.dtype, fq.device)
    Q, K, V = ((F.pad(t, (0, 0, 0, pad)) if pad else t).reshape(B, H, nc, C, t.shape[-1])
               for t in (fq, fk, v))
    init = initial_state

    scores = Q @ K.transpose(-1, -2)                                 # φ(q_i)ᵀφ(k_j) in a chunk
    zero = torch.zeros((), dtype=scores.dtype, device=scores.device)
    numerator = torch.where(coef.causal, scores * coef.intra, zero) @ V
    z_in = _exclusive_cumsum(K.sum(3), None if init is None else init.z)
    denominator = (torch.where(coef.causal, scores, zero).sum(-1, keepdim=True)
                   + (Q * z_in[:, :, :, None]).sum(-1, keepdim=True))

    s0 = None if init is None else init.s
    if momentum == 0.0:
        s_in = _exclusive_cumsum(K.transpose(-1, -2) @ V * step_size, s0)
        numerator = numerator + Q @ s_in
    else:
        Kt = K.transpose(-1, -2)
        local_m = (Kt * coef.to_end_m) @ V                           # m' gained within chunk c
        local_s = (Kt * coef.to_end_s) @ V                           # s gained within chunk c
        m_in = decayed_exclusive_scan(local_m, coef.decay, None if init is None else -init.m)
        s_in = _exclusive_cumsum(local_s + coef.carry[-1] * m_in, s0)
        numerator = numerator + Q @ s_in + coef.carry[:, None] * (Q @ m_in)
    out = (numerator / (denominator + eps)).reshape(B, H, nc * C, Dv)[:, :, :N]

    state = None
    if return_state:
        state = final_state(fk, v, momentum=momentum, step_size=step_size,
                            initial_state=init, lengths=lengths)
    return out, state


def final_state(fk: torch.Tensor, v: torch.Tensor, *, momentum: float, step_size: float,
                initial_state: Optional[MomentumAttentionState] = None,
                lengths: Optional[torch.Tensor] = None) -> MomentumAttentionState:
    """The state after each row's L_b real tokens (right padding) from `initial_state` (None: zero),
    by eq. 12's closed form (`closed_form`): token j has L_b − 1 − j real tokens after it."""
    B, N = fk.shape[0], fk.shape[2]
    if lengths is None:
        lengths = torch.full((B,), N, dtype=torch.long, device=fk.device)
    after = lengths[:, None] - 1 - torch.arange(N, device=fk.device)                # (B, N)
    state = run_state(fk, v, after, after >= 0, momentum=momentum, step_size=step_size)
    if initial_state is None:
        return state
    return advance(initial_state, state, lengths, momentum=momentum, step_size=step_size)


def decayed_exclusive_scan(x: torch.Tensor, decay: float, start: Optional[torch.Tensor]) -> torch.Tensor:
    """y[c] = decay^c·start + Σ_{c'<c} decay^(c−1−c')·x[c'] along dim 2 of x (B, H, n, ...): the
    state m' entering each chunk. Up to SCAN_BLOCK steps run as the recurrence itself (so x[c']
    never meets, even with weight 0, a y[c] with c ≤ c'); longer scans work in blocks and
    recurse on the block totals, so there are O(log n) levels of SCAN_BLOCK steps. Powers come
    from float64 and are used as products, never divided."""
    B, H, n = x.shape[:3]
    width = math.prod(x.shape[3:])                  # explicit, so that B = 0 reshapes too
    flat = x.reshape(B, H, n, width)
    if n <= SCAN_BLOCK:
        y = _exclusive_recurrence(flat, decay)
        if start is not None:
            y = y + _powers(decay, n, x.dtype, x.device)[:, None] * start.reshape(B, H, 1, width)
        return y.reshape(x.shape)
    G = SCAN_BLOCK
    ng = -(-n // G)
    blocks = F.pad(flat, (0, 0, 0, ng * G - n)).reshape(B, H, ng, G, width)
    within = _exclusive_recurrence(blocks.transpose(2, 3), decay).transpose(2, 3)  # from a zero start
    to_end = _powers(decay, G, x.dtype, x.device).flip(0)                       # decay^(G−1−c')
    totals = (blocks * to_end[:, None]).sum(3)                                  # state after each block
    start = None if start is None else start.reshape(B, H, width)
    entering = decayed_exclusive_scan(totals, decay ** G, start)
    y = within + _powers(decay, G, x.dtype, x.device)[:, None] * entering[:, :, :, None]
    return y.reshape(B, H, ng * G, width)[:, :, :n].reshape(x.shape)


def _exclusive_recurrence(x: torch.Tensor, decay: float) -> torch.Tensor:
    """y[0] = 0, y[c] = decay·y[c−1] + x[c−1] along dim 2 (a short axis: SCAN_BLOCK at most)."""
    steps = x.unbind(2)                 # one backward for all steps (indexing would zero-fill x per step)
    ys = [torch.zeros_like(steps[0])]
    for step in steps[:-1]:
        ys.append(decay * ys[-1] + step)
    return torch.stack(ys, 2)


def _powers(decay: float, n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    powers = torch.tensor(decay, dtype=torch.float64) ** torch.arange(n, dtype=torch.float64)
    return powers.to(dtype=dtype, device=device)


def _exclusive_cumsum(local: torch.Tensor, start: Optional[torch.Tensor]) -> torch.Tensor:
    """State entering each chunk: start + Σ_{c' < c} local[c'] along the chunk axis (dim 2);
    shifted, not `cumsum − local`, which would bring an inf in local[c] into chunk c itself."""
    total = torch.cat([torch.zeros_like(local[:, :, :1]), local[:, :, :-1].cumsum(2)], 2)
    return total if start is None else total + start[:, :, None]

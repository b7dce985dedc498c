"""Chunked O(N) causal momentum attention (eq. 13), exact, for any rule (`rule.MomentumRule`).

The weight γ(1−β^(i−j+1))/(1−β) of eq. 13 is what the recurrence eq. 12 accumulates with
m' = −m:  m'_i = βm'_{i−1} + φ(k_i)v_iᵀ,  s_i = s_{i−1} + γm'_i.  Inside a chunk the weights are
applied as a C×C matrix (matmuls); across chunks only (s, m') at chunk boundaries are carried:
s at local position a = s_in + carry[a]·m'_in + Σ_{j≤a} intra[a, j] φ(k_j)v_jᵀ.
A rule whose m' never reaches s (β = 0: plain linear attention) does not carry m' at all.

`chunk_body` is the one kernel: it works on chunk tiles, each chunk either continuing the chunk
before it or starting a sequence from a restart state. Rows of a batch are laid out by reshape
(`chunk_causal_momentum_attention`: chunk 0 of each row starts), packed rows by the chunk-aligned
gather of `varlen.SegmentChunks`; both return states by `last_chunk_states`.

Causality holds entry by entry, NaN and inf included: a later position is kept out of an
earlier one with `where` (within a chunk) or by never entering its sum (across chunks, `scan`),
not by a zero weight, since 0 × NaN = NaN. Only a matmul's zero-weighted v rows remain, which is
why the API hands this kernel finite inputs (`nonfinite.py`).
"""
from typing import NamedTuple, Optional, Tuple

import torch
import torch.nn.functional as F

from ..exported_eps import plus_eps
from ..exporting import exports_a_symbolic
from .closed_form import advance, run_state
from .coefficients import ChunkCoefficients
from .rule import MomentumRule
from .scan import entering
from .state import MomentumAttentionState


class Entering(NamedTuple):
    """The state entering each chunk, (B, H, T, ...): s, z and m' (= −m; None when not carried)."""

    s: torch.Tensor
    z: torch.Tensor
    m: Optional[torch.Tensor]


def chunk_causal_momentum_attention(
    fq: torch.Tensor, fk: torch.Tensor, v: torch.Tensor, *, rule: MomentumRule,
    eps: float, chunk_size: int, initial_state: Optional[MomentumAttentionState] = None,
    lengths: Optional[torch.Tensor] = None, return_state: bool = False,
) -> Tuple[torch.Tensor, Optional[MomentumAttentionState]]:
    """Causal attention of `rule` on feature-mapped inputs fq, fk (B, H, N, Dk) and v (B, H, N, Dv),
    all finite and in the compute dtype, N ≥ 1. Padded keys must already be zero and padding
    must be on the right (`lengths` (B,) = real tokens per row, needed only for the returned
    state). Returns the output (B, H, N, Dv) and, if asked, the state after each row's last
    real token."""
    B, H, N, _ = fq.shape
    traced = torch.compiler.is_compiling()      # N may be symbolic: the chunk size must not follow it
    C = chunk_size if traced else min(chunk_size, N)
    exported = exports_a_symbolic(N)
    if exported:
        Q, K, V = (_exported_tiles(t, C) for t in (fq, fk, v))
    else:
        # traced, always one chunk of padding at least: whether N fills its chunks exactly (a slice
        # that is whole or not) would otherwise be a graph of its own under dynamic shapes
        nc = N // C + 1 if traced else -(-N // C)
        pad = nc * C - N
        Q, K, V = ((F.pad(t, (0, 0, 0, pad)) if traced or pad else t).reshape(B, H, nc, C, t.shape[-1])
                   for t in (fq, fk, v))
    init = initial_state
    restart = None if init is None else Entering(init.s[:, :, None], init.z[:, :, None], -init.m[:, :, None])
    out, enter = chunk_body(Q, K, V, rule=rule, eps=eps, first=None, restart=restart,
                            carry_m=rule.carries_momentum or return_state)
    out = out.flatten(2, 3)
    out = out.index_select(2, torch.arange(N, device=out.device)) if exported else out[:, :, :N]
    if not return_state:
        return out, None
    if lengths is None:
        lengths = torch.full((B,), N, dtype=torch.long, device=fq.device)
    last = (lengths - 1).clamp(min=0) // C
    rows = torch.arange(B, device=fq.device)
    return out, last_chunk_states(K, V, enter, rows, last, lengths - last * C, rule=rule)


def _exported_tiles(t: torch.Tensor, C: int) -> torch.Tensor:
    """t (B, H, N, D) as chunk tiles (B, H, N // C + 2, C, D), zero past N, under torch.export with
    N symbolic: a gather (ONNX Gather) from t with one zero row appended, which every slot past N
    reads. Padding then reshaping guards on N modulo C (the reshape's divisibility, the cut's
    strides), which export cannot prove for a range of N; so does a view that splits the gathered
    slots chunk-first (C·(N // C + 2) modulo N // C + 2), but not slot-first (modulo C). Two chunks
    more than N // C, so that the chunk count is never 1, which a contiguity check would guard on."""
    B, H, N, D = t.shape
    chunks = N // C + 2
    slot_first = torch.arange(C, device=t.device)[:, None] + C * torch.arange(chunks, device=t.device)
    padded = torch.cat([t, t.new_zeros(B, H, 1, D)], 2)
    gathered = padded.index_select(2, slot_first.clamp(max=N).flatten())
    return gathered.view(B, H, C, chunks, D).transpose(2, 3).contiguous()


def chunk_body(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, *, rule: MomentumRule, eps: float,
               first: Optional[torch.Tensor], restart: Optional[Entering],
               carry_m: bool) -> Tuple[torch.Tensor, Entering]:
    """Eq. 13 on chunk tiles Q, K (B, H, T, C, Dk), V (B, H, T, C, Dv) (zero at unused slots; slots
    are filled from a chunk's start). first (T,) bool: the chunk starts a sequence, entered with
    `restart` (per-chunk tensors broadcast against (B, H, T, ...), None: zero); first None: only
    chunk 0 starts. carry_m: also carry m' where it never reaches s (for returned states).
    Returns the output tiles (B, H, T, C, Dv) and the state entering each chunk."""
    coef = ChunkCoefficients.build(rule, Q.shape[3], Q.dtype, Q.device)
    scores = Q @ K.transpose(-1, -2)                                 # φ(q_i)ᵀφ(k_j) in a chunk
    zero = torch.zeros((), dtype=scores.dtype, device=scores.device)
    numerator = torch.where(coef.causal, scores * coef.intra, zero) @ V
    z_in = entering(K.sum(3), 1.0, first, None if restart is None else restart.z)
    denominator = (torch.where(coef.causal, scores, zero).sum(-1, keepdim=True)
                   + (Q * z_in[:, :, :, None]).sum(-1, keepdim=True))

    Kt = K.transpose(-1, -2)
    local_s = (Kt * coef.to_end_s) @ V                               # s gained within chunk t
    m_in = None
    if carry_m:
        local_m = (Kt * coef.to_end_m) @ V                           # m' gained within chunk t
        m_in = entering(local_m, coef.decay, first, None if restart is None else restart.m)
    if rule.carries_momentum:
        local_s = local_s + coef.carry[-1] * m_in
    s_in = entering(local_s, 1.0, first, None if restart is None else restart.s)
    numerator = numerator + Q @ s_in
    if rule.carries_momentum:
        numerator = numerator + coef.carry[:, None] * (Q @ m_in)
    return numerator / plus_eps(denominator, eps), Entering(s_in, z_in, m_in)


def last_chunk_states(K: torch.Tensor, V: torch.Tensor, enter: Entering, rows: torch.Tensor,
                      last: torch.Tensor, count: torch.Tensor, *,
                      rule: MomentumRule) -> MomentumAttentionState:
    """The state after each sequence: eq. 12's closed form (`final_state`) over the `count` (R,)
    tokens of its last chunk (row rows[i], chunk last[i] of the tiles K, V and of `enter`),
    started from the state entering that chunk. A sequence of no tokens keeps the state
    entering its chunk (count 0)."""
    pick = lambda t: t[rows, :, last]                                                # (R, H, ...)
    m = enter.m if enter.m is not None else torch.zeros_like(enter.s)
    state = MomentumAttentionState(s=pick(enter.s), z=pick(enter.z), m=-pick(m))
    return final_state(pick(K), pick(V), rule=rule, initial_state=state, lengths=count)


def final_state(fk: torch.Tensor, v: torch.Tensor, *, rule: MomentumRule,
                initial_state: Optional[MomentumAttentionState] = None,
                lengths: Optional[torch.Tensor] = None) -> MomentumAttentionState:
    """The state after each row's L_b real tokens (right padding) from `initial_state` (None: zero),
    by eq. 12's closed form (`closed_form`): token j has L_b − 1 − j real tokens after it."""
    B, N = fk.shape[0], fk.shape[2]
    if lengths is None:
        lengths = torch.full((B,), N, dtype=torch.long, device=fk.device)
    after = lengths[:, None] - 1 - torch.arange(N, device=fk.device)                # (B, N)
    state = run_state(fk, v, after, after >= 0, rule=rule)
    if initial_state is None:
        return state
    return advance(initial_state, state, lengths, rule=rule)

"""Packed sequences for momentum attention: many sequences in one row, delimited by `cu_seqlens`
(flash-attention's and flash-linear-attention's convention: n + 1 offsets, segment s is tokens
[cu[s], cu[s+1])). Each segment is its own sequence: eq. 12's S, z and m, the denominators and the
momentum's step count restart at every boundary, so a packed row equals its segments run alone.

The chunked form (eq. 13) runs on a chunk-aligned layout: every chunk belongs to one segment
(the last chunk of a segment is partial), as in fla's varlen kernels. The states entering the
chunks come from one scan over all chunks of the row in which the first chunk of a segment
restarts from that segment's initial state — no Python loop over segments, no (n, longest)
padded batch. The layout costs at most C − 1 empty slots per segment."""
from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from .chunk import SCAN_BLOCK, final_state
from .coefficients import ChunkCoefficients, geometric
from .state import MomentumAttentionState


def segment_of_tokens(cu: torch.Tensor, length: int) -> torch.Tensor:
    """(length,) int64: the segment of every token (empty segments own none)."""
    return torch.searchsorted(cu[1:], torch.arange(length, device=cu.device), right=True)


@dataclass
class SegmentChunks:
    """The chunk-aligned layout of a packed row (chunk size C, T chunks):
    token (T, C)  index of the token in each slot (clamped; see valid)
    valid (T, C)  slot holds a token (chunks are filled from their start)
    first (T,)    chunk is the first of its segment (or an unused trailing chunk)
    segment (T,)  segment of each chunk
    slot (N,)     flat slot of every token (the inverse of token)
    last (n,)     each segment's last chunk; count (n,) its tokens there; empty (n,) no tokens."""

    token: torch.Tensor
    valid: torch.Tensor
    first: torch.Tensor
    segment: torch.Tensor
    slot: torch.Tensor
    last: torch.Tensor
    count: torch.Tensor
    empty: torch.Tensor

    @classmethod
    def build(cls, cu: torch.Tensor, length: int, chunk: int,
              cu_host: Optional[torch.Tensor] = None) -> "SegmentChunks":
        """cu_host: the offsets' host copy (`Segments.cu_seqlens_cpu`), which sizes the layout
        exactly without reading the device; without it the size is a static bound."""
        device = cu.device
        n = cu.numel() - 1
        lens = cu[1:] - cu[:-1]
        per_segment = (lens + chunk - 1) // chunk
        ends = per_segment.cumsum(0)
        starts = ends - per_segment
        if cu_host is None or torch.compiler.is_compiling():
            total = -(-length // chunk) + n              # a static bound; trailing chunks stay unused
        else:
            offsets = cu_host.tolist()                   # a host tensor: no device read
            total = max(sum(-(-(b - a) // chunk) for a, b in zip(offsets[:-1], offsets[1:])), 1)
        t = torch.arange(total, device=device)
        segment = torch.searchsorted(ends, t, right=True).clamp(max=n - 1)
        index = t - starts[segment]                      # chunk index within its segment
        used = t < ends[-1]
        offset = index[:, None] * chunk + torch.arange(chunk, device=device)
        valid = (offset < lens[segment][:, None]) & used[:, None]
        token = (cu[segment][:, None] + offset).clamp(0, max(length - 1, 0))
        tok_segment = segment_of_tokens(cu, length)
        position = torch.arange(length, device=device) - cu[tok_segment]
        slot = (starts[tok_segment] + position // chunk) * chunk + position % chunk
        empty = per_segment == 0
        return cls(token=token, valid=valid, first=(index == 0) | ~used, segment=segment, slot=slot,
                   last=(ends - 1).clamp(min=0), count=lens - (per_segment - 1).clamp(min=0) * chunk,
                   empty=empty)


def varlen_causal_momentum_attention(
    fq: torch.Tensor, fk: torch.Tensor, v: torch.Tensor, *, cu_seqlens: torch.Tensor, momentum: float,
    step_size: float, eps: float, chunk_size: int, initial_state: Optional[MomentumAttentionState] = None,
    return_state: bool = False, cu_seqlens_cpu: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, Optional[MomentumAttentionState]]:
    """Eq. 13 per segment on feature-mapped, finite fq, fk (1, H, N, Dk), v (1, H, N, Dv) in the
    compute dtype, N ≥ 1; cu_seqlens checked (int64). initial_state / the returned state have
    batch n (one per segment)."""
    _, H, N, Dk = fq.shape
    Dv = v.shape[-1]
    n = cu_seqlens.numel() - 1
    C = chunk_size
    layout = SegmentChunks.build(cu_seqlens, N, C, cu_seqlens_cpu)
    coef = ChunkCoefficients.build(momentum, step_size, C, fq.dtype, fq.device)
    zero = torch.zeros((), dtype=fq.dtype, device=fq.device)
    valid = layout.valid[None, None, :, :, None]
    Q, K, V = (torch.where(valid, t[:, :, layout.token], zero) for t in (fq, fk, v))   # (1, H, T, C, ·)

    scores = Q @ K.transpose(-1, -2)
    numerator = torch.where(coef.causal, scores * coef.intra, zero) @ V
    intra_den = torch.where(coef.causal, scores, zero).sum(-1, keepdim=True)

    init = initial_state

    def at_chunk(t):                          # a per-segment state, read at every chunk: (1, H, T, ...)
        return None if init is None else t[layout.segment].transpose(0, 1)[None]

    keep = (~layout.first).to(fq.dtype)                                  # 0 where a segment starts
    z_in = _restarting_scan(keep, K.sum(3), at_chunk(init and init.z), layout.first)
    Kt = K.transpose(-1, -2)
    if momentum == 0.0:
        s_in = _restarting_scan(keep, Kt @ V * step_size, at_chunk(init and init.s),
                                layout.first)
        numerator = numerator + Q @ s_in
        m_in = None
    else:
        local_m = (Kt * coef.to_end_m) @ V
        local_s = (Kt * coef.to_end_s) @ V
        m_in = _restarting_scan(keep * coef.decay, local_m, at_chunk(init and -init.m),
                                layout.first)
        s_in = _restarting_scan(keep, local_s + coef.carry[-1] * m_in, at_chunk(init and init.s),
                                layout.first)
        numerator = numerator + Q @ s_in + coef.carry[:, None] * (Q @ m_in)
    denominator = intra_den + (Q * z_in[:, :, :, None]).sum(-1, keepdim=True)
    out = (numerator / (denominator + eps)).reshape(1, H, -1, Dv)[:, :, layout.slot]

    state = None
    if return_state:
        state = _segment_final_states(K, V, s_in, z_in, m_in, layout, momentum, step_size, init, n)
    return out, state


def _segment_final_states(K, V, s_in, z_in, m_in, layout, momentum, step_size, init, n):
    """Each segment's state after its last token: the closed form of eq. 12 over its last chunk
    (`final_state`, one row per segment), started from the state entering that chunk (at β = 0
    no m is carried; the closed form's β⁰ = 1 gives the last token's m alone)."""
    last = layout.last
    per_row = lambda t: t[0][:, last].transpose(0, 1)                    # (n, H, ...)
    m_enter = per_row(m_in) if m_in is not None else torch.zeros_like(per_row(s_in))
    entering = MomentumAttentionState(s=per_row(s_in), z=per_row(z_in), m=-m_enter)
    state = final_state(per_row(K), per_row(V), momentum=momentum, step_size=step_size,
                        initial_state=entering, lengths=layout.count)
    if init is None:
        init = MomentumAttentionState.zeros(n, K.shape[1], K.shape[-1], V.shape[-1], dtype=K.dtype,
                                            device=K.device)
    empty = layout.empty
    pick = lambda a, b: torch.where(empty.view(-1, *([1] * (a.dim() - 1))), b.to(a.dtype), a)
    return MomentumAttentionState(s=pick(state.s, init.s), z=pick(state.z, init.z), m=pick(state.m, init.m))


def _restarting_scan(keep: torch.Tensor, local: torch.Tensor, restart: Optional[torch.Tensor],
                     first: torch.Tensor) -> torch.Tensor:
    """The state entering each chunk (dim 2 of local (1, H, T, ...)):
    y[t] = restart[t] (0 if None) where a segment starts at chunk t, else keep[t]·y[t−1] + local[t−1];
    keep is 0 at starts, β^C (m′) or 1 (s, z) elsewhere."""
    shifted = torch.cat([torch.zeros_like(local[:, :, :1]), local[:, :, :-1]], 2)
    flag = first.view(1, 1, -1, *([1] * (local.dim() - 3)))
    start = torch.zeros((), dtype=local.dtype, device=local.device) if restart is None else restart
    return affine_scan(keep, torch.where(flag, start, shifted))


def affine_scan(a: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """y[t] = a[t]·y[t−1] + u[t] with y[−1] = 0, along dim 2 of u (B, H, T, ...); a (T,). Up to
    SCAN_BLOCK steps run as the recurrence; longer scans run it inside blocks of SCAN_BLOCK and
    recurse on the block totals (O(log T) levels), as `chunk.decayed_exclusive_scan`."""
    B, H, T = u.shape[:3]
    flat = u.reshape(B, H, T, -1)
    if T <= SCAN_BLOCK:
        return _recurrence(a, flat).reshape(u.shape)
    G = SCAN_BLOCK
    ng = -(-T // G)
    pad = ng * G - T
    a_blocks = torch.cat([a, a.new_ones(pad)]).reshape(ng, G)
    u_blocks = torch.cat([flat, flat.new_zeros(B, H, pad, flat.shape[-1])], 2).reshape(B, H, ng, G, -1)
    within = _recurrence(a_blocks.transpose(0, 1), u_blocks.transpose(2, 3)).transpose(2, 3)
    reach = a_blocks.to(torch.float64).cumprod(1).to(u.dtype)               # Π a over the block so far
    ends = affine_scan(reach[:, -1], within[:, :, :, -1])                   # y at the end of each block
    entering = torch.cat([torch.zeros_like(ends[:, :, :1]), ends[:, :, :-1]], 2)
    y = within + reach[None, None, :, :, None] * entering[:, :, :, None]
    return y.reshape(B, H, ng * G, -1)[:, :, :T].reshape(u.shape)


def _recurrence(a: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """y[t] = a[t]·y[t−1] + u[t] along dim 2 of u; a (T, ...) broadcast against u's dims 3.."""
    steps = u.unbind(2)
    ys = [steps[0]]
    for t in range(1, len(steps)):
        coef = a[t].reshape(*a[t].shape, *([1] * (steps[t].dim() - 2 - a[t].dim())))
        ys.append(coef * ys[-1] + steps[t])
    return torch.stack(ys, 2)


def varlen_noncausal_momentum_attention(fq, fk, v, *, cu_seqlens: torch.Tensor, momentum: float,
                                        step_size: float, eps: float, chunk_size: int,
                                        cu_seqlens_cpu: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Eq. 14 per segment on feature-mapped fq, fk (1, H, N, Dk), v (1, H, N, Dv): each query
    attends to the keys of its own segment, with N the segment's length."""
    layout = SegmentChunks.build(cu_seqlens, fq.shape[2], chunk_size, cu_seqlens_cpu)   # for both halves
    kv, z = varlen_noncausal_summary(fk, v, cu_seqlens=cu_seqlens, momentum=momentum, step_size=step_size,
                                     chunk_size=chunk_size, layout=layout)
    return varlen_apply_summary(fq, kv, z, cu_seqlens=cu_seqlens, eps=eps, chunk_size=chunk_size,
                                layout=layout)


def varlen_noncausal_summary(fk, v, *, cu_seqlens: torch.Tensor, momentum: float, step_size: float,
                             chunk_size: int, layout: Optional[SegmentChunks] = None,
                             cu_seqlens_cpu: Optional[torch.Tensor] = None,
                             ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Eq. 14's two sums per segment: kv (n, H, Dk, Dv), z (n, H, Dk), from feature-mapped keys
    fk (1, H, N, Dk) and v (1, H, N, Dv). Built per chunk of the chunk-aligned layout, then
    added per segment (never an (N, Dk, Dv) tensor of outer products)."""
    _, H, N, Dk = fk.shape
    Dv = v.shape[-1]
    n = cu_seqlens.numel() - 1
    layout = SegmentChunks.build(cu_seqlens, N, chunk_size, cu_seqlens_cpu) if layout is None else layout
    after = cu_seqlens[1:][segment_of_tokens(cu_seqlens, N)] - 1 - torch.arange(N, device=fk.device)
    weight = (step_size * geometric(momentum, after + 1)).to(fk.dtype)   # later keys in the segment
    zero = torch.zeros((), dtype=fk.dtype, device=fk.device)
    valid = layout.valid[None, None, :, :, None]
    K, V = (torch.where(valid, t[:, :, layout.token], zero) for t in (fk, v))
    W = torch.where(layout.valid, weight[layout.token], zero)
    kv_chunks = (K.transpose(-1, -2) * W[None, None, :, None, :]) @ V               # (1, H, T, Dk, Dv)
    kv = kv_chunks.new_zeros(1, H, n, Dk, Dv).index_add(2, layout.segment, kv_chunks)
    z = K.new_zeros(1, H, n, Dk).index_add(2, layout.segment, K.sum(3))
    return kv[0].transpose(0, 1), z[0].transpose(0, 1)


def varlen_apply_summary(fq, kv, z, *, cu_seqlens: torch.Tensor, eps: float, chunk_size: int,
                         layout: Optional[SegmentChunks] = None,
                         cu_seqlens_cpu: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Eq. 14's output for packed feature-mapped queries fq (1, H, N, Dk), segment s of them
    against summary row s (kv (n, H, Dk, Dv), z (n, H, Dk))."""
    _, H, N, Dk = fq.shape
    Dv = kv.shape[-1]
    layout = SegmentChunks.build(cu_seqlens, N, chunk_size, cu_seqlens_cpu) if layout is None else layout
    zero = torch.zeros((), dtype=fq.dtype, device=fq.device)
    Q = torch.where(layout.valid[None, None, :, :, None], fq[:, :, layout.token], zero)
    kv_t = kv[layout.segment].transpose(0, 1)[None]                                 # (1, H, T, Dk, Dv)
    z_t = z[layout.segment].transpose(0, 1)[None]
    out = (Q @ kv_t) / ((Q * z_t[:, :, :, None]).sum(-1, keepdim=True) + eps)
    return out.reshape(1, H, -1, Dv)[:, :, layout.slot]

"""Packed sequences for momentum attention: many sequences in one row, delimited by `cu_seqlens`
(flash-attention's and flash-linear-attention's convention: n + 1 offsets, segment s is tokens
[cu[s], cu[s+1])). Each segment is its own sequence: eq. 12's S, z and m, the denominators and the
momentum's step count restart at every boundary, so a packed row equals its segments run alone.

The chunked form (eq. 13) is `chunk.chunk_body` on a chunk-aligned layout: every chunk belongs to
one segment (the last chunk of a segment is partial), as in fla's varlen kernels. The states entering the
chunks come from one scan over all chunks of the row in which the first chunk of a segment
restarts from that segment's initial state — no Python loop over segments, no (n, longest)
padded batch. The layout costs at most C − 1 empty slots per segment."""
from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from ..exported_eps import plus_eps
from .chunk import Entering, chunk_body, last_chunk_states
from .rule import MomentumRule
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
    fq: torch.Tensor, fk: torch.Tensor, v: torch.Tensor, *, cu_seqlens: torch.Tensor, rule: MomentumRule,
    eps: float, chunk_size: int, initial_state: Optional[MomentumAttentionState] = None,
    return_state: bool = False, cu_seqlens_cpu: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, Optional[MomentumAttentionState]]:
    """Causal attention of `rule` (eq. 13) per segment on feature-mapped, finite fq, fk (1, H, N, Dk),
    v (1, H, N, Dv) in the compute dtype, N ≥ 1; cu_seqlens checked (int64). initial_state / the
    returned state have batch n (one per segment)."""
    H, N = fq.shape[1], fq.shape[2]
    n = cu_seqlens.numel() - 1
    layout = SegmentChunks.build(cu_seqlens, N, chunk_size, cu_seqlens_cpu)
    zero = torch.zeros((), dtype=fq.dtype, device=fq.device)
    valid = layout.valid[None, None, :, :, None]
    Q, K, V = (torch.where(valid, t[:, :, layout.token], zero) for t in (fq, fk, v))   # (1, H, T, C, ·)
    init = initial_state
    restart = None
    if init is not None:                      # a per-segment state, read at every chunk: (1, H, T, ...)
        at_chunk = lambda t: t[layout.segment].transpose(0, 1)[None]
        restart = Entering(at_chunk(init.s), at_chunk(init.z), at_chunk(-init.m))
    out, enter = chunk_body(Q, K, V, rule=rule, eps=eps, first=layout.first, restart=restart,
                            carry_m=rule.carries_momentum or return_state)
    out = out.reshape(1, H, -1, v.shape[-1])[:, :, layout.slot]
    if not return_state:
        return out, None
    last = layout.last
    state = last_chunk_states(K, V, enter, torch.zeros_like(last), last, layout.count, rule=rule)
    if init is None:                          # a segment of no tokens has no chunk: it keeps init
        init = MomentumAttentionState.zeros(n, H, K.shape[-1], V.shape[-1], dtype=K.dtype, device=K.device)
    keep = lambda a, b: torch.where(layout.empty.view(-1, *([1] * (a.dim() - 1))), b.to(a.dtype), a)
    return out, MomentumAttentionState(s=keep(state.s, init.s), z=keep(state.z, init.z),
                                       m=keep(state.m, init.m))


def varlen_noncausal_momentum_attention(fq, fk, v, *, cu_seqlens: torch.Tensor, rule: MomentumRule,
                                        eps: float, chunk_size: int,
                                        cu_seqlens_cpu: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Eq. 14 per segment on feature-mapped fq, fk (1, H, N, Dk), v (1, H, N, Dv): each query
    attends to the keys of its own segment, with N the segment's length."""
    layout = SegmentChunks.build(cu_seqlens, fq.shape[2], chunk_size, cu_seqlens_cpu)   # for both halves
    kv, z = varlen_noncausal_summary(fk, v, cu_seqlens=cu_seqlens, rule=rule, chunk_size=chunk_size,
                                     layout=layout)
    return varlen_apply_summary(fq, kv, z, cu_seqlens=cu_seqlens, eps=eps, chunk_size=chunk_size,
                                layout=layout)


def varlen_noncausal_summary(fk, v, *, cu_seqlens: torch.Tensor, rule: MomentumRule, chunk_size: int,
                             layout: Optional[SegmentChunks] = None,
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
    weight = rule.input_on_s(after).to(fk.dtype)                         # later keys in the segment
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
    out = (Q @ kv_t) / plus_eps((Q * z_t[:, :, :, None]).sum(-1, keepdim=True), eps)
    return out.reshape(1, H, -1, Dv)[:, :, layout.slot]

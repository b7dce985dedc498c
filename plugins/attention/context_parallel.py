"""Context parallelism: one sequence split over the ranks of a process group, exchanging only
the per-(batch, head) states of Momentum Transformer eq. 12, never keys or values.

Rank r holds tokens [o_r, o_r + N_r) of the whole sequence, in rank order (any N_r ≥ 0).
Eq. 12 is linear in the state it starts from, so after a slice with L real tokens the state is
an affine map of the state entering the slice (m' = −m):
    m'_L = β^L m'_0 + M,   s_L = s_0 + γβ(1−β^L)/(1−β) m'_0 + S,   z_L = z_0 + Z,
where (S, Z, M) is the slice's state from a zero start (eq. 12's closed form, `closed_form`). Each
rank computes its (S, Z, M), all-gathers them with L, composes the earlier ranks' maps into the
state entering its slice and runs the ordinary causal attention from there
(`initial_state=`); the gradients of the entering state reach the earlier ranks through the
all-gather's backward (an all-reduce). Eq. 14 (causal=False) is one all-reduce of the
key-value sums, each rank weighting its keys by the real keys of the later ranks.

Packed sequences (`cu_seqlens`, the global offsets over all ranks' tokens, the same on every
rank): a segment restarts from zero, so only the segment open at a slice's end carries state
to the next rank; each rank contributes the map of its slice's last segment (the tokens after
its last boundary), and the composition restarts at a rank that holds a boundary.
"""
from typing import Optional, Tuple

import torch
import torch.distributed as dist

from ..packing import Segments
from ..validation import check_group
from .attend import attend, mask_keys
from .checks import check_feature_dims, check_padding_mask, check_qkv, compute_dtype
from .closed_form import advance, run_state
from .cp_agreement import Agreement, agree
from .feature_maps import FeatureMap
from .noncausal import apply_noncausal_summary, real_after
from .nonfinite import split_finite
from .spec import AttentionSpec
from .state import MomentumAttentionState


def context_parallel_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec, *,
                               process_group, segments: Optional[Segments] = None,
                               initial_state: Optional[MomentumAttentionState] = None,
                               return_state: bool = False):
    """`attend` over the ranks of `process_group`, on this rank's slice q, k (B, H, N_r, Dk), v
    (B, H, N_r, Dv): the whole sequence's result on the slice, forward and backward. spec and
    segments are already checked (`check_call` for the public arguments); segments describes the
    slice's padding, or, when packed, the documents of the whole row (every rank's tokens
    concatenated, batch 1; causal only, without initial_state / return_state, whose per-document
    states are not split over ranks). The ranks agree on the call first (`cp_agreement`), once.
    Every rank of the group must call this with the same arguments except the slices, and, when
    training, must back-propagate through its output (the backward exchanges the state
    gradients). initial_state is the state before the whole sequence: rank 0 only. With
    return_state, each rank gets the state after its own slice (the last rank's is the state after
    the whole sequence)."""
    group = process_group
    rank = dist.get_rank(group)
    ranks = agree(q, k, v, spec, group, segments=segments, initial_state=initial_state)
    if segments is not None and segments.packed:
        return _packed(q, k, v, spec, segments, ranks, rank, group)
    mask = None if segments is None else segments.padding_mask
    lengths = _all_lengths(ranks, segments, k, group)
    state_dtype = torch.float64 if ranks.float64 else compute_dtype(q, k, v)
    if not spec.causal:
        return _noncausal_over_ranks(q, k, v, spec, mask, lengths, rank, group, dtype=state_dtype)

    with torch.autocast(device_type=q.device.type, enabled=False):
        fk, vv = _feature_keys(spec.phi, k, v, mask, state_dtype)
        after = real_after(mask, fk.shape[0], fk.shape[2], fk.device)
        local = run_state(fk, vv, after, mask, rule=spec.momentum_rule)
        if initial_state is not None:
            local = advance(initial_state.to(state_dtype), local, lengths[rank],
                            rule=spec.momentum_rule)
        gathered = _AllGather.apply(group, _pack(local))
        states = [_unpack(g, fk.shape[-1], v.shape[-1]) for g in gathered.unbind(0)]
        entering = initial_state
        if rank > 0:
            entering = states[0]
            for i in range(1, rank):
                entering = advance(entering, states[i], lengths[i], rule=spec.momentum_rule)
    result = attend(q, k, v, spec, segments=segments, initial_state=entering, return_state=return_state)
    if return_state:
        out, state = result
        return _Attach.apply(out, gathered), state
    return _Attach.apply(result, gathered)


def check_call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, momentum: float, step_size: float,
               causal: bool, feature_map: FeatureMap, eps: float, chunk_size: int, backend: str,
               padding_mask: Optional[torch.Tensor], cu_seqlens: Optional[torch.Tensor],
               initial_state: Optional[MomentumAttentionState], return_state: bool, rule: str = "momentum"
               ) -> Tuple[AttentionSpec, Optional[Segments]]:
    """This rank's checks of `momentum_attention(..., process_group=)`'s arguments (before the
    ranks agree): its spec, and its Segments (the slice's padding, or the whole row's documents
    for cu_seqlens, the global offsets)."""
    check_qkv(q, k, v, causal=causal)
    spec = AttentionSpec(momentum=momentum, step_size=step_size, causal=causal, feature_map=feature_map,
                         eps=eps, chunk_size=chunk_size, backend=backend, rule=rule)
    mask = check_padding_mask(padding_mask, k.shape[0], k.shape[2], k.device)
    if initial_state is not None and not isinstance(initial_state, MomentumAttentionState):
        raise ValueError(f"initial_state must be a MomentumAttentionState or None, "
                         f"got {type(initial_state).__name__}")
    if not causal and (initial_state is not None or return_state):
        raise ValueError("initial_state and return_state need causal=True (eq. 14 has no recurrent form)")
    if initial_state is not None:
        phi = spec.phi
        with torch.no_grad():
            D = check_feature_dims(phi(k[:, :, :1]), phi(k[:, :, :1]), k[:, :, :1], k[:, :, :1])
        initial_state.check(k.shape[0], k.shape[1], D, v.shape[-1])
        if initial_state.s.device != k.device:
            raise ValueError(f"initial_state is on {initial_state.s.device} but the inputs are on {k.device}")
    if cu_seqlens is not None:
        return spec, _whole_row(cu_seqlens, k, mask, causal, initial_state, return_state)
    if mask is None:
        return spec, None
    return spec, Segments.from_padding_mask(mask, k.shape[0], k.shape[2])


def shard_sequence(x: torch.Tensor, process_group, dim: int = 1) -> Tuple[torch.Tensor, int]:
    """This rank's contiguous slice of x along `dim` (e.g. input_ids (B, T) with dim=1) and its
    global offset, the index of its first position in the whole sequence (position_ids of the
    slice are offset + arange(len)). Slices in rank order, as even as possible: the first T mod R
    ranks get one token more. A view of x, no copy."""
    group = check_group(process_group)
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if isinstance(dim, bool) or not isinstance(dim, int) or not -x.dim() <= dim < x.dim():
        raise ValueError(f"dim must be an int in [{-x.dim()}, {x.dim()}) for x of shape {tuple(x.shape)}, "
                         f"got {dim!r}")
    start, stop = slice_bounds(x.shape[dim], dist.get_world_size(group), dist.get_rank(group))
    return x.narrow(dim, start, stop - start), start


def slice_bounds(length: int, world: int, rank: int) -> Tuple[int, int]:
    """[start, stop) of rank `rank`'s slice when `length` positions are split over `world` ranks
    (`shard_sequence`'s split)."""
    base, extra = divmod(length, world)
    start = rank * base + min(rank, extra)
    return start, start + base + (rank < extra)


class _AllGather(torch.autograd.Function):
    """All-gather (world, *x.shape) whose backward sums each rank's gradient over the ranks
    (an all-reduce, which gloo and NCCL both have) and keeps this rank's part."""

    @staticmethod
    def forward(ctx, group, x):
        ctx.group = group
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.stack(parts)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return None, grad[dist.get_rank(ctx.group)]


class _AllReduce(torch.autograd.Function):
    """Sum over the ranks; the gradient of each rank's part is the sum of every rank's gradient."""

    @staticmethod
    def forward(ctx, group, x):
        ctx.group = group
        x = x.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(grad, group=ctx.group)
        return None, grad


class _Attach(torch.autograd.Function):
    """Returns `out` unchanged and puts `exchanged` into its graph with a zero gradient, so that
    every rank's backward reaches the collective's backward (rank 0's output does not depend on
    the gathered states, yet its slice's state gradient comes back through that collective)."""

    @staticmethod
    def forward(ctx, out, exchanged):
        ctx.save_for_backward(exchanged)
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad):
        (exchanged,) = ctx.saved_tensors
        return grad, torch.zeros_like(exchanged)


def _whole_row(cu_seqlens, k, mask, causal, initial_state, return_state) -> Segments:
    """The documents of the whole row from the global cu_seqlens (its end is checked against the
    total length once every rank's length is known)."""
    claimed = -1
    if isinstance(cu_seqlens, torch.Tensor) and cu_seqlens.dim() == 1 and cu_seqlens.numel() > 0:
        claimed = int(cu_seqlens[-1])
    segments = Segments.from_cu_seqlens(cu_seqlens, claimed, device=k.device, batch=k.shape[0])
    if mask is not None:
        raise ValueError("padding_mask marks padded tokens, but with cu_seqlens every token belongs to a "
                         "sequence: drop the padding from the packed row, or pass padding_mask=None")
    if not causal:
        raise ValueError("causal=False with cu_seqlens and process_group is not supported: eq. 14 per "
                         "segment needs every rank's keys of the segments crossing it")
    if initial_state is not None or return_state:
        raise ValueError("initial_state and return_state with cu_seqlens and process_group are not "
                         "supported: their states are per segment and segments cross ranks; run the "
                         "prefill without process_group to get them")
    return segments


def _all_lengths(ranks: Agreement, segments: Optional[Segments], k: torch.Tensor, group) -> torch.Tensor:
    """(world, B) real keys per rank and row: from the agreement, or all-gathered when any rank
    has a padding mask."""
    world, B = len(ranks.key_lengths), k.shape[0]
    if not ranks.masked:
        return torch.tensor(ranks.key_lengths, device=k.device)[:, None].expand(world, B)
    if segments is not None and segments.padding_mask is not None:
        mine = segments.lengths.to(torch.long)
    else:
        mine = torch.full((B,), k.shape[2], dtype=torch.long, device=k.device)
    parts = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(parts, mine, group=group)
    return torch.stack(parts)


def _feature_keys(phi, k, v, mask, dtype):
    k, v = mask_keys(k.to(dtype), mask), mask_keys(v.to(dtype), mask)
    fk = mask_keys(phi(k), mask)
    check_feature_dims(fk, fk, k, k)
    return fk, v


def _pack(state: MomentumAttentionState) -> torch.Tensor:
    """(B, H, 2·D′·Dv + D′): s, m and z of every (batch, head) in one tensor, one collective."""
    return torch.cat([state.s.flatten(2), state.m.flatten(2), state.z], dim=-1)


def _unpack(packed: torch.Tensor, dk: int, dv: int) -> MomentumAttentionState:
    B, H, n = packed.shape[0], packed.shape[1], dk * dv
    return MomentumAttentionState(s=packed[..., :n].reshape(B, H, dk, dv),
                                  m=packed[..., n:2 * n].reshape(B, H, dk, dv), z=packed[..., 2 * n:])


def _packed(q, k, v, spec: AttentionSpec, segments: Segments, ranks: Agreement, rank: int, group):
    """Causal attention on packed sequences whose segments may cross ranks. Rank i's slice is
    [o_i, o_i + N_i) of the row; its last boundary b_i in (o_i, o_i + N_i], if any, restarts the
    state. It contributes the zero-start state of its tokens [b_i, o_i + N_i) (all its tokens when
    it holds no boundary); the state entering rank r's first segment composes the contributions
    of ranks < r from the last one that holds a boundary (eq. 12 restarts at a segment start)."""
    starts = [0]
    for length in ranks.key_lengths:
        starts.append(starts[-1] + length)
    total = starts[-1]
    boundaries = segments.cu_seqlens_cpu.tolist()
    if boundaries[-1] != total:
        raise ValueError(f"cu_seqlens with process_group holds the offsets over the whole row (every rank's "
                         f"tokens concatenated, {total} tokens), but it ends at {boundaries[-1]}")
    tails, restarts = [], []
    for lo, hi in zip(starts[:-1], starts[1:]):
        inside = [b for b in boundaries if lo < b <= hi]
        tails.append((inside[-1] if inside else lo) - lo)
        restarts.append(bool(inside))
    lo, hi = starts[rank], starts[rank + 1]
    with torch.autocast(device_type=q.device.type, enabled=False):
        fk, vv = _feature_keys(spec.phi, k, v, None, compute_dtype(q, k, v))
        tail = tails[rank]
        after = real_after(None, fk.shape[0], fk.shape[2] - tail, fk.device)
        local = run_state(fk[:, :, tail:], vv[:, :, tail:], after, None, rule=spec.momentum_rule)
        gathered = _AllGather.apply(group, _pack(local))
        states = [_unpack(g, fk.shape[-1], v.shape[-1]) for g in gathered.unbind(0)]
        entering = None
        for i in range(rank):
            length = torch.full((1,), starts[i + 1] - starts[i] - tails[i], device=k.device)
            if entering is None or restarts[i]:
                entering = states[i]
            else:
                entering = advance(entering, states[i], length, rule=spec.momentum_rule)
        inner = [b - lo for b in boundaries if lo < b < hi]
        local_cu = torch.tensor([0] + inner + [hi - lo], dtype=torch.long)
        documents = Segments.from_cu_seqlens(local_cu.to(k.device), hi - lo, cu_seqlens_cpu=local_cu)
        if entering is not None:
            rest = MomentumAttentionState.zeros(len(inner), *entering.s.shape[1:3], entering.s.shape[3],
                                                dtype=entering.s.dtype, device=k.device)
            entering = MomentumAttentionState(*(torch.cat([a, b]) for a, b in (
                (entering.s, rest.s), (entering.z, rest.z), (entering.m, rest.m))))
    out = attend(q, k, v, spec, segments=documents, initial_state=entering)
    return _Attach.apply(out, gathered)


def _noncausal_over_ranks(q, k, v, spec: AttentionSpec, mask, lengths, rank, group, *, dtype):
    """Eq. 14 over the ranks: key j's weight γ(1−β^(a_j+1))/(1−β) (`rule.input_on_s(a_j)`) counts the
    real keys a_j after it in the whole sequence (after it in this slice plus those of the later
    ranks); the two sums are all-reduced and each rank applies them to its own queries."""
    later = lengths[rank + 1:].sum(0)                                              # (B,)
    with torch.autocast(device_type=q.device.type, enabled=False):
        phi = spec.phi
        fk, vv = _feature_keys(phi, k, v, mask, dtype)
        B = fk.shape[0]
        after = real_after(mask, B, fk.shape[2], fk.device).clamp(min=0) + later[:, None]
        weight = spec.momentum_rule.input_on_s(after)
        if mask is not None:
            weight = weight * mask
        kv = torch.einsum("bhnd,bn,bhne->bhde", fk, weight.to(dtype), vv)
        summed = _AllReduce.apply(group, torch.cat([kv.flatten(2), fk.sum(2)], dim=-1))
        D, Dv = fk.shape[-1], vv.shape[-1]
        kv, z = summed[..., :D * Dv].reshape(B, fk.shape[1], D, Dv), summed[..., D * Dv:]
        # φ and the matmuls see finite queries only: a NaN/inf query (padded or not) marks its own
        # output and reaches no gradient (0 × NaN in the backward of fq @ kv would reach every key).
        q, q_marks = split_finite(q.to(dtype))
        fq, fq_marks = split_finite(phi(q))
        marks = q_marks.sum(-1, keepdim=True) + fq_marks.sum(-1, keepdim=True)
        out = apply_noncausal_summary(fq, kv, z, eps=spec.eps) + marks
    out_dtype = torch.promote_types(torch.promote_types(q.dtype, k.dtype), v.dtype)
    return out.to(out_dtype)

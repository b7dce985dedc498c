"""Public entry points of momentum attention (Momentum Transformer, Section 3.1; docs/equations.md)."""
from typing import Optional, Tuple, Union

import torch

from ..packing import Segments
from ..validation import check_bool, check_group, check_momentum, check_offsets, check_positive
from .attend import attend, attend_step, mask_keys
from .checks import (
    check_chunk_size,
    check_feature_dims,
    check_padding_mask,
    check_qkv,
    compute_dtype,
)
from .context_parallel import check_call, context_parallel_attention
from .cp_agreement import report_invalid
from .feature_maps import FeatureMap, resolve_feature_map
from .noncausal import apply_noncausal_summary, noncausal_summary
from .nonfinite import all_finite, split_finite
from .rule import momentum_rule
from .spec import AttentionSpec
from .state import MomentumAttentionState, NonCausalSummary
from .varlen import varlen_apply_summary, varlen_noncausal_summary

Output = Union[torch.Tensor, Tuple[torch.Tensor, MomentumAttentionState]]


def momentum_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, momentum: float,
                       step_size: float = 1.0, causal: bool = True, feature_map: FeatureMap = "elu",
                       padding_mask: Optional[torch.Tensor] = None, eps: float = 1e-6,
                       chunk_size: int = 64, initial_state: Optional[MomentumAttentionState] = None,
                       return_state: bool = False, backend: str = "auto",
                       cu_seqlens: Optional[torch.Tensor] = None, process_group=None) -> Output:
    """Momentum attention, O(N) time and memory.

    q, k: (B, H, Nq, Dk); v: (B, H, Nk, Dv) → (B, H, Nq, Dv) in the inputs' dtype.
    causal=True is eq. 13 exactly (≡ the recurrence eq. 12): key j gets weight
    γ(1−β^(i−j+1))/(1−β) at query i, denominator φ(q_i)ᵀΣ_{j≤i}φ(k_j) + eps; Nq must equal Nk.
    causal=False is eq. 14 with N each sequence's number of real keys (Nq may differ from Nk).
    momentum β ∈ [0, 1), step_size γ > 0; β = 0, γ = 1 is plain linear attention (eq. 7).
    feature_map: "elu" (elu+1, the paper's), "relu", "identity" (inputs already mapped) or a
    callable, applied to q and k here; a callable may change the last dimension (Dk → D′, the
    states' key dimension). padding_mask: (B, Nk) bool, True = real token, any pattern:
    padded keys are removed from every sum and from the momentum's step count, so each row
    equals its sequence alone. Causal outputs at padded positions are 0; non-causal queries at
    padded positions still attend to the real keys.
    initial_state / return_state (causal only): continue from a `MomentumAttentionState` and/or
    return the state after each row's last real token, to prefill in parallel and decode with
    `momentum_attention_step`.
    cu_seqlens: packed sequences (flash-attention's / fla's convention): a 1-D int tensor of n + 1
    offsets over one row (batch 1), cu[0] = 0, non-decreasing, cu[-1] = N; segment s is tokens
    [cu[s], cu[s+1]) and is computed exactly as if it ran alone (causal and eq. 14). Its
    initial_state and returned state have batch n, one per segment. padding_mask, if given, must
    mark every token real.
    backend (causal only; eq. 14 is two batched matmuls and always runs in PyTorch): "torch" the
    chunked PyTorch form; "triton" the fused kernels of `plugins.attention.triton` (CUDA tensors,
    or CPU tensors under TRITON_INTERPRET=1); "auto" Triton for CUDA tensors when available,
    PyTorch otherwise (and always for float64).
    A NaN or inf in q, k or v reaches only the outputs that depend on it (causal: at or after
    its position), forward and backward. States and denominators are accumulated in float32
    (float64 for float64 inputs), autocast or not.
    process_group (torch.distributed): context parallelism, one sequence split over the group's
    ranks in rank order, each passing its slice (`plugins.attention.context_parallel`,
    docs/context_parallel.md); the result on each rank is the whole sequence's on its slice.
    """
    causal = check_bool(causal, "causal")
    return_state = check_bool(return_state, "return_state")
    if process_group is not None:
        group = check_group(process_group)
        try:
            spec, segments = check_call(q, k, v, momentum=momentum, step_size=step_size, causal=causal,
                                        feature_map=feature_map, eps=eps, chunk_size=chunk_size,
                                        backend=backend, padding_mask=padding_mask, cu_seqlens=cu_seqlens,
                                        initial_state=initial_state, return_state=return_state)
        except ValueError:
            report_invalid(group)       # the other ranks raise too instead of waiting for this one
            raise
        return context_parallel_attention(q, k, v, spec, process_group=group, segments=segments,
                                          initial_state=initial_state, return_state=return_state)
    check_qkv(q, k, v, causal=causal)
    spec = AttentionSpec(momentum=momentum, step_size=step_size, causal=causal, feature_map=feature_map,
                         eps=eps, chunk_size=chunk_size, backend=backend)
    segments = _segments(padding_mask, cu_seqlens, q, k)
    _check_state_type(initial_state, "initial_state")
    if not causal and (initial_state is not None or return_state):
        raise ValueError("initial_state and return_state need causal=True (eq. 14 has no recurrent form)")
    return attend(q, k, v, spec, segments=segments, initial_state=initial_state, return_state=return_state,
                  finite=_finite(q, k, v))


def summarize_keys(k: torch.Tensor, v: torch.Tensor, *, momentum: float, step_size: float = 1.0,
                   feature_map: FeatureMap = "elu", padding_mask: Optional[torch.Tensor] = None,
                   cu_seqlens: Optional[torch.Tensor] = None, chunk_size: int = 64) -> NonCausalSummary:
    """The key/value sums of eq. 14 for k (B, H, Nk, Dk), v (B, H, Nk, Dv), padding_mask (B, Nk)
    True = real key: computed once, e.g. over an encoder's output, then applied to any number of
    queries with `attend_summary` — `attend_summary(q, summarize_keys(k, v, …))` equals
    `momentum_attention(q, k, v, causal=False, …)`. Sums in float32 (float64 for float64 input).
    cu_seqlens (packed keys of n sequences in one row, as in `momentum_attention`): one summary
    row per sequence (batch n)."""
    check_qkv(k[:, :, :0], k, v, causal=False)
    momentum = check_momentum(momentum)
    step_size = check_positive(step_size, "step_size")
    chunk_size = check_chunk_size(chunk_size)
    phi = resolve_feature_map(feature_map)
    mask = check_padding_mask(padding_mask, k.shape[0], k.shape[2], k.device)
    cu = None
    if cu_seqlens is not None:
        cu = check_offsets(cu_seqlens, k.shape[2], device=k.device, batch=k.shape[0])
        _check_packed_padding(padding_mask, mask)
    dtype = compute_dtype(k, v)
    with torch.autocast(device_type=k.device.type, enabled=False):
        k, v = k.to(dtype), v.to(dtype)
        fk, v = mask_keys(phi(mask_keys(k, mask)), mask), mask_keys(v, mask)
        check_feature_dims(fk, fk, k, k)
        if cu is not None:
            kv, z = varlen_noncausal_summary(fk, v, cu_seqlens=cu, rule=momentum_rule(momentum, step_size),
                                             chunk_size=chunk_size)
        else:
            kv, z = noncausal_summary(fk, v, momentum=momentum, step_size=step_size, key_mask=mask)
    return NonCausalSummary(kv=kv, z=z)


def attend_summary(q: torch.Tensor, summary: NonCausalSummary, *, feature_map: FeatureMap = "elu",
                   eps: float = 1e-6, cu_seqlens: Optional[torch.Tensor] = None,
                   chunk_size: int = 64) -> torch.Tensor:
    """Eq. 14 for queries q (B, H, Nq, Dk) against keys summarised by `summarize_keys`;
    output (B, H, Nq, Dv) in q's dtype. O(Nq) whatever the number of keys. A non-finite query
    makes its own output NaN and nothing else (not the summary's gradients either).
    cu_seqlens: packed queries of n sequences in one row (batch 1); sequence s reads summary row s
    (a summary of batch n, e.g. from packed keys)."""
    if not isinstance(summary, NonCausalSummary):
        raise ValueError(f"summary must be a NonCausalSummary, got {type(summary).__name__}")
    if not isinstance(q, torch.Tensor) or q.dim() != 4 or not q.is_floating_point():
        raise ValueError("q must be a floating-point tensor of shape (batch, heads, length, dim)")
    eps = check_positive(eps, "eps")
    chunk_size = check_chunk_size(chunk_size)
    phi = resolve_feature_map(feature_map)
    cu = None
    if cu_seqlens is not None:
        cu = check_offsets(cu_seqlens, q.shape[2], device=q.device, batch=q.shape[0])
        if summary.kv.shape[0] != cu.numel() - 1:
            raise ValueError(f"with cu_seqlens the summary needs one row per packed sequence: batch "
                             f"{cu.numel() - 1} (len(cu_seqlens) - 1), got {summary.kv.shape[0]}")
    with torch.autocast(device_type=q.device.type, enabled=False):
        fq = phi(q.to(summary.kv.dtype))
        rows = fq.shape[:1] if cu is None else summary.kv.shape[:1]
        if rows + fq.shape[1:2] != summary.kv.shape[:2] or fq.shape[3] != summary.kv.shape[2]:
            raise ValueError(f"q {tuple(q.shape)} (feature-mapped {tuple(fq.shape)}) does not match the "
                             f"summary's (batch, heads, D′) = {tuple(summary.kv.shape[:3])}")
        fq, marks = split_finite(fq)
        if cu is not None:
            out = varlen_apply_summary(fq, summary.kv, summary.z, cu_seqlens=cu, eps=eps,
                                       chunk_size=chunk_size)
        else:
            out = apply_noncausal_summary(fq, summary.kv, summary.z, eps=eps)
        out = out + marks.sum(-1, keepdim=True)
    return out.to(q.dtype)


def linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = True,
                     feature_map: FeatureMap = "elu", padding_mask: Optional[torch.Tensor] = None,
                     eps: float = 1e-6, chunk_size: int = 64, backend: str = "auto",
                     cu_seqlens: Optional[torch.Tensor] = None, process_group=None) -> torch.Tensor:
    """Plain linear attention (eq. 5, causal eq. 7): momentum attention with β = 0, γ = 1 (the
    kernels then carry the one state s). cu_seqlens and process_group as in `momentum_attention`."""
    return momentum_attention(q, k, v, momentum=0.0, step_size=1.0, causal=causal,
                              feature_map=feature_map, padding_mask=padding_mask, eps=eps,
                              chunk_size=chunk_size, backend=backend, cu_seqlens=cu_seqlens,
                              process_group=process_group)


def momentum_attention_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            state: Optional[MomentumAttentionState], *, momentum: float,
                            step_size: float = 1.0, feature_map: FeatureMap = "elu",
                            eps: float = 1e-6, padding_mask: Optional[torch.Tensor] = None,
                            chunk_size: int = 64, backend: str = "auto",
                            cu_seqlens: Optional[torch.Tensor] = None,
                            ) -> Tuple[torch.Tensor, MomentumAttentionState]:
    """Recurrent form eq. 12 for decoding: q, k (B, H, n, Dk), v (B, H, n, Dv) are n ≥ 1 new
    positions; state is a `MomentumAttentionState` (a plain (s, z, m) tuple is refused: build
    `MomentumAttentionState(s=…, z=…, m=…)`, which names its parts) or None to start fresh.
    Returns (out (B, H, n, Dv), new_state). One position runs the fused single-token update;
    several run the chunked form from `state`. backend as in `momentum_attention`.
    cu_seqlens: the new positions of n packed sequences in one row (batch 1), as in
    `momentum_attention`; the state then has batch n (e.g. continuing a packed prefill)."""
    check_qkv(q, k, v, causal=True)
    _check_state_type(state, "state")
    if q.shape[2] != 1 or cu_seqlens is not None:
        return momentum_attention(q, k, v, momentum=momentum, step_size=step_size, causal=True,
                                  feature_map=feature_map, padding_mask=padding_mask, eps=eps,
                                  chunk_size=chunk_size, initial_state=state, return_state=True,
                                  backend=backend, cu_seqlens=cu_seqlens)
    spec = AttentionSpec(momentum=momentum, step_size=step_size, feature_map=feature_map, eps=eps,
                         chunk_size=chunk_size, backend=backend)
    segments = None
    if padding_mask is not None:
        check_padding_mask(padding_mask, q.shape[0], 1, k.device)
        segments = Segments.from_padding_mask(padding_mask, q.shape[0], 1)
    return attend_step(q, k, v, state, spec, segments=segments, finite=_finite(q, k, v))


def _finite(q, k, v) -> bool:
    """The public functions' eager shortcut (one host read): finite inputs need no NaN marks."""
    return not torch.compiler.is_compiling() and all_finite(q, k, v)


def _segments(padding_mask, cu_seqlens, q, k) -> Optional[Segments]:
    """The public arguments' batch description, validated once."""
    if cu_seqlens is None:
        if padding_mask is None:
            return None
        check_padding_mask(padding_mask, k.shape[0], k.shape[2], k.device)
        return Segments.from_padding_mask(padding_mask, k.shape[0], k.shape[2])
    segments = Segments.from_cu_seqlens(cu_seqlens, k.shape[2], device=k.device, batch=k.shape[0])
    mask = check_padding_mask(padding_mask, k.shape[0], k.shape[2], k.device)
    _check_packed_padding(padding_mask, mask)
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"cu_seqlens splits queries and keys alike: q and k must have the same "
                         f"length, got {q.shape[2]} and {k.shape[2]}")
    return segments


def _check_state_type(state, name: str) -> None:
    if state is not None and not isinstance(state, MomentumAttentionState):
        raise ValueError(f"{name} must be a MomentumAttentionState or None, got {type(state).__name__}; "
                         "wrap the tensors as MomentumAttentionState(s=..., z=..., m=...) (eq. 12's S, z, m)")


def _check_packed_padding(padding_mask, mask) -> None:
    """cu_seqlens already says where every sequence is: a padding mask may only agree (all real)."""
    if padding_mask is not None and (mask is not None or torch.compiler.is_compiling()):
        raise ValueError("padding_mask marks padded tokens, but with cu_seqlens every token belongs to a "
                         "sequence: drop the padding tokens from the packed row (or pass padding_mask=None)")

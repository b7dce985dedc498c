"""The trusted path of momentum attention (Momentum Transformer, Section 3.1): `attend` and
`attend_step` take an already validated `AttentionSpec` and `plugins.packing.Segments` and check
nothing more than what protects memory (shapes). They read no device value to the host (no
bool()/int()/.item()/nonzero of a device tensor), so the CPU runs ahead of the GPU and
torch.compile sees no data-dependent branch; the public functions of `api` validate and call them.
The path is chosen once per call by `plan.plan`; the functions here execute it."""
from typing import Optional

import torch

from ..packing import Segments
from .checks import as_dtype
from .chunk import chunk_causal_momentum_attention
from .noncausal import apply_noncausal_summary, noncausal_summary
from .nonfinite import FINITE_MAPS, NonFiniteMarks
from .plan import Plan, plan
from .recurrent import fused_recurrent_step
from .spec import AttentionSpec
from .state import MomentumAttentionState
from .varlen import segment_of_tokens, varlen_causal_momentum_attention, varlen_noncausal_momentum_attention


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec, *,
           segments: Optional[Segments] = None, initial_state: Optional[MomentumAttentionState] = None,
           return_state: bool = False, finite: bool = False):
    """Momentum attention on q, k (B, H, Nq|Nk, Dk), v (B, H, Nk, Dv) laid out as `segments` says
    (None: every token real). Packed segments run each document alone and take and return one
    state row per document; padded inputs of packed segments (`segments.index`) are packed here and
    the output unpacked (zeros at padding). Returns out, or (out, state) with return_state.
    finite: the caller has checked that q, k, v hold no NaN/inf (`nonfinite.all_finite`, a host
    read that `attend` itself never makes); otherwise NaN/inf is kept causal by marks. Context
    parallelism (`context_parallel.context_parallel_attention`) wraps this function."""
    return execute(plan(spec, q, k, v, segments=segments, state=initial_state), q, k, v, spec,
                   segments=segments, initial_state=initial_state, return_state=return_state, finite=finite)


def attend_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: Optional[MomentumAttentionState],
                spec: AttentionSpec, *, segments: Optional[Segments] = None, finite: bool = False):
    """Eq. 12 for n ≥ 1 new positions q, k (B, H, n, Dk), v (B, H, n, Dv) from `state` (None: a zero
    start). Returns (out (B, H, n, Dv), new state). One position of unpacked rows runs the fused
    single-token update (rows whose position is padding keep their state and output 0)."""
    chosen = plan(spec, q, k, v, segments=segments, state=state, step=True)
    if chosen.path not in ("step", "triton_step"):
        return execute(chosen, q, k, v, spec, segments=segments, initial_state=state, return_state=True,
                       finite=finite)
    real = None if segments is None else segments.padding_mask
    B, H, Dv = q.shape[0], q.shape[1], v.shape[-1]
    dtype = chosen.state_dtype
    step = fused_recurrent_step if chosen.kernels is None else chosen.kernels.fused_recurrent_step
    out_dtype = torch.promote_types(torch.promote_types(q.dtype, k.dtype), v.dtype)
    if (chosen.path == "triton_step" and spec.phi in FINITE_MAPS and not torch.compiler.is_compiling()
            and not _needs_grad(q, k, v, state)):
        return _marked_step(chosen, q, k, v, state, spec, real, out_dtype)
    with torch.autocast(device_type=q.device.type, enabled=False):
        q, k, v = (mask_keys(t.to(dtype), real) for t in (q, k, v))
        fq, fk, v, marks = NonFiniteMarks.feature_map(spec.phi, q, k, v, finite)
        state = _step_state(state, B, H, fk.shape[-1], Dv, dtype, k.device)
        out, state = step(fq[:, :, 0], fk[:, :, 0], v[:, :, 0], state, eps=spec.eps,
                          real=None if real is None else real[:, 0], **chosen.rule_args)
    return marks.step(out)[:, :, None].to(out_dtype), marks.state(state)


def _needs_grad(q, k, v, state) -> bool:
    tensors = (q, k, v) + (() if state is None else (state.s, state.z, state.m))
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _step_state(state, B: int, H: int, D: int, Dv: int, dtype: torch.dtype, device) -> MomentumAttentionState:
    """The state a step starts from: zeros for None, else checked against (B, H, D, Dv) and cast."""
    if state is None:
        return MomentumAttentionState.zeros(B, H, D, Dv, dtype=dtype, device=device)
    check_state(state, B, H, D, Dv, device)
    return state if state.s.dtype == dtype else state.to(dtype)     # a state's parts share one dtype


def _marked_step(chosen, q, k, v, state, spec, real, out_dtype):
    """The decoding step without gradients in one Triton launch (feature map, marks and eq. 12:
    triton.marked_recurrent_step), in eager mode; compiled graphs fuse attend_step's own ops."""
    state = _step_state(state, *q.shape[:2], q.shape[-1], v.shape[-1], chosen.state_dtype, k.device)
    out, state = chosen.kernels.marked_recurrent_step(
        q.select(2, 0), k.select(2, 0), v.select(2, 0), state, feature_map=spec.phi, eps=spec.eps,
        real=None if real is None else real.select(1, 0), out_dtype=out_dtype, **chosen.rule_args)
    return out.unsqueeze(2), state


def execute(chosen: Plan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec, *,
            segments: Optional[Segments] = None, initial_state: Optional[MomentumAttentionState] = None,
            return_state: bool = False, finite: bool = False):
    """Runs `chosen` (a `plan` of `attend`'s arguments, not "context_parallel" nor a step path):
    packs padded inputs of packed segments, runs the path, unpacks."""
    repack = segments is not None and segments.packed and (segments.index is not None or segments.batch != 1)
    if repack:
        q, k, v = segments.pack(q), segments.pack(k), segments.pack(v)
    out_dtype = torch.promote_types(torch.promote_types(q.dtype, k.dtype), v.dtype)
    if chosen.path in ("noncausal", "noncausal_varlen"):
        out, state = _noncausal(q, k, v, spec, segments, finite, chosen.state_dtype).to(out_dtype), None
    else:
        out, state = _causal(chosen, q, k, v, spec, segments, initial_state, return_state, finite)
        out = as_dtype(out, out_dtype)
    if repack:
        out = segments.unpack(out)
    return (out, state) if return_state else out


def _causal(chosen, q, k, v, spec, segments, initial_state, return_state, finite):
    extra = dict(chosen.rule_args)
    if chosen.path == "triton":
        kernel = chosen.kernels.chunk_momentum_attention
    elif chosen.path == "varlen":
        kernel = varlen_causal_momentum_attention
        extra["cu_seqlens_cpu"] = segments.cu_seqlens_cpu
    else:
        kernel = chunk_causal_momentum_attention
    with torch.autocast(device_type=q.device.type, enabled=False):
        q, k, v = (as_dtype(t, chosen.run_dtype) for t in (q, k, v))
        hyper = dict(state_dtype=chosen.state_dtype, eps=spec.eps, chunk_size=spec.chunk_size,
                     initial_state=initial_state, return_state=return_state, finite=finite,
                     kernels=chosen.kernels if chosen.path == "triton" else None)
        if segments is not None and segments.packed:
            return _causal_packed(q, k, v, spec.phi, segments.cu_seqlens, kernel=kernel, extra=extra, **hyper)
        return _causal_rows(q, k, v, spec.phi, segments, kernel=kernel, extra=extra, **hyper)


def _causal_rows(q, k, v, phi, segments, *, kernel, extra, state_dtype, eps, chunk_size,
                 initial_state, return_state, finite, kernels):
    """Causal form on any padding pattern: real tokens are moved to the front of their row
    (`segments.order`, a stable gather), run right-padded through `kernel` on finite inputs, and
    moved back."""
    B, H, N, Dv = *q.shape[:3], v.shape[-1]
    lengths, order, mask = None, None, None
    if segments is not None and segments.padding_mask is not None:
        lengths, order = segments.lengths, segments.order
        if order is not None:
            q, k, v = (_gather(t, order) for t in (q, k, v))
        mask = torch.arange(N, device=q.device) < lengths[:, None]
    if _one_node(kernels, finite, initial_state, return_state) and B * H * N:
        out = kernels.marked_chunk_attention(phi, q, k, v, lengths=lengths, eps=eps, chunk_size=chunk_size,
                                             **extra)
        if out is not None:
            return _restored(out, mask, order, segments), None
    fq, fk, v, marks = _feature_map(phi, q, k, v, finite, kernels, mask, lengths)
    D = fk.shape[-1]
    if initial_state is not None:
        check_state(initial_state, B, H, D, Dv, q.device)
        initial_state = initial_state.to(state_dtype)
    if B * H * N == 0:                  # nothing to compute; the empty sums keep the autograd graph
        out = v.new_zeros(B, H, N, Dv) + (fq.sum() + fk.sum() + v.sum())
        if return_state and initial_state is None:
            initial_state = MomentumAttentionState.zeros(B, H, D, Dv, dtype=state_dtype, device=q.device)
        return out, initial_state
    out, state = kernel(fq, fk, v, eps=eps, chunk_size=chunk_size, initial_state=initial_state,
                        lengths=lengths, return_state=return_state, **extra)
    out = marks.causal(out)
    if return_state:
        state = marks.state(state)
    return _restored(out, mask, order, segments), state


def _restored(out, mask, order, segments):
    """out with its padded positions zeroed and its rows' tokens back in place (`_causal_rows`)."""
    if mask is not None:
        out = mask_keys(out, mask)
    if order is not None:
        out = _gather(out, segments.restore)
    return out


def _one_node(kernels, finite, initial_state, return_state) -> bool:
    """Whether a layer's call runs as one autograd node (triton.marked_chunk_attention): the Triton
    path in eager mode, marks wanted, no state in or out (training), as _feature_map's kernels."""
    return initial_state is None and not return_state and _marks_in_kernels(kernels, finite)


def _marks_in_kernels(kernels, finite) -> bool:
    """Whether the Triton kernels compute the feature map and its marks: the Triton path, marks
    wanted, eager mode (compiled graphs fuse the PyTorch ops instead)."""
    return kernels is not None and not finite and not torch.compiler.is_compiling()


def _feature_map(phi, q, k, v, finite, kernels, mask=None, lengths=None, segments=None, count=0):
    """φ(q), φ(k), v's finite part and the marks of nonfinite.NonFiniteMarks, padded positions
    (`mask`, from `lengths`) zeroed first (mask_keys) and φ(k) zeroed there again: one Triton kernel
    for q, k and v (triton.finite_features; `segments` (N,) and `count`: the packed sequences, whose
    causal marks the kernels then keep apart) where they take the call (the Triton path, eager mode,
    marks wanted, a built-in map, not float64), else PyTorch ops (fused under torch.compile)."""
    if _marks_in_kernels(kernels, finite):
        fused = kernels.finite_features(phi, q, k, v, lengths, segments, count)
        if fused is not None:
            return fused
    q, k, v = (mask_keys(t, mask) for t in (q, k, v))
    fq, fk, v, marks = NonFiniteMarks.feature_map(phi, q, k, v, finite)
    return fq, mask_keys(fk, mask), v, marks


def _causal_packed(q, k, v, phi, cu, *, kernel, extra, state_dtype, eps, chunk_size,
                   initial_state, return_state, finite, kernels):
    """Causal form on packed sequences (batch 1): every segment restarts from its own initial
    state; NaN marks stay inside their segment."""
    H, N, Dv = q.shape[1], q.shape[2], v.shape[-1]
    n = cu.numel() - 1
    segments = segment_of_tokens(cu, N)
    if _one_node(kernels, finite, initial_state, return_state) and N and H:
        out = kernels.marked_chunk_attention(phi, q, k, v, segments=segments, count=n, cu_seqlens=cu, eps=eps,
                                             chunk_size=chunk_size, **extra)
        if out is not None:
            return out, None
    fq, fk, v, marks = _feature_map(phi, q, k, v, finite, kernels, segments=segments, count=n)
    D = fk.shape[-1]
    if initial_state is not None:
        check_state(initial_state, n, H, D, Dv, q.device, packed=True)
        initial_state = initial_state.to(state_dtype)
    if N == 0 or H == 0:
        out = v.new_zeros(v.shape) + (fq.sum() + fk.sum() + v.sum())
        if return_state and initial_state is None:
            initial_state = MomentumAttentionState.zeros(n, H, D, Dv, dtype=state_dtype, device=q.device)
        return out, initial_state
    out, state = kernel(fq, fk, v, eps=eps, chunk_size=chunk_size, initial_state=initial_state,
                        return_state=return_state, cu_seqlens=cu, **extra)
    out = marks.causal(out, segments=segments)
    if return_state:
        state = marks.state(state, segments=segments, count=n)
    return out, state


def _noncausal(q, k, v, spec, segments, finite, dtype):
    """Eq. 14 as two sums over the real keys (per segment when packed), in float32 (float64 for
    float64 inputs)."""
    mask = None if segments is None or segments.packed else segments.padding_mask
    with torch.autocast(device_type=q.device.type, enabled=False):
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
        fq, fk, v, marks = NonFiniteMarks.feature_map(spec.phi, q, mask_keys(k, mask), mask_keys(v, mask),
                                                      finite)
        if segments is not None and segments.packed:
            cu = segments.cu_seqlens
            if q.shape[2] == 0:
                return v.new_zeros(v.shape) + (fq.sum() + fk.sum())
            out = varlen_noncausal_momentum_attention(
                fq, fk, v, cu_seqlens=cu, rule=spec.momentum_rule, eps=spec.eps,
                chunk_size=spec.chunk_size, cu_seqlens_cpu=segments.cu_seqlens_cpu)
            return marks.noncausal(out, segments=segment_of_tokens(cu, q.shape[2]), count=cu.numel() - 1)
        fk = mask_keys(fk, mask)
        kv, z = noncausal_summary(fk, v, rule=spec.momentum_rule, key_mask=mask)
        return marks.noncausal(apply_noncausal_summary(fq, kv, z, eps=spec.eps))


def mask_keys(t: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
    """Zero padded positions with `where`, so NaN or inf in padding reaches neither the sums nor
    the gradients (masking only after φ would leave φ's backward multiplying 0 by NaN)."""
    if mask is None:
        return t
    return torch.where(mask[:, None, :, None], t, torch.zeros((), dtype=t.dtype, device=t.device))


def _gather(t: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    return t.gather(2, order[:, None, :, None].expand(t.shape[0], t.shape[1], -1, t.shape[3]))


def check_state(state: MomentumAttentionState, B: int, H: int, Dk: int, Dv: int,
                device: torch.device, packed: bool = False) -> None:
    """Shapes and device only (they protect memory): no value is read."""
    if packed and state.s.dim() == 4 and state.s.shape[0] != B:
        raise ValueError(f"with cu_seqlens the state holds one row per packed sequence: batch {B} "
                         f"(len(cu_seqlens) - 1), got {state.s.shape[0]}")
    state.check(B, H, Dk, Dv)
    if state.s.device != device:
        raise ValueError(f"state is on {state.s.device} but the inputs are on {device}")

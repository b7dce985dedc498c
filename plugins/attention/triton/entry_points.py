"""The public entry points of the Triton forms of momentum attention (Momentum Transformer,
eq. 13 chunked and eq. 12's decoding step): inputs promoted to one dtype and made contiguous,
lengths clamped, empty inputs answered without a launch, the state wrapped, and the work done by
the custom ops of `op` (which launch the kernels through `chunk` and `fused_recurrent`). Imports
go one way: entry_points → op → chunk / fused_recurrent → chunk_kernels / utils."""
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..checks import as_dtype
from ..feature_maps import elu_plus_one, identity
from ..nonfinite import NonFiniteMarks
from ..state import MomentumAttentionState
from .feature_marks import FiniteFeatures, MarkedOutput
from .fused_recurrent import marked_step
from .layer_call import MarkedChunk
from .op import chunk_momentum_attention_op, momentum_attention_step_op
from .utils import accumulator_dtype, kernel_inputs

# The feature maps that marked_recurrent_step applies in-kernel (fused_recurrent._feature).
MARKED_FEATURE_MAPS = {elu_plus_one: 1, F.relu: 2, identity: 3}


def chunk_momentum_attention(
    fq: torch.Tensor, fk: torch.Tensor, v: torch.Tensor, *, momentum: float, step_size: float,
    eps: float, chunk_size: int, initial_state: MomentumAttentionState | None = None,
    lengths: torch.Tensor | None = None, return_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, MomentumAttentionState | None]:
    """Eq. 13 on feature-mapped fq, fk (B, H, N, Dk) and v (B, H, N, Dv) of one dtype (bf16, fp16,
    fp32 or fp64; mixed dtypes run in the promoted one), padding on the right with `lengths` (B,)
    real tokens per row (None = all; clamped to [0, N]).
    Packed sequences: `cu_seqlens` (n + 1,) integer offsets over one row (B = 1, lengths None),
    segment s the tokens [cu[s], cu[s+1]), each run as its own sequence (its own initial state,
    step count and denominators); the states are then per segment, batch n. Its values (0 first,
    non-decreasing, N last) are the caller's to check (plugins.validation.check_offsets,
    which reads them on the host); here they are clamped into [0, N] and made non-decreasing on
    the device, so that no value makes a kernel read or write outside the row.
    Returns the output (B, H, N, Dv) in the input dtype, 0 at padded positions, and, if asked, the
    state after each row's (segment's) last real token (s, z, m in fp32, fp64 for fp64 input; an
    empty segment's is its initial state, or zeros). Differentiable in fq, fk, v and the initial
    state."""
    out_dtype = v.dtype
    fq, fk, v = kernel_inputs(fq, fk, v)
    acc = accumulator_dtype(fq.dtype)
    B, H, N, DK = fq.shape
    lengths, cu_seqlens = _tables(fq, lengths, cu_seqlens)
    states = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    if initial_state is None:
        s0 = z0 = m0 = None
    else:
        initial_state.check(states, H, DK, v.shape[3])
        s0, z0, m0 = (t.to(acc).contiguous() for t in (initial_state.s, initial_state.z, initial_state.m))
    if fq.numel() == 0 or v.numel() == 0:
        out = v.new_zeros(v.shape, dtype=out_dtype)
        state = initial_state if initial_state is not None else MomentumAttentionState.zeros(
            states, H, DK, v.shape[3], dtype=acc, device=fq.device)
        return out, (state if return_state else None)
    out, s, z, m = chunk_momentum_attention_op(fq, fk, v, s0, z0, m0, lengths, cu_seqlens, float(momentum),
                                               float(step_size), float(eps), int(chunk_size))
    out = as_dtype(out, out_dtype)
    if not return_state:
        return out, None
    if momentum == 0.0:
        m = _last_momentum(fk, v, lengths, cu_seqlens, m0)
    return out, MomentumAttentionState.trusted(s, z, m)


def _tables(fq, lengths, cu_seqlens):
    """(lengths, cu_seqlens) as the kernels read them: lengths int32 clamped into [0, N] on the device
    (no sync: a length past N would make the kernels read the next row), the offsets as
    `_packed_offsets` makes them; None stays None."""
    if cu_seqlens is not None:
        cu_seqlens = _packed_offsets(cu_seqlens, fq, lengths)
    if lengths is not None:
        lengths = lengths.to(device=fq.device, dtype=torch.int32).clamp(0, fq.shape[2]).contiguous()
    return lengths, cu_seqlens


def marked_chunk_attention(phi, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, momentum: float,
                           step_size: float, eps: float, chunk_size: int, lengths: torch.Tensor | None = None,
                           segments: torch.Tensor | None = None, count: int = 0,
                           cu_seqlens: torch.Tensor | None = None) -> torch.Tensor | None:
    """A layer's eager call without a state in or out, in one autograd node (layer_call.MarkedChunk):
    φ of raw q, k (B, H, N, Dk) and v (B, H, N, Dv) with their non-finite marks (finite_features'
    rules: `lengths`, or `segments` and `count` with the packed row's `cu_seqlens`), eq. 13 from a
    zero state, and the causal marks; out in v's dtype. None where finite_features would not take
    the call (a feature map without a kernel, float64): the caller chains the general path."""
    code = _feature_code(phi, q, k, v)
    if code is None:
        return None
    tables = _tables(q, lengths, cu_seqlens)
    return MarkedChunk.apply(q, k, v, code, lengths, segments, count, tables, float(momentum),
                             float(step_size), float(eps), int(chunk_size))


def _packed_offsets(cu_seqlens, fq, lengths):
    """cu_seqlens as the kernels read it: int32 on the inputs' device, clamped into [0, N] and
    non-decreasing (device ops, no sync). The shape rules are checked here, the values by the
    caller."""
    if lengths is not None:
        raise ValueError("cu_seqlens and lengths cannot be combined: a packed row's segments are all real "
                         "tokens (pass one or the other)")
    if fq.shape[0] != 1:
        raise ValueError(f"cu_seqlens needs the packed sequences in one row (batch 1), got batch "
                         f"{fq.shape[0]}")
    if (not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2
            or cu_seqlens.dtype.is_floating_point or cu_seqlens.dtype.is_complex
            or cu_seqlens.dtype == torch.bool):
        raise ValueError("cu_seqlens must be a 1-D integer tensor of n + 1 >= 2 offsets, got "
                         f"{getattr(cu_seqlens, 'shape', type(cu_seqlens).__name__)}")
    cu = cu_seqlens.to(device=fq.device, dtype=torch.int64).clamp(0, fq.shape[2])
    return torch.cummax(cu, 0).values.to(torch.int32).contiguous()


def _last_momentum(fk, v, lengths, cu_seqlens, m0):
    """At β = 0 eq. 12's momentum is m_L = −φ(k_L)v_Lᵀ, the last real token's (m₀ if there is
    none): the one-state kernels do not carry it, so it is gathered here (differentiably), per row
    or per segment (the token before cu[s+1])."""
    B, H, N, DK = fk.shape
    acc = accumulator_dtype(fk.dtype)
    if cu_seqlens is not None:
        ends = cu_seqlens.long()
        # segments become rows: the key and value of token `last` of the one row
        fk, v = fk.expand(ends.shape[0] - 1, H, N, DK), v.expand(ends.shape[0] - 1, H, N, v.shape[3])
        count, last = ends[1:] - ends[:-1], ends[1:] - 1
        B = count.shape[0]
    else:
        count = torch.full((B,), N, device=fk.device) if lengths is None else lengths.long()
        last = count - 1
    last = last.clamp(min=0)[:, None, None, None]
    empty = (count == 0)[:, None, None]
    zero = torch.zeros((), dtype=acc, device=fk.device)
    # a row without real tokens gathers a padded one: masked before the product, not after it
    k_last = torch.where(empty, zero, fk.gather(2, last.expand(B, H, 1, DK))[:, :, 0].to(acc))
    v_last = torch.where(empty, zero, v.gather(2, last.expand(B, H, 1, v.shape[3]))[:, :, 0].to(acc))
    m = -(k_last[..., :, None] * v_last[..., None, :])
    fallback = torch.zeros_like(m) if m0 is None else m0
    return torch.where(empty[..., None], fallback, m)


@dataclass
class KernelMarks(NonFiniteMarks):
    """NonFiniteMarks whose causal marks one kernel adds (feature_marks.MarkedOutput), from each
    column's first marked key or value position per row, or per packed sequence of `segments`,
    which the feature kernels record (`first`, feature_marks.first_marked)."""

    first: torch.Tensor | None = None
    segments: torch.Tensor | None = None

    def causal(self, out: torch.Tensor, segments: torch.Tensor | None = None) -> torch.Tensor:
        if segments is not self.segments:          # the first marks were taken over another layout
            return super().causal(out, segments)
        return MarkedOutput.apply(out, self.query, self.first, segments)


def _feature_code(phi, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> int | None:
    """The feature kernels' code of `phi` (MARKED_FEATURE_MAPS), or None where they do not take the
    call: a map without a kernel, or float64 inputs."""
    code = MARKED_FEATURE_MAPS.get(phi)
    if code is None or torch.float64 in (q.dtype, k.dtype, v.dtype):
        return None
    return code


def finite_features(phi, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    lengths: torch.Tensor | None = None, segments: torch.Tensor | None = None,
                    count: int = 0) -> tuple | None:
    """(φ(q), φ(k), v's finite part, the marks) as nonfinite.NonFiniteMarks.feature_map computes
    them from raw q, k (B, H, N, Dk) and v (B, H, N, Dv), one kernel for the three forward and one
    backward, for a built-in feature map (MARKED_FEATURE_MAPS) on bf16, fp16 or fp32 inputs; None
    otherwise. `lengths` (B,) integers on the inputs' device: the positions from lengths[b] on are
    padding, zeroed first as attend.mask_keys does (and φ(k) zeroed there again). The features come
    out contiguous, in their inputs' dtype; differentiable in q, k, v. The marks (KernelMarks) add
    their causal marks in one kernel too: per row, or with `segments` (N,) integers, each position's
    sequence of `count` in one packed row (batch 1), per packed sequence."""
    code = _feature_code(phi, q, k, v)
    if code is None:
        return None
    fq, fk, v, query, key, value, first = FiniteFeatures.apply(q, k, v, code, lengths, segments, count)
    return fq, fk, v, KernelMarks(query, key, value, first, segments)


def fused_recurrent_step(fq: torch.Tensor, fk: torch.Tensor, v: torch.Tensor,
                         state: MomentumAttentionState, *, momentum: float, step_size: float, eps: float,
                         real: torch.Tensor | None = None,
                         ) -> tuple[torch.Tensor, MomentumAttentionState]:
    """Eq. 12 for one new position: fq, fk (B, H, Dk), v (B, H, Dv) in any float dtype; the state
    in fp32 (fp64 for fp64 input). `real` (B,) bool: rows where it is False keep their state and
    output 0. Returns the output (B, H, Dv) in v's dtype and the new state; differentiable in the
    inputs and the state (the backward is a few PyTorch ops)."""
    out_dtype = v.dtype
    fq, fk, v = kernel_inputs(fq, fk, v)
    acc = accumulator_dtype(fq.dtype)
    B, H = fq.shape[:2]
    s, z, m = (t.to(acc).contiguous() for t in (state.s, state.z, state.m))
    flags = None
    if real is not None:
        flags = real.to(device=fq.device, dtype=torch.bool)[:, None].expand(B, H).to(torch.int8).contiguous()
    if fq.numel() == 0 or v.numel() == 0:
        return v.new_zeros(v.shape, dtype=out_dtype), MomentumAttentionState.trusted(s, z, m)
    out, s, z, m = momentum_attention_step_op(fq, fk, v, s, z, m, flags, float(momentum), float(step_size),
                                              float(eps))
    return out.to(out_dtype), MomentumAttentionState.trusted(s, z, m)


def marked_recurrent_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: MomentumAttentionState,
                          *, feature_map, momentum: float, step_size: float, eps: float,
                          real: torch.Tensor | None, out_dtype: torch.dtype,
                          ) -> tuple[torch.Tensor, MomentumAttentionState]:
    """Eq. 12 for one new position from raw q, k (B, H, Dk) and v (B, H, Dv) and a built-in
    feature map (MARKED_FEATURE_MAPS), with the non-finite marks of nonfinite.NonFiniteMarks, in
    one launch; the state's dtype (fp32, or fp64) is the step's. `real` (B,) bool: rows where it
    is False keep their state and output 0. Returns the output (B, H, Dv) in out_dtype and the new
    state. Not differentiable: attend.attend_step takes it only for steps without gradients."""
    q, k, v = kernel_inputs(q, k, v)
    s, z, m = state.s.contiguous(), state.z.contiguous(), state.m.contiguous()
    if q.numel() == 0 or v.numel() == 0:
        return v.new_zeros(v.shape, dtype=out_dtype), MomentumAttentionState.trusted(s, z, m)
    flags = None if real is None else real.to(device=q.device, dtype=torch.int8)
    out, s, z, m = marked_step(q, k, v, s, z, m, flags, MARKED_FEATURE_MAPS[feature_map], float(momentum),
                               float(step_size), float(eps))
    return as_dtype(out, out_dtype), MomentumAttentionState.trusted(s, z, m)

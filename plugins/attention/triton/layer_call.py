"""A decoder layer's eager training call of momentum attention in one autograd node: the feature
map with its non-finite marks (feature_marks), eq. 13 chunked (chunk) and the causal marks on its
output, forward and backward, with no initial state and no state returned. The same launches as
the three nodes that `attend` otherwise chains (FiniteFeatures, the chunk op's eager node,
MarkedOutput), and the same casts between them, so the results are the same bits; one node
instead of three, and none of the entry point's per-call work, is host time the eager step
spends (docs/benchmarks.md, 2026-11-29)."""
import torch

from ..checks import as_dtype
from .chunk import chunk_backward, chunk_forward
from .feature_marks import backward as feature_grads
from .feature_marks import forward as features
from .feature_marks import marked_output
from .utils import kernel_inputs


class MarkedChunk(torch.autograd.Function):
    """out (B, H, N, Dv) in v's dtype from raw q, k, v: φ, eq. 13 from a zero state, the marks."""

    @staticmethod
    def forward(ctx, q, k, v, phi: int, lengths, segments, count: int, tables: tuple, momentum: float,
                step_size: float, eps: float, chunk: int):
        fq, fk, fv, query, _key, _value, first = features(q, k, v, phi, lengths, segments, count)
        kq, kk, kv = kernel_inputs(fq, fk, fv)
        clamped, cu_seqlens = tables
        out, den, _s, _z, _m, splits = chunk_forward(kq, kk, kv, None, None, None, clamped, cu_seqlens,
                                                     momentum, step_size, eps, chunk)
        ctx.save_for_backward(q, k, v, lengths, kq, kk, kv, out, den, splits, clamped, cu_seqlens)
        ctx.hyper = (momentum, step_size, eps, chunk)
        ctx.phi, ctx.feature_dtypes = phi, (fq.dtype, fk.dtype, fv.dtype)
        return marked_output(as_dtype(out, fv.dtype), query, first, segments)

    @staticmethod
    def backward(ctx, grad):
        q, k, v, lengths, kq, kk, kv, out, den, splits, clamped, cu_seqlens = ctx.saved_tensors
        if not any(ctx.needs_input_grad[:3]):
            return (None,) * 12
        d_out = as_dtype(grad, out.dtype).contiguous()
        dq, dk, dv, *_ = chunk_backward(kq, kk, kv, out, den, splits, d_out, None, None, None, None, None,
                                        None, clamped, cu_seqlens, *ctx.hyper)
        grads = [as_dtype(g, dtype) for g, dtype in zip((dq, dk, dv), ctx.feature_dtypes)]
        dq, dk, dv = feature_grads(q, k, v, grads, ctx.phi, lengths)
        need = ctx.needs_input_grad
        return (dq if need[0] else None, dk if need[1] else None, dv if need[2] else None) + (None,) * 9

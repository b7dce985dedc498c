"""The Triton forms registered as torch.library ops (`torch.library.triton_op`), with autograd, so
that torch.compile traces through them (Inductor sees the Triton kernels themselves, launched
through `wrap_triton`) instead of breaking the graph around an opaque call."""
from typing import Optional, Tuple

import torch
from torch import Tensor
from torch.library import register_autograd, triton_op, wrap_triton

from .chunk import chunk_backward, chunk_forward
from .fused_recurrent import recurrent_step

NAMESPACE = "momentum_plugins"


@triton_op(f"{NAMESPACE}::chunk_momentum_attention", mutates_args=())
def chunk_momentum_attention_forward(
    fq: Tensor, fk: Tensor, v: Tensor, s0: Optional[Tensor], z0: Optional[Tensor], m0: Optional[Tensor],
    lengths: Optional[Tensor], momentum: float, step_size: float, eps: float, chunk: int,
) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(out, den, s, z, m): eq. 13's output, its denominator (kept for the backward) and the final
    state."""
    return chunk_forward(fq, fk, v, s0, z0, m0, lengths, momentum, step_size, eps, chunk, launch=wrap_triton)


@triton_op(f"{NAMESPACE}::chunk_momentum_attention_backward", mutates_args=())
def chunk_momentum_attention_backward(
    fq: Tensor, fk: Tensor, v: Tensor, out: Tensor, den: Tensor, do: Tensor, s0: Optional[Tensor],
    z0: Optional[Tensor], m0: Optional[Tensor], ds: Optional[Tensor], dz: Optional[Tensor],
    dm: Optional[Tensor], lengths: Optional[Tensor], momentum: float, step_size: float, eps: float,
    chunk: int,
) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    return chunk_backward(fq, fk, v, out, den, do, s0, z0, m0, ds, dz, dm, lengths, momentum, step_size,
                          eps, chunk, launch=wrap_triton)


def _setup_context(ctx, inputs, output):
    fq, fk, v, s0, z0, m0, lengths, momentum, step_size, eps, chunk = inputs
    out, den = output[0], output[1]
    ctx.save_for_backward(fq, fk, v, out, den, s0, z0, m0, lengths)
    ctx.hyper = (momentum, step_size, eps, chunk)
    ctx.has_init = s0 is not None


def _backward(ctx, d_out, d_den, d_s, d_z, d_m):
    fq, fk, v, out, den, s0, z0, m0, lengths = ctx.saved_tensors
    if d_out is None:
        d_out = torch.zeros_like(out)
    final = (d_s, d_z, d_m)
    if all(g is None for g in final):
        final = (None, None, None)
    else:
        final = tuple(torch.zeros(shape, dtype=den.dtype, device=den.device) if g is None
                      else g.to(den.dtype).contiguous()
                      for g, shape in zip(final, (fq.shape[:2] + (fq.shape[3], v.shape[3]),
                                                  fq.shape[:2] + (fq.shape[3],),
                                                  fq.shape[:2] + (fq.shape[3], v.shape[3]))))
    dq, dk, dv, ds0, dz0, dm0 = chunk_momentum_attention_backward(
        fq, fk, v, out, den, d_out.contiguous(), s0, z0, m0, *final, lengths, *ctx.hyper)
    if not ctx.has_init:
        ds0 = dz0 = dm0 = None
    return dq, dk, dv, ds0, dz0, dm0, None, None, None, None, None


register_autograd(chunk_momentum_attention_forward, _backward, setup_context=_setup_context)


def chunk_momentum_attention_op(fq, fk, v, s0, z0, m0, lengths, momentum, step_size, eps, chunk):
    """(out, s, z, m) through the registered op."""
    out, _den, s, z, m = chunk_momentum_attention_forward(fq, fk, v, s0, z0, m0, lengths, momentum,
                                                          step_size, eps, chunk)
    return out, s, z, m


@triton_op(f"{NAMESPACE}::momentum_attention_step", mutates_args=())
def momentum_attention_step_op(
    fq: Tensor, fk: Tensor, v: Tensor, s: Tensor, z: Tensor, m: Tensor, real: Optional[Tensor],
    momentum: float, step_size: float, eps: float,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """(out, s, z, m) after one decoding step (eq. 12); no autograd (generation only)."""
    return recurrent_step(fq, fk, v, s, z, m, real, momentum, step_size, eps, launch=wrap_triton)

"""The Triton forms registered as torch.library custom ops with fake (shape) implementations and
autograd, so that torch.compile keeps a model that calls them in one graph (the op is one opaque
node; no graph break). `torch.library.triton_op` would also expose the kernels to Inductor, but its
tracing cannot run under TRITON_INTERPRET (wrap_triton hands back the interpreted function, which
fake tensors cannot run), so the one path that CPU tests can check is the opaque op."""

import torch
from torch import Tensor
from torch.library import custom_op, register_autograd

from .chunk import chunk_backward, chunk_forward
from .fused_recurrent import recurrent_step
from .utils import accumulator_dtype

NAMESPACE = "momentum_plugins"


@custom_op(f"{NAMESPACE}::chunk_momentum_attention", mutates_args=())
def chunk_momentum_attention_forward(
    fq: Tensor, fk: Tensor, v: Tensor, s0: Tensor | None, z0: Tensor | None, m0: Tensor | None,
    lengths: Tensor | None, momentum: float, step_size: float, eps: float, chunk: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(out, den, s, z, m): eq. 13's output, its denominator (kept for the backward) and the final
    state."""
    return chunk_forward(fq, fk, v, s0, z0, m0, lengths, momentum, step_size, eps, chunk)


@chunk_momentum_attention_forward.register_fake
def _(fq, fk, v, s0, z0, m0, lengths, momentum, step_size, eps, chunk):
    B, H, N, DK = fq.shape
    DV = v.shape[-1]
    acc = accumulator_dtype(fq.dtype)
    return (torch.empty_like(v), fq.new_empty(B, H, N, dtype=acc), fq.new_empty(B, H, DK, DV, dtype=acc),
            fq.new_empty(B, H, DK, dtype=acc), fq.new_empty(B, H, DK, DV, dtype=acc))


@custom_op(f"{NAMESPACE}::chunk_momentum_attention_backward", mutates_args=())
def chunk_momentum_attention_backward(
    fq: Tensor, fk: Tensor, v: Tensor, out: Tensor, den: Tensor, do: Tensor, s0: Tensor | None,
    z0: Tensor | None, m0: Tensor | None, ds: Tensor | None, dz: Tensor | None,
    dm: Tensor | None, lengths: Tensor | None, momentum: float, step_size: float, eps: float,
    chunk: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    return chunk_backward(fq, fk, v, out, den, do, s0, z0, m0, ds, dz, dm, lengths, momentum, step_size,
                          eps, chunk)


@chunk_momentum_attention_backward.register_fake
def _(fq, fk, v, out, den, do, s0, z0, m0, ds, dz, dm, lengths, momentum, step_size, eps, chunk):
    B, H, _, DK = fq.shape
    DV = v.shape[-1]
    acc = den.dtype
    return (torch.empty_like(fq), torch.empty_like(fk), torch.empty_like(v),
            fq.new_empty(B, H, DK, DV, dtype=acc), fq.new_empty(B, H, DK, dtype=acc),
            fq.new_empty(B, H, DK, DV, dtype=acc))


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
    B, H, _, DK = fq.shape
    DV = v.shape[-1]
    final = (d_s, d_z, d_m)
    if all(g is None for g in final):
        final = (None, None, None)
    else:
        final = tuple(den.new_zeros(shape) if g is None else g.to(den.dtype).contiguous()
                      for g, shape in zip(final, ((B, H, DK, DV), (B, H, DK), (B, H, DK, DV))))
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


@custom_op(f"{NAMESPACE}::momentum_attention_step", mutates_args=())
def momentum_attention_step_op(
    fq: Tensor, fk: Tensor, v: Tensor, s: Tensor, z: Tensor, m: Tensor, real: Tensor | None,
    momentum: float, step_size: float, eps: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(out, s, z, m) after one decoding step (eq. 12); no autograd (generation only)."""
    return recurrent_step(fq, fk, v, s, z, m, real, momentum, step_size, eps)


@momentum_attention_step_op.register_fake
def _(fq, fk, v, s, z, m, real, momentum, step_size, eps):
    return torch.empty_like(v), torch.empty_like(s), torch.empty_like(z), torch.empty_like(m)

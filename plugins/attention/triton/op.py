"""The Triton forms registered as torch.library custom ops with fake (shape) implementations and
autograd, so that torch.compile keeps a model that calls them in one graph (the op is one opaque
node; no graph break). `torch.library.triton_op` would also expose the kernels to Inductor, but its
tracing cannot run under TRITON_INTERPRET (wrap_triton hands back the interpreted function, which
fake tensors cannot run), so the one path that CPU tests can check is the opaque op. The ops take
prepared inputs (`entry_points` prepares them) and call the launchers of `chunk` and
`fused_recurrent`, which import nothing from here."""

import torch
from torch import Tensor
from torch.library import custom_op, register_autograd

from .chunk import chunk_backward, chunk_forward, kept_splits_numel
from .fused_recurrent import recurrent_step
from .utils import accumulator_dtype

NAMESPACE = "momentum_plugins"


def _states(fq, v, cu_seqlens):
    """The states' batch: B, or the number of segments of a packed row."""
    return fq.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1


@custom_op(f"{NAMESPACE}::chunk_momentum_attention", mutates_args=())
def chunk_momentum_attention_forward(
    fq: Tensor, fk: Tensor, v: Tensor, s0: Tensor | None, z0: Tensor | None, m0: Tensor | None,
    lengths: Tensor | None, cu_seqlens: Tensor | None, momentum: float, step_size: float, eps: float,
    chunk: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(out, den, s, z, m, splits): eq. 13's output, its denominator, the final state (per row, or
    per segment of `cu_seqlens`) and the fused kernels' split states (1-D, often empty; den and
    splits are kept for the backward). The chunk tables of a packed row are built
    inside (chunk.varlen_tables): their size depends on the offsets' values, which the op's
    fake implementation does not need."""
    return chunk_forward(fq, fk, v, s0, z0, m0, lengths, cu_seqlens, momentum, step_size, eps, chunk)


@chunk_momentum_attention_forward.register_fake
def _(fq, fk, v, s0, z0, m0, lengths, cu_seqlens, momentum, step_size, eps, chunk):
    B, H, N, DK = fq.shape
    DV = v.shape[-1]
    S = _states(fq, v, cu_seqlens)
    acc = accumulator_dtype(fq.dtype)
    return (torch.empty_like(v), fq.new_empty(B, H, N, dtype=acc), fq.new_empty(S, H, DK, DV, dtype=acc),
            fq.new_empty(S, H, DK, dtype=acc), fq.new_empty(S, H, DK, DV, dtype=acc),
            fq.new_empty(kept_splits_numel(fq, v, cu_seqlens, chunk), dtype=acc))


@custom_op(f"{NAMESPACE}::chunk_momentum_attention_backward", mutates_args=())
def chunk_momentum_attention_backward(
    fq: Tensor, fk: Tensor, v: Tensor, out: Tensor, den: Tensor, splits: Tensor, do: Tensor,
    s0: Tensor | None, z0: Tensor | None, m0: Tensor | None, ds: Tensor | None, dz: Tensor | None,
    dm: Tensor | None, lengths: Tensor | None, cu_seqlens: Tensor | None, momentum: float, step_size: float,
    eps: float, chunk: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    return chunk_backward(fq, fk, v, out, den, splits, do, s0, z0, m0, ds, dz, dm, lengths, cu_seqlens,
                          momentum, step_size, eps, chunk)


@chunk_momentum_attention_backward.register_fake
def _(fq, fk, v, out, den, splits, do, s0, z0, m0, ds, dz, dm, lengths, cu_seqlens, momentum, step_size, eps,
      chunk):
    _, H, _, DK = fq.shape
    DV = v.shape[-1]
    S = _states(fq, v, cu_seqlens)
    acc = den.dtype
    return (torch.empty_like(fq), torch.empty_like(fk), torch.empty_like(v),
            fq.new_empty(S, H, DK, DV, dtype=acc), fq.new_empty(S, H, DK, dtype=acc),
            fq.new_empty(S, H, DK, DV, dtype=acc))


def _setup_context(ctx, inputs, output):
    fq, fk, v, s0, z0, m0, lengths, cu_seqlens, momentum, step_size, eps, chunk = inputs
    out, den, splits = output[0], output[1], output[5]
    ctx.save_for_backward(fq, fk, v, out, den, splits, s0, z0, m0, lengths, cu_seqlens)
    ctx.hyper = (momentum, step_size, eps, chunk)
    ctx.has_init = s0 is not None
    # outputs without a gradient (den, the split states, a final state nobody used) reach the
    # backward as None, not as zero tensors filled for it and read by the kernels
    ctx.set_materialize_grads(False)


def _backward(ctx, d_out, d_den, d_s, d_z, d_m, d_splits):
    return _gradients(chunk_momentum_attention_backward, ctx, d_out, d_s, d_z, d_m)


def _gradients(backward, ctx, d_out, d_s, d_z, d_m):
    """The op's input gradients through `backward` (the backward op, or chunk_backward itself)."""
    fq, fk, v, out, den, splits, s0, z0, m0, lengths, cu_seqlens = ctx.saved_tensors
    if d_out is None:
        d_out = torch.zeros_like(out)
    _, H, _, DK = fq.shape
    DV = v.shape[-1]
    S = _states(fq, v, cu_seqlens)
    final = (d_s, d_z, d_m)
    if all(g is None for g in final):
        final = (None, None, None)
    else:
        final = tuple(den.new_zeros(shape) if g is None else g.to(den.dtype).contiguous()
                      for g, shape in zip(final, ((S, H, DK, DV), (S, H, DK), (S, H, DK, DV))))
    dq, dk, dv, ds0, dz0, dm0 = backward(fq, fk, v, out, den, splits, d_out.contiguous(), s0, z0, m0, *final,
                                         lengths, cu_seqlens, *ctx.hyper)
    if not ctx.has_init:
        ds0 = dz0 = dm0 = None
    return dq, dk, dv, ds0, dz0, dm0, None, None, None, None, None, None


register_autograd(chunk_momentum_attention_forward, _backward, setup_context=_setup_context)


class _EagerChunk(torch.autograd.Function):
    """The op's forward and backward without the custom-op dispatch (its autograd, redispatch and
    argument defaults: the Triton entry's host time per forward+backward fell from 970 to 786 µs
    without it, docs/benchmarks.md): what eager calls run; torch.compile traces the registered
    op."""

    @staticmethod
    def forward(ctx, fq, fk, v, s0, z0, m0, lengths, cu_seqlens, momentum, step_size, eps, chunk):
        inputs = (fq, fk, v, s0, z0, m0, lengths, cu_seqlens, momentum, step_size, eps, chunk)
        output = chunk_forward(*inputs)
        _setup_context(ctx, inputs, output)
        ctx.mark_non_differentiable(output[1], output[5])
        return output

    @staticmethod
    def backward(ctx, d_out, d_den, d_s, d_z, d_m, d_splits):
        return _gradients(chunk_backward, ctx, d_out, d_s, d_z, d_m)


def chunk_momentum_attention_op(fq, fk, v, s0, z0, m0, lengths, cu_seqlens, momentum, step_size, eps, chunk):
    """(out, s, z, m): through the registered op under torch.compile (one graph node), else
    through the same forward and backward directly."""
    run = chunk_momentum_attention_forward if torch.compiler.is_compiling() else _EagerChunk.apply
    out, _den, s, z, m, _splits = run(fq, fk, v, s0, z0, m0, lengths, cu_seqlens, momentum, step_size, eps,
                                      chunk)
    return out, s, z, m


@custom_op(f"{NAMESPACE}::momentum_attention_step", mutates_args=())
def momentum_attention_step_forward(
    fq: Tensor, fk: Tensor, v: Tensor, s: Tensor, z: Tensor, m: Tensor, real: Tensor | None,
    momentum: float, step_size: float, eps: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(out, s, z, m) after one decoding step (eq. 12)."""
    return recurrent_step(fq, fk, v, s, z, m, real, momentum, step_size, eps)


@momentum_attention_step_forward.register_fake
def _(fq, fk, v, s, z, m, real, momentum, step_size, eps):
    return torch.empty_like(v), torch.empty_like(s), torch.empty_like(z), torch.empty_like(m)


def _step_setup_context(ctx, inputs, output):
    fq, fk, v, _s, _z, _m, real, momentum, step_size, eps = inputs
    ctx.save_for_backward(fq, fk, v, output[1], output[2], real)
    ctx.hyper = (momentum, step_size, eps)


def _step_backward(ctx, d_out, d_s, d_z, d_m):
    """Eq. 12's step differentiated (a handful of (B, H, Dk, Dv) ops, in the state dtype):
    out = φ(q)ᵀs₁/(φ(q)ᵀz₁ + eps), s₁ = s − γm₁, m₁ = βm − φ(k)vᵀ, z₁ = z + φ(k)."""
    fq, fk, v, s1, z1, real = ctx.saved_tensors
    beta, gamma, eps = ctx.hyper
    acc = s1.dtype
    q, k, x = fq.to(acc), fk.to(acc), v.to(acc)
    zeros = torch.zeros_like
    d_out = zeros(x) if d_out is None else d_out.to(acc)
    d_s = zeros(s1) if d_s is None else d_s
    d_z = zeros(z1) if d_z is None else d_z
    d_m = zeros(s1) if d_m is None else d_m
    den = (q * z1).sum(-1, keepdim=True) + eps
    out = (q[..., None, :] @ s1)[..., 0, :] / den
    d_num = d_out / den
    d_den = -(d_out * out).sum(-1, keepdim=True) / den
    dq = (s1 @ d_num[..., None])[..., 0] + d_den * z1
    ds_total = d_s + q[..., :, None] * d_num[..., None, :]
    dz_total = d_z + d_den * q
    dm_total = d_m - gamma * ds_total
    dk = -(dm_total @ x[..., None])[..., 0] + dz_total
    dv = -(k[..., None, :] @ dm_total)[..., 0, :]
    ds0, dz0, dm0 = ds_total, dz_total, beta * dm_total
    if real is not None:
        keep = real.view(fq.shape[:2]).bool()
        k2, k3 = keep[..., None], keep[..., None, None]
        dq, dk, dv = (torch.where(k2, g, zeros(g)) for g in (dq, dk, dv))
        ds0, dz0, dm0 = torch.where(k3, ds0, d_s), torch.where(k2, dz0, d_z), torch.where(k3, dm0, d_m)
    return (dq.to(fq.dtype), dk.to(fk.dtype), dv.to(v.dtype), ds0, dz0, dm0, None, None, None, None)


register_autograd(momentum_attention_step_forward, _step_backward, setup_context=_step_setup_context)


class _EagerStep(torch.autograd.Function):
    """The decoding step without the custom-op dispatch, as _EagerChunk (one per layer and token:
    the step op took 145 µs of host time per call on the H200's host, docs/benchmarks.md)."""

    @staticmethod
    def forward(ctx, fq, fk, v, s, z, m, real, momentum, step_size, eps):
        inputs = (fq, fk, v, s, z, m, real, momentum, step_size, eps)
        output = recurrent_step(*inputs)
        _step_setup_context(ctx, inputs, output)
        return output

    @staticmethod
    def backward(ctx, d_out, d_s, d_z, d_m):
        return _step_backward(ctx, d_out, d_s, d_z, d_m)


def momentum_attention_step_op(fq, fk, v, s, z, m, real, momentum, step_size, eps):
    """(out, s, z, m) after one decoding step: the registered op under torch.compile, else directly."""
    run = momentum_attention_step_forward if torch.compiler.is_compiling() else _EagerStep.apply
    return run(fq, fk, v, s, z, m, real, momentum, step_size, eps)

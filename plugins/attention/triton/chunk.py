"""Chunked causal momentum attention (Momentum Transformer, eq. 13) in Triton: the launchers of
the forward and backward kernels, on prepared inputs (`op` registers them as custom ops,
`entry_points` prepares the inputs).

Memory: the forward keeps q, k, v, the output and one float per position (the denominator); the
states entering each chunk (2·nchunks·Dk·Dv values, bf16 for bf16 inputs, fp32/fp64 otherwise)
exist only during a kernel pair and are recomputed in the backward, so nothing of size N·Dk·Dv is
ever stored. Launches run on the inputs' CUDA device."""
import torch
import triton

from . import chunk_kernels as K
from .utils import (
    accumulator_dtype,
    check_grid,
    chunk_block,
    chunk_state_dtype,
    coefficients,
    device_of,
    kernel_flags,
    tuning_buckets,
)


def _shapes(fq, v, chunk):
    B, H, N, DK = fq.shape
    DV = v.shape[-1]
    BT = chunk_block(chunk)
    return B, H, N, DK, DV, BT, triton.cdiv(N, BT)


def _state_grid(B, H, DK, DV):
    """State scans: one program per (Dk block, Dv block, batch·head)."""
    return lambda meta: (triton.cdiv(DK, meta["BK"]) * triton.cdiv(DV, meta["BV"]), B * H)


def _chunk_grid(tile, dim, NT, B, H):
    """Per-chunk kernels: one program per (block of `dim`, chunk, batch·head)."""
    return lambda meta: (triton.cdiv(dim, meta[tile]), NT, B * H)


def _meta(fq, momentum, lengths, BT, DK, DV):
    """The autotuned kernels' constants and tuning buckets."""
    B, H, N, _ = fq.shape
    return dict(DK=DK, DV=DV, BT=BT, MOMENTUM=momentum > 0.0, HAS_LEN=lengths is not None,
                **kernel_flags(fq.dtype), **tuning_buckets(N, B * H))


def states_entering_chunks(fk, v, s0, z0, m0, lengths, coef, meta, NT):
    """S, M' (in `chunk_state_dtype`) and Z (fp32/fp64) entering each chunk and the final state
    (s, z, m with m = −M', fp32/fp64)."""
    B, H, N, DK = fk.shape
    DV = v.shape[-1]
    acc = coef.dtype
    h_s = fk.new_empty(B * H, NT, DK, DV, dtype=chunk_state_dtype(fk.dtype))
    h_m = torch.empty_like(h_s) if meta["MOMENTUM"] else h_s
    h_z = fk.new_empty(B * H, NT, DK, dtype=acc)
    s = fk.new_empty(B, H, DK, DV, dtype=acc)
    m = fk.new_empty(B, H, DK, DV, dtype=acc)
    z = fk.new_empty(B, H, DK, dtype=acc)
    use_init = s0 is not None
    K.fwd_h[_state_grid(B, H, DK, DV)](fk, v, h_s, h_m, h_z, s0 if use_init else s, m0 if use_init else m,
                  z0 if use_init else z, s, m, z, lengths if lengths is not None else z, coef,
                  N, H, NT, USE_INIT=use_init, **meta)
    return h_s, h_m, h_z, s, z, m


def chunk_forward(fq, fk, v, s0, z0, m0, lengths, momentum: float, step_size: float, eps: float,
                  chunk: int):
    """out (input dtype), den (B, H, N) accumulator dtype, and the final s, z, m."""
    with device_of(fq):
        return _chunk_forward(fq, fk, v, s0, z0, m0, lengths, momentum, step_size, eps, chunk)


def _chunk_forward(fq, fk, v, s0, z0, m0, lengths, momentum, step_size, eps, chunk):
    B, H, N, DK, DV, BT, NT = _shapes(fq, v, chunk)
    check_grid(B * H, NT)
    coef = coefficients(momentum, step_size, eps, accumulator_dtype(fq.dtype), fq.device)
    meta = _meta(fq, momentum, lengths, BT, DK, DV)
    h_s, h_m, h_z, s, z, m = states_entering_chunks(fk, v, s0, z0, m0, lengths, coef, meta, NT)
    out = torch.empty_like(v)
    den = fq.new_empty(B, H, N, dtype=coef.dtype)
    K.fwd_o[_chunk_grid("BV", DV, NT, B, H)](fq, fk, v, h_s, h_m, h_z, out, den,
                                             lengths if lengths is not None else den, coef, N, H, NT, **meta)
    return out, den, s, z, m


def chunk_backward(fq, fk, v, out, den, do, s0, z0, m0, ds, dz, dm, lengths, momentum: float,
                   step_size: float, eps: float, chunk: int):
    """Gradients of fq, fk, v (input dtype) and of the initial s, z, m (accumulator dtype), given
    the output gradient do and the final state's gradients ds, dz, dm (None = 0)."""
    with device_of(fq):
        return _chunk_backward(fq, fk, v, out, den, do, s0, z0, m0, ds, dz, dm, lengths, momentum,
                               step_size, eps, chunk)


def _chunk_backward(fq, fk, v, out, den, do, s0, z0, m0, ds, dz, dm, lengths, momentum, step_size,
                    eps, chunk):
    B, H, N, DK, DV, BT, NT = _shapes(fq, v, chunk)
    coef = coefficients(momentum, step_size, eps, accumulator_dtype(fq.dtype), fq.device)
    meta = _meta(fq, momentum, lengths, BT, DK, DV)
    lens = lengths if lengths is not None else den
    h_s, h_m, h_z, _s, _z, _m = states_entering_chunks(fk, v, s0, z0, m0, lengths, coef, meta, NT)

    dden = torch.empty_like(den)
    K.bwd_prep[(NT, B * H)](out, do, den, dden, lens, N, H, DV=DV, BT=BT, BDV=triton.next_power_of_2(DV),
                            HAS_LEN=lengths is not None)

    acc = coef.dtype
    has_final = ds is not None
    dh_s = torch.empty_like(h_s)
    dh_m = torch.empty_like(h_m) if meta["MOMENTUM"] else dh_s
    dh_z = torch.empty_like(h_z)
    ds0 = fq.new_empty(B, H, DK, DV, dtype=acc)
    dm0 = fq.new_empty(B, H, DK, DV, dtype=acc)
    dz0 = fq.new_empty(B, H, DK, dtype=acc)
    K.bwd_dh[_state_grid(B, H, DK, DV)](fq, do, den, dden, dh_s, dh_m, dh_z, ds if has_final else ds0,
                                        dm if has_final else dm0, dz if has_final else dz0, ds0, dm0,
                                        dz0, lens, coef, N, H, NT, HAS_FINAL_GRAD=has_final, **meta)

    dv = torch.empty_like(v)
    K.bwd_dv[_chunk_grid("BV", DV, NT, B, H)](fq, fk, do, den, dh_s, dh_m, dv, lens, coef, N, H, NT,
                                              **meta)
    dq = torch.empty_like(fq)
    dk = torch.empty_like(fk)
    K.bwd_dqk[_chunk_grid("BK", DK, NT, B, H)](fq, fk, v, do, den, dden, h_s, h_m, h_z, dh_s, dh_m, dh_z,
                                               dq, dk, lens, coef, N, H, NT, **meta)
    return dq, dk, dv, ds0, dz0, dm0

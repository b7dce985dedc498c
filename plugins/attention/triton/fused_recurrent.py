"""One decoding step of causal momentum attention (Momentum Transformer, eq. 12) as one Triton
launch: the m, s, z updates and the normalised output together. `marked_step` also takes the raw
q, k, v of a built-in feature map: the finite parts, φ, the step and the NaN marks of
nonfinite.NonFiniteMarks in that one launch, where the PyTorch ops around the plain step launch
some 25 kernels per layer and token (the eager decode step is host bound on a GPU:
docs/benchmarks.md, 2026-11-27)."""

import torch
import triton
import triton.language as tl

from ...triton_launch import cdiv, described, direct, launch_plan
from .utils import block, check_grid, coefficients, device_of


@triton.jit
def _keeps(real, i_bh, HAS_REAL: tl.constexpr):
    if HAS_REAL:
        return tl.load(real + i_bh) != 0
    else:
        return True


@triton.jit
def _feature(x, PHI: tl.constexpr):
    """φ of a finite x (nonfinite.split_finite's finite part): 1 elu + 1, 2 relu, 3 identity."""
    if PHI == 1:
        return tl.where(x > 0, x + 1.0, tl.exp(x))
    elif PHI == 2:
        return tl.maximum(x, 0.0)
    else:
        return x


@triton.jit
def _mark(x):
    """0 where x is finite, NaN where it is not (x·0, as nonfinite.split_finite's marks)."""
    return x * 0.0


@triton.jit
def step_kernel(q, k, v, s, z, m, real, s_new, z_new, m_new, o, coef, FLAG_ROWS,
                DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                HAS_REAL: tl.constexpr, PHI: tl.constexpr):
    """Grid (cdiv(DV, BV), B·H), over one (batch, head) and a block of value columns, eq. 12:
    m ← βm − φ(k)vᵀ;  s ← s − γm;  z ← z + φ(k);  out = φ(q)ᵀs / (φ(q)ᵀz + eps),
    over the key rows in blocks of BK (so a large Dk does not spill): each block's rows are
    updated and stored, φ(q)ᵀs and φ(q)ᵀz accumulate over the blocks. z, shared by the value
    blocks, is written by the first. A row whose `real` flag (one per FLAG_ROWS rows) is False
    keeps its state and outputs 0.
    PHI = 0: q, k are φ(q), φ(k), finite. PHI > 0: q, k, v are raw (any float dtype), φ (`_feature`)
    applies to their finite parts, and the marks of nonfinite.NonFiniteMarks follow: a non-finite
    entry of k makes every entry of s, m, z NaN, one of v its column of s and m; the output gets
    NaN from any non-finite q or k entry, and in column j from v_j. Rows that are not real take no
    marks (their inputs count as 0, as attend.mask_keys makes them)."""
    i_v = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    ACC: tl.constexpr = coef.dtype.element_ty
    beta = tl.load(coef + 4)
    gamma = tl.load(coef + 2)
    eps = tl.load(coef + 3)
    keep = _keeps(real, i_bh // FLAG_ROWS, HAS_REAL)
    o_v = i_v * BV + tl.arange(0, BV)
    mv = o_v < DV
    vv = tl.load(v + i_bh * DV + o_v, mask=mv, other=0.0).to(ACC)
    if PHI > 0:
        key_mark = tl.zeros([BK], dtype=ACC)
        query_mark = tl.zeros([BK], dtype=ACC)
        for i_k in range(tl.cdiv(DK, BK)):
            o_k = i_k * BK + tl.arange(0, BK)
            mk = o_k < DK
            key_mark += _mark(tl.load(k + i_bh * DK + o_k, mask=mk, other=0.0).to(ACC))
            query_mark += _mark(tl.load(q + i_bh * DK + o_k, mask=mk, other=0.0).to(ACC))
        key_total = tl.sum(key_mark, axis=0)
        state_mark = key_total + _mark(vv)
        out_mark = tl.sum(query_mark, axis=0) + state_mark
        if HAS_REAL:
            state_mark = tl.where(keep, state_mark, 0.0)
            out_mark = tl.where(keep, out_mark, 0.0)
        vv = tl.where(_mark(vv) == 0.0, vv, 0.0)                 # the finite part
    num = tl.zeros([BV], dtype=ACC)
    qz = tl.zeros([BK], dtype=ACC)
    for i_k in range(tl.cdiv(DK, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        mk = o_k < DK
        off = i_bh * DK * DV + o_k[:, None] * DV + o_v[None, :]
        mask = mk[:, None] & mv[None, :]
        qq = tl.load(q + i_bh * DK + o_k, mask=mk, other=0.0).to(ACC)
        kk = tl.load(k + i_bh * DK + o_k, mask=mk, other=0.0).to(ACC)
        if PHI > 0:
            # lanes past DK stay 0: elu + 1 maps their 0 to 1, which would enter z, s and the output
            qq = tl.where(mk, _feature(tl.where(_mark(qq) == 0.0, qq, 0.0), PHI), 0.0)
            kk = tl.where(mk, _feature(tl.where(_mark(kk) == 0.0, kk, 0.0), PHI), 0.0)
        mm = tl.load(m + off, mask=mask, other=0.0)
        ss = tl.load(s + off, mask=mask, other=0.0)
        zz = tl.load(z + i_bh * DK + o_k, mask=mk, other=0.0)
        m1 = beta * mm - kk[:, None] * vv[None, :]
        s1 = ss - gamma * m1
        z1 = zz + kk
        num += tl.sum(qq[:, None] * s1, axis=0)
        qz += qq * z1
        if PHI > 0:
            m1 += state_mark[None, :]
            s1 += state_mark[None, :]
            z1 += key_total
        if HAS_REAL:
            m1 = tl.where(keep, m1, mm)
            s1 = tl.where(keep, s1, ss)
            z1 = tl.where(keep, z1, zz)
        tl.store(m_new + off, m1, mask=mask)
        tl.store(s_new + off, s1, mask=mask)
        if i_v == 0:
            tl.store(z_new + i_bh * DK + o_k, z1, mask=mk)
    out = num / (tl.sum(qz, axis=0) + eps)
    if HAS_REAL:
        out = tl.where(keep, out, 0.0)
    if PHI > 0:
        out += out_mark
    tl.store(o + i_bh * DV + o_v, out.to(o.dtype.element_ty), mask=mv)


def recurrent_step(fq, fk, v, s, z, m, real, momentum: float, step_size: float, eps: float):
    """Launch the step on contiguous (B, H, Dk) / (B, H, Dv) inputs and fp32/fp64 states;
    `real` (B·H,) int8 or None. Returns (out, s, z, m), new tensors."""
    return _launch(fq, fk, v, s, z, m, real, 1, 0, momentum, step_size, eps)


def marked_step(q, k, v, s, z, m, real, phi: int, momentum: float, step_size: float, eps: float):
    """`step_kernel` with PHI = phi (1 elu + 1, 2 relu, 3 identity) on raw contiguous q, k
    (B, H, Dk), v (B, H, Dv) of one float dtype and contiguous fp32/fp64 states; `real` (B,) int8
    or None. Returns (out in v's dtype, s, z, m), new tensors. No autograd: for steps that need no
    gradient (attend.attend_step decides)."""
    return _launch(q, k, v, s, z, m, real, q.shape[1], phi, momentum, step_size, eps)


def _launch(q, k, v, s, z, m, real, flag_rows: int, phi: int, momentum: float, step_size: float, eps: float):
    B, H, DK = q.shape
    DV = v.shape[-1]
    check_grid(B * H)
    coef = coefficients(momentum, step_size, eps, s.dtype, s.device)
    s_new, m_new, z_new = torch.empty_like(s), torch.empty_like(m), torch.empty_like(z)
    out = torch.empty_like(v)
    # a program holds a few (BK, BV) fp32 tiles in registers: at most 64 × 64 each, whatever Dk
    BK, BV = block(DK), block(DV)
    # one launch a layer and token: planned, its key and grid are computed once per signature (the
    # shapes fix the constants and the grid; the buffers made here are aligned)
    with device_of(q), launch_plan(described(q, k, v, s, z, m, real, coef) + (flag_rows, phi)):
        direct(step_kernel)[(cdiv(DV, BV), B * H)](
            q, k, v, s, z, m, real if real is not None else z, s_new, z_new, m_new, out, coef, flag_rows,
            DK=DK, DV=DV, BK=BK, BV=BV, HAS_REAL=real is not None, PHI=phi)
    return out, s_new, z_new, m_new

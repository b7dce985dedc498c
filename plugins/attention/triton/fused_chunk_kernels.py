"""Fused Triton kernels of chunked causal momentum attention (Momentum Transformer, eq. 13 ≡
eq. 12), after flash-linear-attention's fused_chunk kernels: a program walks its chunks in order
holding the states S, M', Z in registers, so that no per-chunk state reaches memory (chunk_kernels
stores them between a scan and the per-chunk kernels). The chunk algebra, the weights W, carry,
w_s, w_m and the masks are chunk_kernels' (its docstring has the equations):
  `fused_fwd`      outputs and denominators chunk after chunk, then the chunk's update of S, M', Z;
  `fused_bwd_dkv`  backwards over the chunks: dK, dV from the gradients leaving each chunk, then
                   the update of dS, dM', dZ (and dden = −(dO·out)/den, unless a scan stored it);
  `fused_bwd_dq`   forwards again: dQ from the states entering each chunk.
A program holds whole (Dk, Dv) states, so the head dimensions are at most 64 (`fits`).

Splits (split.scan_splits): program g of a row's G splits starts from the state entering its
split, chained in-kernel (`_chain`, eq. 12 composed as split.merge_splits) from the initial state
(or the final state's gradient) over the other splits' states scanned from zero (chunk_kernels'
fwd_h / bwd_dh with STORE_H off), so no merge launch runs; the last split's program stores the
final state, the first's the initial state's gradient. G = 1: one program per row, no chaining.
Positions past a padded row's length get zero outputs and gradients (den 1), as in chunk_kernels."""
import os

import torch
import triton
import triton.language as tl

from .chunk_kernels import (
    TUNING_KEY,
    UNSPECIALISED,
    _end_weights,
    _intra_weights,
    _load_coef,
    _sequence,
    _state_tiles,
)
from .split import add_split
from .utils import finite, mixed_dot, raw_dot

MAX_HEAD_DIM = 64
# Chunks of at most 32 tokens: a program holds whole (Dk, Dv) states beside its chunk's tiles. On
# sm_90 (ptxas -v, bf16, D 64, momentum, 8 warps) chunks of 64 spill 112 / 608 / 24 bytes in
# fused_fwd / fused_bwd_dkv / fused_bwd_dq; chunks of 32 spill 0 / 96 / 0 (docs/kernel_resources.md).
MAX_CHUNK = 32


def fits(DK: int, DV: int) -> bool:
    """Whether the fused kernels take these head dimensions: two (or, backwards, four with the
    per-chunk tiles) whole fp32 states per program fit the registers up to 64 × 64."""
    return DK <= MAX_HEAD_DIM and DV <= MAX_HEAD_DIM


def fused_chunk_size(chunk_size: int) -> int:
    """The chunk the fused kernels run for a requested chunk_size (eq. 13 is exact for any chunk)."""
    return min(chunk_size, MAX_CHUNK)


def fused_configs(tile_v: bool) -> list:
    """8 warps, and for `fused_fwd` (tile_v) also a Dv block of half the head (SPLIT_V: twice the
    programs, each re-reading q and k) with 8 or 4 warps, each at 1 and PIPELINE_STAGES stages, of
    which `prune_fused` keeps one; one config under the interpreter. Without SPLIT_V, 4 warps spill
    on sm_90 (ptxas -v, bf16, chunks of 32, D 64, pipelined, pointers aligned as launched): 12 B in
    fused_fwd and 108 B in fused_bwd_dkv (docs/kernel_resources.md)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return [triton.Config({"SPLIT_V": False}, num_warps=4)]
    kept = ((False, 8), (True, 8), (True, 4)) if tile_v else ((False, 8),)
    return [triton.Config({"SPLIT_V": split_v}, num_warps=w, num_stages=stages)
            for split_v, w in kept for stages in (1, PIPELINE_STAGES)]


# A program walks its chunks in order. Unpipelined, each chunk's loads wait in line before its
# arithmetic, at one program per SM with nothing else to run. With 2 stages Triton's software pipeline
# copies the next chunk's tiles into shared memory while this one computes. On sm_90 (ptxas -v,
# Triton 3.6 and 3.9, bf16 and fp16, D 64, chunks of 32) that spills nothing. Exact fp32 would spill
# kilobytes, so it keeps 1 stage (docs/kernel_resources.md).
PIPELINE_STAGES = 2


def prune_fused(configs, named_args, **kwargs) -> list:
    """A Dv block of half the head only where the head has more than 32 values; PIPELINE_STAGES
    for 16-bit inputs (the kernel's first tensor argument), 1 for fp32."""
    kept = [c for c in configs if not c.kwargs["SPLIT_V"] or kwargs["BV"] > 32]
    if os.environ.get("TRITON_INTERPRET") == "1":
        return kept
    first = next(iter(named_args.values()))
    stages = 1 if first.dtype == torch.float32 else PIPELINE_STAGES
    return [c for c in kept if c.num_stages == stages]


def autotuned(tile_v: bool):
    return triton.autotune(configs=fused_configs(tile_v), key=TUNING_KEY,
                           prune_configs_by={"early_config_prune": prune_fused})


@triton.jit
def _end(L, N, IS_VARLEN: tl.constexpr):
    """Stores are masked to positions < end: a segment's own (L), or a padded row's N (zeros past L)."""
    if IS_VARLEN:
        return L
    else:
        return N


@triton.jit
def _padding_chunks(L, c0, CPS, NT, BT: tl.constexpr):
    """(first, stop) of split c0's chunks (of CPS, NT per padded row) past the row's L real tokens:
    the chunks whose outputs a padded row's program fills with zeros."""
    return tl.maximum(c0, tl.cdiv(L, BT)), tl.minimum(c0 + CPS, NT)


@triton.jit
def _chain(S, M, Z, s_loc, m_loc, z_loc, r, g, G, L, CPS, state_off, state_mask, o_k, mk, log_beta, inv,
           gamma, beta, DK: tl.constexpr, DV: tl.constexpr, BT: tl.constexpr, MOMENTUM: tl.constexpr,
           REVERSE: tl.constexpr):
    """S, M', Z carried into split g of row r (REVERSE: the gradients carried back into the end of
    split g) across the other splits, each span of ℓ real tokens composed with the split's state
    from zero (s/m/z_loc at r·G + split, public sign m = −M'), eq. 12 composed:
      forward  S ← S + carry(ℓ)·M' + ΔS,   M' ← β^ℓ·M' + ΔM',   Z ← Z + ΔZ   over splits 0 … g−1;
      REVERSE  dM' ← β^ℓ·dM' + carry(ℓ)·dS + ΔdM',   dS ← dS + ΔdS,   dZ ← dZ + ΔdZ   over G−1 … g+1
    (split.add_split, as split.merge_splits chains them)."""
    if REVERSE:
        n = G - 1 - g
    else:
        n = g
    for i in range(n):
        if REVERSE:
            h = G - 1 - i
        else:
            h = i
        S, M, Z = add_split(S, M, Z, s_loc, m_loc, z_loc, r * G + h, L - h * CPS * BT, CPS * BT, state_off,
                            state_mask, o_k, mk, log_beta, inv, gamma, beta, DK, DV, MOMENTUM, REVERSE)
    return S, M, Z


@triton.jit
def _state_update(S, M, Z, kk, vv, rows, Lc, log_beta, inv, gamma, beta, MOMENTUM: tl.constexpr,
                  LOW: tl.constexpr, IEEE: tl.constexpr):
    """S, M', Z after a chunk of Lc real tokens (keys kk, values vv), as chunk_kernels.fwd_h."""
    ACC: tl.constexpr = log_beta.dtype
    w_s, w_m, carry_end, decay = _end_weights(rows, Lc, log_beta, inv, gamma, beta, MOMENTUM)
    kt = tl.trans(kk.to(ACC))
    S += mixed_dot(kt * w_s[None, :], vv, LOW, IEEE)
    if MOMENTUM:
        S += carry_end * M
        M = decay * M + mixed_dot(kt * w_m[None, :], vv, LOW, IEEE)
    Z += tl.sum(kk.to(ACC), axis=0)
    return S, M, Z


@triton.jit
def _start(s0, m0, z0, s_loc, m_loc, z_loc, i_nh, g, G, L, CPS, state_off, state_mask, o_k, mk, log_beta,
           inv, gamma, beta, BK: tl.constexpr, BV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
           BT: tl.constexpr, MOMENTUM: tl.constexpr, USE_INIT: tl.constexpr, REVERSE: tl.constexpr):
    """The states (REVERSE: their gradients) a program starts from: s0/m0/z0 of sequence i_nh (the
    initial state, or the final state's gradient) if USE_INIT, else zero, chained to its split."""
    ACC: tl.constexpr = log_beta.dtype
    S = tl.zeros([BK, BV], dtype=ACC)
    M = tl.zeros([BK, BV], dtype=ACC)
    Z = tl.zeros([BK], dtype=ACC)
    if USE_INIT:
        at = i_nh.to(tl.int64) * DK * DV + state_off
        S += tl.load(s0 + at, mask=state_mask, other=0.0).to(ACC)
        if MOMENTUM:
            M -= tl.load(m0 + at, mask=state_mask, other=0.0).to(ACC)
        Z += tl.load(z0 + i_nh.to(tl.int64) * DK + o_k, mask=mk, other=0.0).to(ACC)
    return _chain(S, M, Z, s_loc, m_loc, z_loc, i_nh.to(tl.int64), g, G, L, CPS, state_off, state_mask, o_k,
                  mk, log_beta, inv, gamma, beta, DK, DV, BT, MOMENTUM, REVERSE)


@triton.jit
def _store_state(s, m, z, i_nh, S, M, Z, state_off, state_mask, o_k, mk, DK: tl.constexpr, DV: tl.constexpr,
                 FIRST_V: tl.constexpr):
    """S, m = −M' and (by the first Dv block) Z of sequence i_nh into s, m, z."""
    at = i_nh.to(tl.int64) * DK * DV + state_off
    tl.store(s + at, S, mask=state_mask)
    tl.store(m + at, -M, mask=state_mask)
    if FIRST_V:
        tl.store(z + i_nh.to(tl.int64) * DK + o_k, Z, mask=mk)


@autotuned(tile_v=True)
@triton.jit(do_not_specialize=UNSPECIALISED)
def fused_fwd(q, k, v, o, den, s0, m0, z0, s_loc, m_loc, z_loc, s_out, m_out, z_out, lengths, cu_seqlens,
              coef,
              N, H, NT, CPS, G, N_BUCKET, BH_BUCKET,
              DK: tl.constexpr, DV: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
              SPLIT_V: tl.constexpr, MOMENTUM: tl.constexpr, HAS_LEN: tl.constexpr, IS_VARLEN: tl.constexpr,
              USE_INIT: tl.constexpr, LOW: tl.constexpr, IEEE: tl.constexpr):
    """Grid (cdiv(DV, TV), rows·G), TV = BV or BV/2 (SPLIT_V), BK ≥ DK: split g of a row (or
    segment) and a Dv block, its outputs o and den (B·H, N) = φ(q)ᵀz + eps (1 at padded positions,
    stored by the first Dv block) chunk after chunk, as chunk_kernels.fwd_o computes them from the
    states entering each chunk; the last split stores the final state in s/m/z_out. A key or value
    that is not finite is cut out of its chunk's matmuls (fwd_o's rule) and makes the states that
    follow it not finite."""
    TV: tl.constexpr = BV // 2 if SPLIT_V else BV
    i_v = tl.program_id(0)
    i_nh = tl.program_id(1) // G
    i_g = tl.program_id(1) % G
    row, bos, L = _sequence(i_nh, H, N, lengths, cu_seqlens, HAS_LEN, IS_VARLEN)
    r = row.to(tl.int64)            # whole-tensor offsets in int64; offsets within a row stay int32
    q += r * N * DK + bos * DK
    k += r * N * DK + bos * DK
    v += r * N * DV + bos * DV
    o += r * N * DV + bos * DV
    den += r * N + bos
    log_beta, inv, gamma, eps, beta = _load_coef(coef)
    ACC: tl.constexpr = coef.dtype.element_ty

    rows = tl.arange(0, BT)
    o_k, o_v, mk, mv, state_off, state_mask = _state_tiles(0, i_v, BK, TV, DK, DV)
    S, M, Z = _start(s0, m0, z0, s_loc, m_loc, z_loc, i_nh, i_g, G, L, CPS, state_off, state_mask, o_k, mk,
                     log_beta, inv, gamma, beta, BK, TV, DK, DV, BT, MOMENTUM, USE_INIT, False)
    end = _end(L, N, IS_VARLEN)

    c0 = i_g * CPS
    for c in range(c0, tl.minimum(c0 + CPS, tl.cdiv(L, BT))):
        Lc = tl.minimum(L - c * BT, BT)
        t = c * BT + rows
        real = rows < Lc
        W, carry, causal = _intra_weights(rows, log_beta, inv, gamma, beta, MOMENTUM)
        qq = tl.load(q + t[:, None] * DK + o_k[None, :], mask=real[:, None] & mk[None, :], other=0.0)
        kk = tl.load(k + t[:, None] * DK + o_k[None, :], mask=real[:, None] & mk[None, :], other=0.0)
        vv = tl.load(v + t[:, None] * DV + o_v[None, :], mask=real[:, None] & mv[None, :], other=0.0)
        bad = tl.maximum(tl.max(tl.where(finite(kk), 0, 1), axis=1),
                         tl.max(tl.where(finite(vv), 0, 1), axis=1))
        first_bad = tl.min(tl.where(bad > 0, rows, BT), axis=0)
        before_bad = rows < first_bad
        A = raw_dot(qq, tl.trans(kk), IEEE)
        keep = causal & before_bad[None, :]
        num = mixed_dot(qq, S, LOW, IEEE) + mixed_dot(tl.where(keep, A * W, 0.0),
                                                      tl.where(before_bad[:, None], vv, 0.0), LOW, IEEE)
        if MOMENTUM:
            num += carry[:, None] * mixed_dot(qq, M, LOW, IEEE)
        dn = tl.sum(qq.to(ACC) * Z[None, :], axis=1) + tl.sum(tl.where(keep, A, 0.0), axis=1) + eps
        out = tl.where(before_bad[:, None], num / dn[:, None], float("nan"))
        out = tl.where(real[:, None], out, 0.0)
        tl.store(o + t[:, None] * DV + o_v[None, :], out.to(o.dtype.element_ty),
                 mask=(t < end)[:, None] & mv[None, :])
        if i_v == 0:
            tl.store(den + t, tl.where(real, dn, 1.0), mask=t < end)
        S, M, Z = _state_update(S, M, Z, kk, vv, rows, Lc, log_beta, inv, gamma, beta, MOMENTUM, LOW, IEEE)
    if not IS_VARLEN:
        first, stop = _padding_chunks(L, c0, CPS, NT, BT)
        for c in range(first, stop):
            t = c * BT + rows
            tl.store(o + t[:, None] * DV + o_v[None, :], tl.zeros([BT, TV], dtype=o.dtype.element_ty),
                     mask=(t < N)[:, None] & mv[None, :])
            if i_v == 0:
                tl.store(den + t, tl.full([BT], 1.0, dtype=ACC), mask=t < N)
    if i_g == G - 1:
        _store_state(s_out, m_out, z_out, i_nh, S, M, Z, state_off, state_mask, o_k, mk, DK, DV, i_v == 0)


@triton.jit
def _zero_rows(ptr, t, width, N, BT: tl.constexpr, BW: tl.constexpr):
    o_w = tl.arange(0, BW)
    tl.store(ptr + t[:, None] * width + o_w[None, :], tl.zeros([BT, BW], dtype=ptr.dtype.element_ty),
             mask=(t < N)[:, None] & (o_w < width)[None, :])


@autotuned(tile_v=False)
@triton.jit(do_not_specialize=UNSPECIALISED)
def fused_bwd_dkv(q, k, v, o, do, den, dden, dk, dv, ds_fin, dm_fin, dz_fin, ds0, dm0, dz0, ds_loc, dm_loc,
                  dz_loc, lengths, cu_seqlens, coef, N, H, NT, CPS, G, N_BUCKET, BH_BUCKET,
                  DK: tl.constexpr, DV: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                  SPLIT_V: tl.constexpr, MOMENTUM: tl.constexpr, HAS_LEN: tl.constexpr,
                  IS_VARLEN: tl.constexpr, HAS_FINAL_GRAD: tl.constexpr, DDEN_READY: tl.constexpr,
                  LOW: tl.constexpr, IEEE: tl.constexpr):
    """Grid (rows·G,), BK ≥ DK, BV ≥ DV: backwards over split g's chunks, with dNum = dO/den and
    dA = (dNum Vᵀ)⊙W + dden·1ᵀ on j ≤ a (chunk_kernels.bwd_dv and bwd_dqk),
      dV = (A⊙W)ᵀ dNum + diag(w_s) K dS_out + diag(w_m) K dM'_out,
      dK = dAᵀ Q + diag(w_s) V dS_outᵀ + diag(w_m) V dM'_outᵀ + 1 dZ_outᵀ,
    then the gradients entering the chunk (chunk_kernels.bwd_dh). dden: read where a split scan
    stored it (DDEN_READY), else computed here from o and dO and stored for fused_bwd_dq. The first
    split stores the initial state's gradient in ds0/dm0/dz0."""
    i_nh = tl.program_id(0) // G
    i_g = tl.program_id(0) % G
    row, bos, L = _sequence(i_nh, H, N, lengths, cu_seqlens, HAS_LEN, IS_VARLEN)
    r = row.to(tl.int64)            # whole-tensor offsets in int64; offsets within a row stay int32
    q += r * N * DK + bos * DK
    k += r * N * DK + bos * DK
    dk += r * N * DK + bos * DK
    v += r * N * DV + bos * DV
    o += r * N * DV + bos * DV
    do += r * N * DV + bos * DV
    dv += r * N * DV + bos * DV
    den += r * N + bos
    dden += r * N + bos
    log_beta, inv, gamma, _eps, beta = _load_coef(coef)
    ACC: tl.constexpr = coef.dtype.element_ty

    rows = tl.arange(0, BT)
    o_k, o_v, mk, mv, state_off, state_mask = _state_tiles(0, 0, BK, BV, DK, DV)
    end = _end(L, N, IS_VARLEN)
    dS, dM, dZ = _start(ds_fin, dm_fin, dz_fin, ds_loc, dm_loc, dz_loc, i_nh, i_g, G, L, CPS, state_off,
                        state_mask, o_k, mk, log_beta, inv, gamma, beta, BK, BV, DK, DV, BT, MOMENTUM,
                        HAS_FINAL_GRAD, True)

    c0 = i_g * CPS
    c1 = tl.minimum(c0 + CPS, tl.cdiv(L, BT))
    for i in range(c1 - c0):
        c = c1 - 1 - i
        Lc = tl.minimum(L - c * BT, BT)
        t = c * BT + rows
        real = rows < Lc
        W, carry, causal = _intra_weights(rows, log_beta, inv, gamma, beta, MOMENTUM)
        mask_k = real[:, None] & mk[None, :]
        mask_v = real[:, None] & mv[None, :]
        qq = tl.load(q + t[:, None] * DK + o_k[None, :], mask=mask_k, other=0.0)
        kk = tl.load(k + t[:, None] * DK + o_k[None, :], mask=mask_k, other=0.0)
        vv = tl.load(v + t[:, None] * DV + o_v[None, :], mask=mask_v, other=0.0)
        dd = tl.load(do + t[:, None] * DV + o_v[None, :], mask=mask_v, other=0.0).to(ACC)
        dn = tl.load(den + t, mask=real, other=1.0)
        if DDEN_READY:
            ddn = tl.load(dden + t, mask=real, other=0.0)
        else:
            oo = tl.load(o + t[:, None] * DV + o_v[None, :], mask=mask_v, other=0.0).to(ACC)
            ddn = -tl.sum(oo * dd, axis=1) / dn
            tl.store(dden + t, ddn, mask=real)
        dnum = dd / dn[:, None]
        w_s, w_m, carry_end, decay = _end_weights(rows, Lc, log_beta, inv, gamma, beta, MOMENTUM)
        A = raw_dot(qq, tl.trans(kk), IEEE)
        kf = kk.to(ACC)
        vf = vv.to(ACC)
        dv_acc = mixed_dot(tl.trans(tl.where(causal, A * W, 0.0)), dnum, LOW, IEEE)
        dv_acc += mixed_dot(kf * w_s[:, None], dS, LOW, IEEE)
        dA = tl.where(causal, mixed_dot(dnum, tl.trans(vv), LOW, IEEE) * W + ddn[:, None], 0.0)
        dk_acc = mixed_dot(tl.trans(dA), qq, LOW, IEEE)
        dk_acc += mixed_dot(vf * w_s[:, None], tl.trans(dS), LOW, IEEE)
        if MOMENTUM:
            dv_acc += mixed_dot(kf * w_m[:, None], dM, LOW, IEEE)
            dk_acc += mixed_dot(vf * w_m[:, None], tl.trans(dM), LOW, IEEE)
        dk_acc += dZ[None, :]
        tl.store(dv + t[:, None] * DV + o_v[None, :],
                 tl.where(real[:, None], dv_acc, 0.0).to(dv.dtype.element_ty),
                 mask=(t < end)[:, None] & mv[None, :])
        tl.store(dk + t[:, None] * DK + o_k[None, :],
                 tl.where(real[:, None], dk_acc, 0.0).to(dk.dtype.element_ty),
                 mask=(t < end)[:, None] & mk[None, :])
        qt = tl.trans(qq.to(ACC))
        if MOMENTUM:
            dM = decay * dM + carry_end * dS + mixed_dot(qt, dnum * carry[:, None], LOW, IEEE)
        dS += mixed_dot(qt, dnum, LOW, IEEE)
        dZ += tl.sum(qt * ddn[None, :], axis=1)
    if not IS_VARLEN:
        first, stop = _padding_chunks(L, c0, CPS, NT, BT)
        for c in range(first, stop):
            t = c * BT + rows
            _zero_rows(dk, t, DK, N, BT, BK)
            _zero_rows(dv, t, DV, N, BT, BV)
    if i_g == 0:
        _store_state(ds0, dm0, dz0, i_nh, dS, dM, dZ, state_off, state_mask, o_k, mk, DK, DV, True)


@autotuned(tile_v=False)
@triton.jit(do_not_specialize=UNSPECIALISED)
def fused_bwd_dq(k, v, do, den, dden, dq, s0, m0, z0, s_loc, m_loc, z_loc, lengths, cu_seqlens, coef,
                 N, H, NT, CPS, G, N_BUCKET, BH_BUCKET,
                 DK: tl.constexpr, DV: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                 SPLIT_V: tl.constexpr, MOMENTUM: tl.constexpr, HAS_LEN: tl.constexpr,
                 IS_VARLEN: tl.constexpr, USE_INIT: tl.constexpr, LOW: tl.constexpr, IEEE: tl.constexpr):
    """Grid (rows·G,), BK ≥ DK, BV ≥ DV: forwards over split g's chunks from the state entering it,
    dQ = dA K + dNum Sᵀ + diag(carry) dNum M'ᵀ + dden Zᵀ (chunk_kernels.bwd_dqk), then the chunk's
    update of S, M', Z; q is not read."""
    i_nh = tl.program_id(0) // G
    i_g = tl.program_id(0) % G
    row, bos, L = _sequence(i_nh, H, N, lengths, cu_seqlens, HAS_LEN, IS_VARLEN)
    r = row.to(tl.int64)            # whole-tensor offsets in int64; offsets within a row stay int32
    k += r * N * DK + bos * DK
    dq += r * N * DK + bos * DK
    v += r * N * DV + bos * DV
    do += r * N * DV + bos * DV
    den += r * N + bos
    dden += r * N + bos
    log_beta, inv, gamma, _eps, beta = _load_coef(coef)
    ACC: tl.constexpr = coef.dtype.element_ty

    rows = tl.arange(0, BT)
    o_k, o_v, mk, mv, state_off, state_mask = _state_tiles(0, 0, BK, BV, DK, DV)
    end = _end(L, N, IS_VARLEN)
    S, M, Z = _start(s0, m0, z0, s_loc, m_loc, z_loc, i_nh, i_g, G, L, CPS, state_off, state_mask, o_k, mk,
                     log_beta, inv, gamma, beta, BK, BV, DK, DV, BT, MOMENTUM, USE_INIT, False)

    c0 = i_g * CPS
    for c in range(c0, tl.minimum(c0 + CPS, tl.cdiv(L, BT))):
        Lc = tl.minimum(L - c * BT, BT)
        t = c * BT + rows
        real = rows < Lc
        W, carry, causal = _intra_weights(rows, log_beta, inv, gamma, beta, MOMENTUM)
        mask_k = real[:, None] & mk[None, :]
        mask_v = real[:, None] & mv[None, :]
        kk = tl.load(k + t[:, None] * DK + o_k[None, :], mask=mask_k, other=0.0)
        vv = tl.load(v + t[:, None] * DV + o_v[None, :], mask=mask_v, other=0.0)
        dd = tl.load(do + t[:, None] * DV + o_v[None, :], mask=mask_v, other=0.0)
        dn = tl.load(den + t, mask=real, other=1.0)
        ddn = tl.load(dden + t, mask=real, other=0.0)
        dnum = dd.to(ACC) / dn[:, None]
        dA = tl.where(causal, mixed_dot(dnum, tl.trans(vv), LOW, IEEE) * W + ddn[:, None], 0.0)
        dq_acc = mixed_dot(dA, kk, LOW, IEEE) + mixed_dot(dnum, tl.trans(S), LOW, IEEE)
        dq_acc += ddn[:, None] * Z[None, :]
        if MOMENTUM:
            dq_acc += carry[:, None] * mixed_dot(dnum, tl.trans(M), LOW, IEEE)
        tl.store(dq + t[:, None] * DK + o_k[None, :],
                 tl.where(real[:, None], dq_acc, 0.0).to(dq.dtype.element_ty),
                 mask=(t < end)[:, None] & mk[None, :])
        S, M, Z = _state_update(S, M, Z, kk, vv, rows, Lc, log_beta, inv, gamma, beta, MOMENTUM, LOW, IEEE)
    if not IS_VARLEN:
        first, stop = _padding_chunks(L, c0, CPS, NT, BT)
        for c in range(first, stop):
            _zero_rows(dq, c * BT + rows, DK, N, BT, BK)

"""Triton kernels of chunked causal momentum attention (Momentum Transformer, eq. 13 ≡ eq. 12).

Per (batch, head) and chunk of BT positions (local index a, key index j), with m' = −m:
  s_a  = S + carry[a]·M' + Σ_{j≤a} W[a, j] φ(k_j)v_jᵀ,   W[a, j] = γ(1 − β^(a−j+1))/(1 − β),
  carry[a] = γβ(1 − β^(a+1))/(1 − β),   out_a = φ(q_a)ᵀs_a / (φ(q_a)ᵀ(Z + Σ_{j≤a} φ(k_j)) + eps),
and over a chunk of Lc real tokens the carried states move as
  M' ← β^Lc M' + Σ_j β^(Lc−1−j) φ(k_j)v_jᵀ,   S ← S + carry[Lc−1]·M' + Σ_j W[Lc−1, j] φ(k_j)v_jᵀ,
  Z ← Z + Σ_j φ(k_j).
Kernels (after flash-linear-attention's chunk_h / chunk_o split): `fwd_h` scans the states across
chunks and stores the ones entering each chunk; `fwd_o` computes every chunk's outputs in
parallel; `bwd_dh` scans the state gradients backwards (and gives the denominators' gradients on
the way); `bwd_dv` / `bwd_dqk` give the input gradients per chunk. Scanned in splits
(triton/split.py), the stored states start from each split's edge, and the per-chunk kernels add
the merged edge state (SPLIT). Chunks past a row's length do no work; positions past it are masked loads.
With MOMENTUM = False (β = 0) only S is carried.

Packed sequences (IS_VARLEN, after fla's varlen kernels): one row (B = 1) holding n segments,
segment s the tokens [cu_seqlens[s], cu_seqlens[s+1]), each its own sequence. Every chunk belongs
to one segment (the last chunk of a segment is partial, Lc < BT, as a padded row's last chunk);
the scans run one program per (segment, head) over that segment's chunks, from its own initial
state, and store the states entering its chunks from chunk_offsets[s] on; the per-chunk kernels
run over all segments' chunks, chunk_indices[i] = (segment, chunk within it), or (−1, ·) for the
spare programs of a grid sized without a host sync (see chunk.varlen_tables), which do nothing.
Stores are masked to the segment, so a chunk never writes the next segment's positions.
"""
import triton
import triton.language as tl

from .utils import (
    CHUNK_PRUNERS,
    carried,
    compose,
    finite,
    geometric,
    mixed_dot,
    prune_scan,
    raw_dot,
    tuning_configs,
)

# The autotuner also keys on every tensor argument's dtype. N_BUCKET and BH_BUCKET (utils.tuning_buckets)
# are plain int arguments the kernels do not read: a new bucket re-times the kept configs but,
# being unspecialised like N and NT, compiles nothing new.
TUNING_KEY = ["DK", "DV", "BT", "MOMENTUM", "IS_VARLEN", "LOW", "IEEE", "N_BUCKET", "BH_BUCKET"]
UNSPECIALISED = ["N", "NT", "N_BUCKET", "BH_BUCKET", "CPS", "G"]


def autotuned(prune):
    """Autotuned over the configs that `prune` (utils.prune_scan, utils.CHUNK_PRUNERS) keeps."""
    return triton.autotune(configs=tuning_configs(), key=TUNING_KEY,
                           prune_configs_by={"early_config_prune": prune})


@triton.jit
def _load_coef(coef):
    return (tl.load(coef + 0), tl.load(coef + 1), tl.load(coef + 2), tl.load(coef + 3),
            tl.load(coef + 4))


@triton.jit
def _row_length(lengths, i_b, N, HAS_LEN: tl.constexpr):
    if HAS_LEN:
        return tl.load(lengths + i_b).to(tl.int32)
    else:
        return N


@triton.jit
def _sequence(i_nh, H, N, lengths, cu_seqlens, HAS_LEN: tl.constexpr, IS_VARLEN: tl.constexpr):
    """(row, bos, L) of a scan's program i_nh: the (batch·head) row its tokens are in, and its
    first token bos and length L there. Packed: segment i_nh // H of head i_nh % H."""
    if IS_VARLEN:
        seg = i_nh // H
        bos = tl.load(cu_seqlens + seg)
        return i_nh % H, bos, tl.load(cu_seqlens + seg + 1) - bos
    else:
        return i_nh, 0, _row_length(lengths, i_nh // H, N, HAS_LEN)


@triton.jit
def _scan_span(i_nh, H, N, lengths, cu_seqlens, chunk_offsets, HAS_LEN: tl.constexpr,
               IS_VARLEN: tl.constexpr):
    """`_sequence`'s (row, bos, L), and the index of the program's first chunk in the chunk states."""
    row, bos, L = _sequence(i_nh, H, N, lengths, cu_seqlens, HAS_LEN, IS_VARLEN)
    if IS_VARLEN:
        return row, bos, L, tl.load(chunk_offsets + i_nh // H)
    else:
        return row, bos, L, 0


@triton.jit
def _chunk_span(i_t, i_b, N, lengths, cu_seqlens, chunk_indices, HAS_LEN: tl.constexpr,
                IS_VARLEN: tl.constexpr):
    """(bos, L, i_c, end) of a per-chunk program i_t: its sequence starts at token bos of the
    row and has L tokens, i_c is the chunk within it, and stores are masked to positions < end
    from bos: N for a padded row (its padded positions get zeros), L for a segment (the rest of
    its last chunk is the next segment's). A spare program (segment −1) has L = end = 0."""
    if IS_VARLEN:
        seg = tl.load(chunk_indices + 2 * i_t)
        i_c = tl.load(chunk_indices + 2 * i_t + 1)
        live = seg >= 0
        seg = tl.maximum(seg, 0)
        bos = tl.load(cu_seqlens + seg)
        L = tl.where(live, tl.load(cu_seqlens + seg + 1) - bos, 0)
        return bos, L, i_c, L
    else:
        return 0, _row_length(lengths, i_b, N, HAS_LEN), i_t, N


@triton.jit
def _store_chunk_state(h_s, h_m, h_z, c, S, M, Z, state_off, state_mask, o_k, mk, i_v,
                       DK: tl.constexpr, DV: tl.constexpr, MOMENTUM: tl.constexpr):
    """A scan's (BK, BV) tile of the state at chunk c (entering it in fwd_h, its gradient leaving it
    in bwd_dh): S, and M with momentum, into h_s, h_m; Z (BK,) into h_z by the first V tile only."""
    tl.store(h_s + c * DK * DV + state_off, S, mask=state_mask)
    if MOMENTUM:
        tl.store(h_m + c * DK * DV + state_off, M, mask=state_mask)
    if i_v == 0:
        tl.store(h_z + c * DK + o_k, Z, mask=mk)


@triton.jit
def _load_chunk_state(h_s, h_m, c, tile, tile_mask, DK: tl.constexpr, DV: tl.constexpr,
                      MOMENTUM: tl.constexpr):
    """A per-chunk kernel's tile of S and M' at chunk c, as `_store_chunk_state` stored them. Without
    momentum both are S's tile: the kernels do not read the second then."""
    hs = tl.load(h_s + c * DK * DV + tile, mask=tile_mask, other=0.0)
    hm = hs
    if MOMENTUM:
        hm = tl.load(h_m + c * DK * DV + tile, mask=tile_mask, other=0.0)
    return hs, hm


@triton.jit
def _state_tiles(i_k, i_v, BK: tl.constexpr, BV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr):
    """(o_k, o_v, mk, mv, offsets, mask) of a program's (BK, BV) state tile: Dk block i_k, Dv block i_v."""
    o_k = i_k * BK + tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    mk = o_k < DK
    mv = o_v < DV
    return o_k, o_v, mk, mv, o_k[:, None] * DV + o_v[None, :], mk[:, None] & mv[None, :]


@triton.jit
def _load_scan_state(s, m, z, state_off, state_mask, o_k, mk, log_beta, BK: tl.constexpr, BV: tl.constexpr,
                     MOMENTUM: tl.constexpr, LOAD: tl.constexpr):
    """A scan's (BK, BV) tile of S, M' = −m and Z it starts from (fwd_h: the initial state; bwd_dh: the
    final state's gradient), from pointers at its row, if LOAD, else zeros; in log_beta's dtype."""
    ACC: tl.constexpr = log_beta.dtype
    S = tl.zeros([BK, BV], dtype=ACC)
    M = tl.zeros([BK, BV], dtype=ACC)
    Z = tl.zeros([BK], dtype=ACC)
    if LOAD:
        S += tl.load(s + state_off, mask=state_mask, other=0.0).to(ACC)
        if MOMENTUM:
            M -= tl.load(m + state_off, mask=state_mask, other=0.0).to(ACC)
        Z += tl.load(z + o_k, mask=mk, other=0.0).to(ACC)
    return S, M, Z


@triton.jit
def _store_scan_state(s, m, z, S, M, Z, state_off, state_mask, o_k, mk, FIRST_V):
    """A scan's tile of S, m = −M' and (by the first Dv block) Z where it ends, to pointers at its row."""
    tl.store(s + state_off, S, mask=state_mask)
    tl.store(m + state_off, -M, mask=state_mask)
    if FIRST_V:
        tl.store(z + o_k, Z, mask=mk)


@triton.jit
def _end_weights(rows, Lc, log_beta, inv, gamma, beta, MOMENTUM: tl.constexpr):
    """Weights of φ(k_j)v_jᵀ on S and on M' at the end of a chunk of Lc real tokens, the weight of
    the entering M' on the leaving S, and M's decay over the chunk."""
    ACC: tl.constexpr = log_beta.dtype
    real = rows < Lc
    if MOMENTUM:
        n_s = (Lc - rows).to(ACC)
        w_s = tl.where(real, gamma * geometric(n_s, log_beta, inv), 0.0)
        w_m = tl.where(real, tl.exp((Lc - 1 - rows).to(ACC) * log_beta), 0.0)
        carry_end = gamma * beta * geometric(Lc.to(ACC), log_beta, inv)
        decay = tl.exp(Lc.to(ACC) * log_beta)
    else:
        w_s = tl.where(real, gamma, 0.0).to(ACC)
        w_m = w_s
        carry_end = gamma * 0.0
        decay = gamma * 0.0
    return w_s, w_m, carry_end, decay


@triton.jit
def _intra_weights(rows, log_beta, inv, gamma, beta, MOMENTUM: tl.constexpr):
    """W[a, j] = γ(1 − β^(a−j+1))/(1 − β) for j ≤ a (0 above the diagonal) and carry[a]."""
    ACC: tl.constexpr = log_beta.dtype
    causal = rows[:, None] >= rows[None, :]
    if MOMENTUM:
        d = (rows[:, None] - rows[None, :] + 1).to(ACC)
        W = tl.where(causal, gamma * geometric(d, log_beta, inv), 0.0)
        carry = gamma * beta * geometric((rows + 1).to(ACC), log_beta, inv)
    else:
        W = tl.where(causal, gamma, 0.0).to(ACC)
        carry = tl.zeros([rows.shape[0]], dtype=ACC)
    return W, carry, causal


@triton.jit
def _split_of(i_t, i_c, i_bh, H, chunk_indices, L, CPS, G, log_beta, inv, gamma, beta, BT: tl.constexpr,
              MOMENTUM: tl.constexpr, IS_VARLEN: tl.constexpr):
    """For a per-chunk program, where chunk i_c (of a row or segment of L tokens) sits in its split
    of CPS chunks: the index of the split's merged edge states (the scans' row, batch·head or
    segment·head when packed, times G plus the split), and `carried` over the tokens between the
    split's start and the chunk (forward) and between the chunk's end and the split's end
    (backward). A kernel uses the carries it needs; the compiler drops the others."""
    if IS_VARLEN:
        row = tl.maximum(tl.load(chunk_indices + 2 * i_t), 0) * H + i_bh
    else:
        row = i_bh
    g = i_c // CPS
    carry_e, decay_e = carried((i_c - g * CPS) * BT, log_beta, inv, gamma, beta, MOMENTUM)
    carry_d, decay_d = carried(_after_chunk(L, i_c, g, CPS, BT), log_beta, inv, gamma, beta, MOMENTUM)
    return (row * G + g).to(tl.int64), carry_e, decay_e, carry_d, decay_d


@triton.jit
def _after_chunk(L, i_c, g, CPS, BT: tl.constexpr):
    """Real tokens after chunk i_c in its split g (of CPS chunks, in a row or segment of L)."""
    return tl.maximum(tl.minimum(L, (g + 1) * CPS * BT) - (i_c + 1) * BT, 0)


@triton.jit
def _with_split(ls, lm, e_s, e_m, at, mask, carry, decay, MOMENTUM: tl.constexpr, REVERSE: tl.constexpr):
    """A per-chunk state tile scanned from its split's edge (ls = S, lm = M'; lm is ignored without
    momentum), completed with the merged state at that edge (e_s, e_m = −M', the public sign)
    carried over the ℓ tokens between (carry, decay = β^ℓ: `carried`), eq. 12 composed (`compose`):
      forward (the state entering a chunk, from the one entering its split)
        S = S_e + carry·M'_e + ls,   M' = β^ℓ·M'_e + lm;
      REVERSE (the gradient leaving a chunk, from the one leaving its split)
        dS = dS_e + ls,   dM' = β^ℓ·dM'_e + carry·dS_e + lm."""
    ACC: tl.constexpr = carry.dtype
    es = tl.load(e_s + at, mask=mask, other=0.0).to(ACC)
    em = lm.to(ACC)                                   # without momentum: returned as it came
    if MOMENTUM:
        em = -tl.load(e_m + at, mask=mask, other=0.0).to(ACC)
    return compose(es, em, ls.to(ACC), lm.to(ACC), carry, decay, MOMENTUM, REVERSE)


@autotuned(prune_scan)
@triton.jit(do_not_specialize=UNSPECIALISED)
def fwd_h(k, v, h_s, h_m, h_z, s0, m0, z0, s_out, m_out, z_out, lengths, cu_seqlens, chunk_offsets, coef,
          N, H, NT, CPS, G, N_BUCKET, BH_BUCKET,
          DK: tl.constexpr, DV: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
          MOMENTUM: tl.constexpr, HAS_LEN: tl.constexpr, IS_VARLEN: tl.constexpr, USE_INIT: tl.constexpr,
          STORE_H: tl.constexpr, LOW: tl.constexpr, IEEE: tl.constexpr):
    """Grid (cdiv(DK, BK)·cdiv(DV, BV), B·H·G), packed (cdiv(DK, BK)·cdiv(DV, BV), n·H·G): split g
    of a row scans its chunks [g·CPS, (g+1)·CPS) from its own initial state (s0/m0/z0 at
    row·G + g), storing S, M' (and Z for the first DV block) entering each chunk into h_s, h_m
    (B·H, NT, DK, DV), h_z (B·H, NT, DK) if STORE_H, and the state leaving the split into
    s/m/z_out at row·G + g. G = 1, CPS ≥ chunks per row: one pass over the whole row. Without
    STORE_H (the fused kernels' scans from zero) the last split is not scanned: zeros are stored."""
    i_kv = tl.program_id(0)
    i_bh = tl.program_id(1) // G
    i_g = tl.program_id(1) % G
    NV = tl.cdiv(DV, BV)
    i_k = i_kv // NV
    i_v = i_kv % NV
    row, bos, L, first = _scan_span(i_bh, H, N, lengths, cu_seqlens, chunk_offsets, HAS_LEN, IS_VARLEN)
    bh = tl.program_id(1).to(tl.int64)  # whole-tensor offsets in int64; offsets within a row stay int32
    r = row.to(tl.int64)
    k += r * N * DK + bos * DK
    v += r * N * DV + bos * DV
    h_s += (r * NT + first) * DK * DV
    h_m += (r * NT + first) * DK * DV
    h_z += (r * NT + first) * DK
    s0 += bh * DK * DV
    m0 += bh * DK * DV
    s_out += bh * DK * DV
    m_out += bh * DK * DV
    z0 += bh * DK
    z_out += bh * DK
    log_beta, inv, gamma, _eps, beta = _load_coef(coef)
    ACC: tl.constexpr = coef.dtype.element_ty

    rows = tl.arange(0, BT)
    o_k, o_v, mk, mv, state_off, state_mask = _state_tiles(i_k, i_v, BK, BV, DK, DV)
    S, M, Z = _load_scan_state(s0, m0, z0, state_off, state_mask, o_k, mk, log_beta, BK, BV, MOMENTUM,
                               USE_INIT)

    c0 = i_g * CPS
    stop = tl.minimum(c0 + CPS, tl.cdiv(L, BT))
    if not STORE_H:
        if i_g == G - 1:
            stop = c0           # the fused kernels chain splits 0 … G−2 only: the last is not read
    for c in range(c0, stop):
        if STORE_H:
            _store_chunk_state(h_s, h_m, h_z, c, S, M, Z, state_off, state_mask, o_k, mk, i_v, DK, DV,
                               MOMENTUM)
        Lc = tl.minimum(L - c * BT, BT)
        t = c * BT + rows
        real = rows < Lc
        kk = tl.load(k + t[:, None] * DK + o_k[None, :], mask=real[:, None] & mk[None, :],
                     other=0.0)
        vv = tl.load(v + t[:, None] * DV + o_v[None, :], mask=real[:, None] & mv[None, :],
                     other=0.0)
        w_s, w_m, carry_end, decay = _end_weights(rows, Lc, log_beta, inv, gamma, beta, MOMENTUM)
        kt = tl.trans(kk.to(ACC))
        S += mixed_dot(kt * w_s[None, :], vv, LOW, IEEE)
        if MOMENTUM:
            S += carry_end * M
            M = decay * M + mixed_dot(kt * w_m[None, :], vv, LOW, IEEE)
        Z += tl.sum(kk.to(ACC), axis=0)
    _store_scan_state(s_out, m_out, z_out, S, M, Z, state_off, state_mask, o_k, mk, i_v == 0)


@autotuned(CHUNK_PRUNERS["fwd_o"])
@triton.jit(do_not_specialize=UNSPECIALISED)
def fwd_o(q, k, v, h_s, h_m, h_z, e_s, e_m, e_z, o, den, lengths, cu_seqlens, chunk_indices, coef,
          N, H, NT, CPS, G, N_BUCKET, BH_BUCKET,
          DK: tl.constexpr, DV: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
          MOMENTUM: tl.constexpr, HAS_LEN: tl.constexpr, IS_VARLEN: tl.constexpr, SPLIT: tl.constexpr,
          LOW: tl.constexpr, IEEE: tl.constexpr):
    """Grid (cdiv(DV, BV), NT, B·H): outputs of one chunk (NT of all segments' chunks when
    packed); den (B·H, N) = φ(q)ᵀz + eps for the backward (1 at padded positions). A key that
    is not finite is cut out of the chunk's matmuls with `where`, so the outputs before it stay
    exact; outputs from it on are not finite. SPLIT: h_s/h_m/h_z were scanned from the start of
    each split of CPS chunks, and e_s/e_m/e_z (rows·G) hold the merged states entering the splits."""
    i_v = tl.program_id(0)
    i_t = tl.program_id(1)
    i_bh = tl.program_id(2)
    bos, L, i_c, end = _chunk_span(i_t, i_bh // H, N, lengths, cu_seqlens, chunk_indices, HAS_LEN, IS_VARLEN)
    bh = i_bh.to(tl.int64)  # whole-tensor offsets in int64; offsets within a row stay int32
    q += bh * N * DK + bos * DK
    k += bh * N * DK + bos * DK
    v += bh * N * DV + bos * DV
    o += bh * N * DV + bos * DV
    den += bh * N + bos
    h_s += bh * NT * DK * DV
    h_m += bh * NT * DK * DV
    h_z += bh * NT * DK
    log_beta, inv, gamma, eps, beta = _load_coef(coef)
    ACC: tl.constexpr = coef.dtype.element_ty

    rows = tl.arange(0, BT)
    t = i_c * BT + rows
    o_v = i_v * BV + tl.arange(0, BV)
    mv = o_v < DV
    out_ptr = o + t[:, None] * DV + o_v[None, :]
    out_mask = (t < end)[:, None] & mv[None, :]
    if i_c * BT >= L:
        tl.store(out_ptr, tl.zeros([BT, BV], dtype=o.dtype.element_ty), mask=out_mask)
        if i_v == 0:
            tl.store(den + t, tl.full([BT], 1.0, dtype=ACC), mask=t < end)
    else:
        real = t < L
        chunk = i_t
        if SPLIT:
            e_row, carry_e, decay_e, _carry_d, _decay_d = _split_of(
                i_t, i_c, i_bh, H, chunk_indices, L, CPS, G, log_beta, inv, gamma, beta, BT, MOMENTUM,
                IS_VARLEN)
        A = tl.zeros([BT, BT], dtype=ACC)
        o_s = tl.zeros([BT, BV], dtype=ACC)
        o_m = tl.zeros([BT, BV], dtype=ACC)
        qz = tl.zeros([BT], dtype=ACC)
        bad = tl.zeros([BT], dtype=tl.int32)
        for i_k in range(tl.cdiv(DK, BK)):
            o_k = i_k * BK + tl.arange(0, BK)
            mk = o_k < DK
            row_mask = real[:, None] & mk[None, :]
            qq = tl.load(q + t[:, None] * DK + o_k[None, :], mask=row_mask, other=0.0)
            kk = tl.load(k + t[:, None] * DK + o_k[None, :], mask=row_mask, other=0.0)
            bad = tl.maximum(bad, tl.max(tl.where(finite(kk), 0, 1), axis=1))
            A += raw_dot(qq, tl.trans(kk), IEEE)
            tile = o_k[:, None] * DV + o_v[None, :]
            state_mask = mk[:, None] & mv[None, :]
            hs, hm = _load_chunk_state(h_s, h_m, chunk, tile, state_mask, DK, DV, MOMENTUM)
            zz = tl.load(h_z + chunk * DK + o_k, mask=mk, other=0.0)
            if SPLIT:
                hs, hm = _with_split(hs, hm, e_s, e_m, e_row * DK * DV + tile, state_mask, carry_e, decay_e,
                                     MOMENTUM, False)
                zz += tl.load(e_z + e_row * DK + o_k, mask=mk, other=0.0)
            o_s += mixed_dot(qq, hs, LOW, IEEE)
            if MOMENTUM:
                o_m += mixed_dot(qq, hm, LOW, IEEE)
            qz += tl.sum(qq.to(ACC) * zz[None, :], axis=1)
        vv = tl.load(v + t[:, None] * DV + o_v[None, :], mask=real[:, None] & mv[None, :],
                     other=0.0)
        bad = tl.maximum(bad, tl.max(tl.where(finite(vv), 0, 1), axis=1))
        first_bad = tl.min(tl.where(bad > 0, rows, BT), axis=0)
        before_bad = rows < first_bad
        W, carry, causal = _intra_weights(rows, log_beta, inv, gamma, beta, MOMENTUM)
        keep = causal & before_bad[None, :]
        Aw = tl.where(keep, A * W, 0.0)
        num = o_s + mixed_dot(Aw, tl.where(before_bad[:, None], vv, 0.0), LOW, IEEE)
        if MOMENTUM:
            num += carry[:, None] * o_m
        dn = qz + tl.sum(tl.where(keep, A, 0.0), axis=1) + eps
        out = num / dn[:, None]
        out = tl.where(before_bad[:, None], out, float("nan"))
        out = tl.where(real[:, None], out, 0.0)
        tl.store(out_ptr, out.to(o.dtype.element_ty), mask=out_mask)
        if i_v == 0:
            tl.store(den + t, tl.where(real, dn, 1.0), mask=t < end)


@triton.jit
def _denominator_grad(o, do, t, real, dn, DV: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr):
    """dden = −(dO·out)/den at positions t of a chunk (0 where not real), over DV in BV tiles. The
    tiles are unrolled: a loop here would nest in bwd_dh's chunk loop, which Triton's software
    pipeline then leaves unpipelined (sm_90, BV < DV; docs/kernel_resources.md)."""
    ACC: tl.constexpr = dn.dtype
    dot = tl.zeros([BT], dtype=ACC)
    for j in tl.static_range((DV + BV - 1) // BV):
        o_j = j * BV + tl.arange(0, BV)
        mask = real[:, None] & (o_j < DV)[None, :]
        oo = tl.load(o + t[:, None] * DV + o_j[None, :], mask=mask, other=0.0).to(ACC)
        dd = tl.load(do + t[:, None] * DV + o_j[None, :], mask=mask, other=0.0).to(ACC)
        dot += tl.sum(oo * dd, axis=1)
    return -dot / dn


@autotuned(prune_scan)
@triton.jit(do_not_specialize=UNSPECIALISED)
def bwd_dh(q, o, do, den, dden, dh_s, dh_m, dh_z, ds_fin, dm_fin, dz_fin, ds0, dm0, dz0, lengths, cu_seqlens,
           chunk_offsets, coef,
           N, H, NT, CPS, G, N_BUCKET, BH_BUCKET,
           DK: tl.constexpr, DV: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
           MOMENTUM: tl.constexpr, HAS_LEN: tl.constexpr, IS_VARLEN: tl.constexpr,
           HAS_FINAL_GRAD: tl.constexpr, STORE_H: tl.constexpr, LOW: tl.constexpr, IEEE: tl.constexpr):
    """Grid as fwd_h's (a program per split of a row, or of a segment, and head; the final and
    initial gradients at row·G + g): backwards over the split's chunks, the gradients of the
    states leaving each chunk (dS, dM' into dh_s, dh_m; dZ into dh_z, if STORE_H) and of the
    state entering the split:
      dS_in = dS_out + Qᵀ dNum,   dZ_in = dZ_out + Qᵀ dden,
      dM'_in = β^Lc dM'_out + carry[Lc−1]·dS_out + Qᵀ diag(carry) dNum,   dNum = dO / den,
    where dden = −(dO·out)/den, the gradient of each output's denominator, is computed here from
    the whole rows of o and dO (no launch of its own) by the programs of the first V tile, which
    alone need it (dZ), and stored by the first of them (real positions only: no kernel reads the
    others) for bwd_dqk."""
    i_kv = tl.program_id(0)
    i_bh = tl.program_id(1) // G
    i_g = tl.program_id(1) % G
    NV = tl.cdiv(DV, BV)
    i_k = i_kv // NV
    i_v = i_kv % NV
    row, bos, L, first = _scan_span(i_bh, H, N, lengths, cu_seqlens, chunk_offsets, HAS_LEN, IS_VARLEN)
    bh = tl.program_id(1).to(tl.int64)  # whole-tensor offsets in int64; offsets within a row stay int32
    r = row.to(tl.int64)
    q += r * N * DK + bos * DK
    o += r * N * DV + bos * DV
    do += r * N * DV + bos * DV
    den += r * N + bos
    dden += r * N + bos
    dh_s += (r * NT + first) * DK * DV
    dh_m += (r * NT + first) * DK * DV
    dh_z += (r * NT + first) * DK
    ds_fin += bh * DK * DV
    dm_fin += bh * DK * DV
    ds0 += bh * DK * DV
    dm0 += bh * DK * DV
    dz_fin += bh * DK
    dz0 += bh * DK
    log_beta, inv, gamma, _eps, beta = _load_coef(coef)
    ACC: tl.constexpr = coef.dtype.element_ty

    rows = tl.arange(0, BT)
    o_k, o_v, mk, mv, state_off, state_mask = _state_tiles(i_k, i_v, BK, BV, DK, DV)
    dS, dM, dZ = _load_scan_state(ds_fin, dm_fin, dz_fin, state_off, state_mask, o_k, mk, log_beta, BK, BV,
                                  MOMENTUM, HAS_FINAL_GRAD)
    _W, carry, _causal = _intra_weights(rows, log_beta, inv, gamma, beta, MOMENTUM)

    c0 = i_g * CPS
    c1 = tl.minimum(c0 + CPS, tl.cdiv(L, BT))
    for i in range(c1 - c0):
        c = c1 - 1 - i
        if STORE_H:
            _store_chunk_state(dh_s, dh_m, dh_z, c, dS, dM, dZ, state_off, state_mask, o_k, mk, i_v, DK, DV,
                               MOMENTUM)
        Lc = tl.minimum(L - c * BT, BT)
        t = c * BT + rows
        real = rows < Lc
        qq = tl.load(q + t[:, None] * DK + o_k[None, :], mask=real[:, None] & mk[None, :],
                     other=0.0)
        dd = tl.load(do + t[:, None] * DV + o_v[None, :], mask=real[:, None] & mv[None, :],
                     other=0.0).to(ACC)
        dn = tl.load(den + t, mask=real, other=1.0)
        # only the first V tile's programs use dden (for dZ) and store it: the others load no o or dO rows
        ddn = _denominator_grad(o, do, t, rows < tl.where(i_v == 0, Lc, 0), dn, DV, BT, BV)
        if i_kv == 0:
            tl.store(dden + t, ddn, mask=real)
        dnum = dd / dn[:, None]
        qt = tl.trans(qq.to(ACC))
        if MOMENTUM:
            _w_s, _w_m, carry_end, decay = _end_weights(rows, Lc, log_beta, inv, gamma, beta, MOMENTUM)
            dM = decay * dM + carry_end * dS + mixed_dot(qt, dnum * carry[:, None], LOW, IEEE)
        dS += mixed_dot(qt, dnum, LOW, IEEE)
        dZ += tl.sum(qt * ddn[None, :], axis=1)
    _store_scan_state(ds0, dm0, dz0, dS, dM, dZ, state_off, state_mask, o_k, mk, i_v == 0)


@autotuned(CHUNK_PRUNERS["bwd_dv"])
@triton.jit(do_not_specialize=UNSPECIALISED)
def bwd_dv(q, k, do, den, dh_s, dh_m, de_s, de_m, dv, lengths, cu_seqlens, chunk_indices, coef,
           N, H, NT, CPS, G, N_BUCKET, BH_BUCKET,
           DK: tl.constexpr, DV: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
           MOMENTUM: tl.constexpr, HAS_LEN: tl.constexpr, IS_VARLEN: tl.constexpr, SPLIT: tl.constexpr,
           LOW: tl.constexpr, IEEE: tl.constexpr):
    """Grid (cdiv(DV, BV), NT, B·H): dV = (A⊙W)ᵀ dNum + diag(w_s) K dS_out + diag(w_m) K dM'_out.
    SPLIT: dh_s/dh_m were scanned back from the end of each split, de_s/de_m hold the merged
    gradients leaving the splits (as fwd_o's e_s/e_m)."""
    i_v = tl.program_id(0)
    i_t = tl.program_id(1)
    i_bh = tl.program_id(2)
    bos, L, i_c, end = _chunk_span(i_t, i_bh // H, N, lengths, cu_seqlens, chunk_indices, HAS_LEN, IS_VARLEN)
    bh = i_bh.to(tl.int64)  # whole-tensor offsets in int64; offsets within a row stay int32
    q += bh * N * DK + bos * DK
    k += bh * N * DK + bos * DK
    do += bh * N * DV + bos * DV
    dv += bh * N * DV + bos * DV
    den += bh * N + bos
    dh_s += bh * NT * DK * DV
    dh_m += bh * NT * DK * DV
    log_beta, inv, gamma, _eps, beta = _load_coef(coef)
    ACC: tl.constexpr = coef.dtype.element_ty

    rows = tl.arange(0, BT)
    t = i_c * BT + rows
    o_v = i_v * BV + tl.arange(0, BV)
    mv = o_v < DV
    dv_ptr = dv + t[:, None] * DV + o_v[None, :]
    dv_mask = (t < end)[:, None] & mv[None, :]
    if i_c * BT >= L:
        tl.store(dv_ptr, tl.zeros([BT, BV], dtype=dv.dtype.element_ty), mask=dv_mask)
    else:
        real = t < L
        Lc = tl.minimum(L - i_c * BT, BT)
        chunk = i_t
        w_s, w_m, _carry_end, _decay = _end_weights(rows, Lc, log_beta, inv, gamma, beta, MOMENTUM)
        if SPLIT:
            de_row, _carry_e, _decay_e, carry_d, decay_d = _split_of(
                i_t, i_c, i_bh, H, chunk_indices, L, CPS, G, log_beta, inv, gamma, beta, BT, MOMENTUM,
                IS_VARLEN)
        A = tl.zeros([BT, BT], dtype=ACC)
        acc = tl.zeros([BT, BV], dtype=ACC)
        for i_k in range(tl.cdiv(DK, BK)):
            o_k = i_k * BK + tl.arange(0, BK)
            mk = o_k < DK
            row_mask = real[:, None] & mk[None, :]
            qq = tl.load(q + t[:, None] * DK + o_k[None, :], mask=row_mask, other=0.0)
            kk = tl.load(k + t[:, None] * DK + o_k[None, :], mask=row_mask, other=0.0)
            A += raw_dot(qq, tl.trans(kk), IEEE)
            tile = o_k[:, None] * DV + o_v[None, :]
            state_mask = mk[:, None] & mv[None, :]
            dhs, dhm = _load_chunk_state(dh_s, dh_m, chunk, tile, state_mask, DK, DV, MOMENTUM)
            if SPLIT:
                dhs, dhm = _with_split(dhs, dhm, de_s, de_m, de_row * DK * DV + tile, state_mask, carry_d,
                                       decay_d, MOMENTUM, True)
            kf = kk.to(ACC)
            acc += mixed_dot(kf * w_s[:, None], dhs, LOW, IEEE)
            if MOMENTUM:
                acc += mixed_dot(kf * w_m[:, None], dhm, LOW, IEEE)
        dd = tl.load(do + t[:, None] * DV + o_v[None, :], mask=real[:, None] & mv[None, :],
                     other=0.0).to(ACC)
        dn = tl.load(den + t, mask=real, other=1.0)
        dnum = dd / dn[:, None]
        W, _carry, causal = _intra_weights(rows, log_beta, inv, gamma, beta, MOMENTUM)
        Aw = tl.where(causal, A * W, 0.0)
        acc += mixed_dot(tl.trans(Aw), dnum, LOW, IEEE)
        tl.store(dv_ptr, tl.where(real[:, None], acc, 0.0).to(dv.dtype.element_ty), mask=dv_mask)


@autotuned(CHUNK_PRUNERS["bwd_dqk"])
@triton.jit(do_not_specialize=UNSPECIALISED)
def bwd_dqk(q, k, v, do, den, dden, h_s, h_m, h_z, e_s, e_m, e_z, dh_s, dh_m, dh_z, de_s, de_m, de_z, dq, dk,
            lengths, cu_seqlens, chunk_indices, coef, N, H, NT, CPS, G, N_BUCKET, BH_BUCKET,
            DK: tl.constexpr, DV: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
            MOMENTUM: tl.constexpr, HAS_LEN: tl.constexpr, IS_VARLEN: tl.constexpr, SPLIT: tl.constexpr,
            LOW: tl.constexpr, IEEE: tl.constexpr):
    """Grid (cdiv(DK, BK), NT, B·H), with dA = (dNum Vᵀ)⊙W + dden·1ᵀ on j ≤ a:
    dQ = dA K + dNum Sᵀ + diag(carry) dNum M'ᵀ + dden zᵀ;
    dK = dAᵀ Q + diag(w_s) V dS_outᵀ + diag(w_m) V dM'_outᵀ + 1 dZ_outᵀ.
    SPLIT: states and gradients per split, completed with e_* and de_* as in fwd_o and bwd_dv."""
    i_k = tl.program_id(0)
    i_t = tl.program_id(1)
    i_bh = tl.program_id(2)
    bos, L, i_c, end = _chunk_span(i_t, i_bh // H, N, lengths, cu_seqlens, chunk_indices, HAS_LEN, IS_VARLEN)
    bh = i_bh.to(tl.int64)  # whole-tensor offsets in int64; offsets within a row stay int32
    q += bh * N * DK + bos * DK
    k += bh * N * DK + bos * DK
    dq += bh * N * DK + bos * DK
    dk += bh * N * DK + bos * DK
    v += bh * N * DV + bos * DV
    do += bh * N * DV + bos * DV
    den += bh * N + bos
    dden += bh * N + bos
    h_s += bh * NT * DK * DV
    h_m += bh * NT * DK * DV
    dh_s += bh * NT * DK * DV
    dh_m += bh * NT * DK * DV
    h_z += bh * NT * DK
    dh_z += bh * NT * DK
    log_beta, inv, gamma, _eps, beta = _load_coef(coef)
    ACC: tl.constexpr = coef.dtype.element_ty

    rows = tl.arange(0, BT)
    t = i_c * BT + rows
    o_k = i_k * BK + tl.arange(0, BK)
    mk = o_k < DK
    off_k = t[:, None] * DK + o_k[None, :]
    out_mask = (t < end)[:, None] & mk[None, :]
    if i_c * BT >= L:
        tl.store(dq + off_k, tl.zeros([BT, BK], dtype=dq.dtype.element_ty), mask=out_mask)
        tl.store(dk + off_k, tl.zeros([BT, BK], dtype=dk.dtype.element_ty), mask=out_mask)
    else:
        real = t < L
        Lc = tl.minimum(L - i_c * BT, BT)
        chunk = i_t
        w_s, w_m, _carry_end, _decay = _end_weights(rows, Lc, log_beta, inv, gamma, beta, MOMENTUM)
        dn = tl.load(den + t, mask=real, other=1.0)
        ddn = tl.load(dden + t, mask=real, other=0.0)
        if SPLIT:
            e_row, carry_e, decay_e, carry_d, decay_d = _split_of(
                i_t, i_c, i_bh, H, chunk_indices, L, CPS, G, log_beta, inv, gamma, beta, BT, MOMENTUM,
                IS_VARLEN)
        dNV = tl.zeros([BT, BT], dtype=ACC)
        dq_s = tl.zeros([BT, BK], dtype=ACC)
        dq_m = tl.zeros([BT, BK], dtype=ACC)
        dk_acc = tl.zeros([BT, BK], dtype=ACC)
        for i_v in range(tl.cdiv(DV, BV)):
            o_v = i_v * BV + tl.arange(0, BV)
            mv = o_v < DV
            row_mask = real[:, None] & mv[None, :]
            vv = tl.load(v + t[:, None] * DV + o_v[None, :], mask=row_mask, other=0.0)
            dd = tl.load(do + t[:, None] * DV + o_v[None, :], mask=row_mask, other=0.0)
            dnum = dd.to(ACC) / dn[:, None]
            dNV += mixed_dot(dnum, tl.trans(vv), LOW, IEEE)
            tile = o_k[None, :] * DV + o_v[:, None]                                # (BV, BK): Sᵀ
            state_mask = mk[None, :] & mv[:, None]
            hs = tl.load(h_s + chunk * DK * DV + tile, mask=state_mask, other=0.0)
            dhs = tl.load(dh_s + chunk * DK * DV + tile, mask=state_mask, other=0.0)
            hm = hs
            dhm = dhs
            if MOMENTUM:
                hm = tl.load(h_m + chunk * DK * DV + tile, mask=state_mask, other=0.0)
                dhm = tl.load(dh_m + chunk * DK * DV + tile, mask=state_mask, other=0.0)
            if SPLIT:
                hs, hm = _with_split(hs, hm, e_s, e_m, e_row * DK * DV + tile, state_mask, carry_e, decay_e,
                                     MOMENTUM, False)
                dhs, dhm = _with_split(dhs, dhm, de_s, de_m, e_row * DK * DV + tile, state_mask, carry_d,
                                       decay_d, MOMENTUM, True)
            dq_s += mixed_dot(dnum, hs, LOW, IEEE)
            vf = vv.to(ACC)
            dk_acc += mixed_dot(vf * w_s[:, None], dhs, LOW, IEEE)
            if MOMENTUM:
                dq_m += mixed_dot(dnum, hm, LOW, IEEE)
                dk_acc += mixed_dot(vf * w_m[:, None], dhm, LOW, IEEE)
        row_mask = real[:, None] & mk[None, :]
        qq = tl.load(q + off_k, mask=row_mask, other=0.0)
        kk = tl.load(k + off_k, mask=row_mask, other=0.0)
        W, carry, causal = _intra_weights(rows, log_beta, inv, gamma, beta, MOMENTUM)
        dA = tl.where(causal, dNV * W + ddn[:, None], 0.0)
        zz = tl.load(h_z + chunk * DK + o_k, mask=mk, other=0.0)
        dzz = tl.load(dh_z + chunk * DK + o_k, mask=mk, other=0.0)
        if SPLIT:
            zz += tl.load(e_z + e_row * DK + o_k, mask=mk, other=0.0)
            dzz += tl.load(de_z + e_row * DK + o_k, mask=mk, other=0.0)
        dq_acc = mixed_dot(dA, kk, LOW, IEEE) + dq_s + ddn[:, None] * zz[None, :]
        if MOMENTUM:
            dq_acc += carry[:, None] * dq_m
        dk_acc += mixed_dot(tl.trans(dA), qq, LOW, IEEE) + dzz[None, :]
        tl.store(dq + off_k, tl.where(real[:, None], dq_acc, 0.0).to(dq.dtype.element_ty), mask=out_mask)
        tl.store(dk + off_k, tl.where(real[:, None], dk_acc, 0.0).to(dk.dtype.element_ty), mask=out_mask)

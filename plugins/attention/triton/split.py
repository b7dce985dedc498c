"""Sequence-split state scans (after flash-linear-attention's intra-card context parallelism,
fla/ops/common/intracard_cp.py): a row's chunks are cut into G splits of CPS chunks, each scanned
in parallel from zero (storing its per-chunk states), and the splits' edge states are then
chained by eq. 12's affine composition over a span of L tokens (Momentum Transformer, eq. 12,
with m' = −m):
  forward   S ← S + carry(L)·M' + ΔS,   M' ← β^L M' + ΔM',   Z ← Z + ΔZ,
  backward  dS ← dS + ΔdS,   dM' ← β^L dM' + carry(L)·dS + ΔdM',   dZ ← dZ + ΔdZ,
carry(L) = γβ(1 − β^L)/(1 − β). There is no second scan: the per-chunk kernels add each chunk's
share of its split's edge state where they read the per-chunk states (chunk_kernels._with_split),
so splitting costs one short merge launch per scan and an L2-resident read of the edge states.
G = 1 unless the rows are fewer than the SMs and long (scan_splits)."""
import torch
import triton
import triton.language as tl

from ...triton_launch import cdiv, direct
from .utils import PROGRAMS_PER_SM, block, carried, compose, sm_count

# A row is split where the rows number fewer than the SMs and hold at least LONG_ROW chunks. From
# one row per SM on, the scans' tiles give each SM two programs (utils.prune_scan), and a split only
# adds launches: at B16-H16-T1k, 256 rows, the scans took 0.157 of 0.763 ms of device time on an
# H200, while each launch cost the host about 0.1 ms (docs/benchmarks.md, 2026-11-27). The fused
# kernels (one program per row's whole state, 255 registers × 8 warps: the whole register file, so
# one program per SM at a time) split by the same rule: 256 rows are two waves, and 512 half rows
# four half waves, the same critical path plus two launches and the scans' bytes. The split with a
# second scan cut the scans' device time at 16k and 32k tokens (1-16-64-16384: 1.755 → 1.266 ms of
# kernels; 1-8-64-32768: 2.88 → 0.41 + 0.11 ms merge) and lost at 4k (0.949 → 1.217 ms, G = 6). This
# split, without the second scan, against one pass (fwd+bwd device time, bf16, H200, 2026-11-27):
# 4-16-4k 1036 vs 1040 µs, 1-16-16k 1073 vs 2158, 1-8-32k 1107 vs 3715 (docs/benchmarks.md).
LONG_ROW = 32


def scan_splits(rows: int, chunks: int, device: torch.device) -> tuple[int, int]:
    """(G, CPS): splits per row and chunks per split. Rows fewer than the SMs and at least
    LONG_ROW chunks long are split so that rows·G ≥ 2 programs per SM; otherwise (1, chunks)."""
    if rows >= sm_count(device) or chunks < LONG_ROW:
        return 1, max(chunks, 1)
    return even_splits(rows, chunks, device)


def even_splits(rows: int, chunks: int, device: torch.device) -> tuple[int, int]:
    """(G, CPS) with rows·G ≥ PROGRAMS_PER_SM programs per SM, whatever the rows' number and
    length ((1, chunks) where the rows alone are enough)."""
    wanted = cdiv(PROGRAMS_PER_SM * sm_count(device), max(rows, 1))
    if wanted <= 1:
        return 1, max(chunks, 1)
    cps = max(1, chunks // wanted)
    return cdiv(chunks, cps), cps


@triton.jit
def add_split(S, M, Z, s_loc, m_loc, z_loc, row, left, most, state_off, state_mask, o_k, mk, log_beta, inv,
              gamma, beta, DK: tl.constexpr, DV: tl.constexpr, MOMENTUM: tl.constexpr, REVERSE: tl.constexpr):
    """S, M', Z composed with one split's state from zero, s/m/z_loc at `row` of rows·G (public
    sign m = −M'), over the split's span: the `left` tokens of the row from the split's start, at
    most `most` (CPS·BT). Eq. 12 composed (utils.compose); merge_splits and the fused kernels'
    chains call it split after split."""
    at = row * DK * DV + state_off
    span = tl.minimum(tl.maximum(left, 0), most)
    dS = tl.load(s_loc + at, mask=state_mask, other=0.0).to(S.dtype)
    dM = dS
    if MOMENTUM:
        dM = -tl.load(m_loc + at, mask=state_mask, other=0.0).to(S.dtype)
    carry, decay = carried(span, log_beta, inv, gamma, beta, MOMENTUM)
    S, M = compose(S, M, dS, dM, carry, decay, MOMENTUM, REVERSE)
    Z += tl.load(z_loc + row * DK + o_k, mask=mk, other=0.0).to(S.dtype)
    return S, M, Z


@triton.jit(do_not_specialize=["N", "H", "G", "CPS"])
def merge_splits(s_loc, m_loc, z_loc, s_init, m_init, z_init, s_seg, m_seg, z_seg, s_fin, m_fin, z_fin,
                 lengths, cu_seqlens, coef, N, H, G, CPS,
                 DK: tl.constexpr, DV: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                 MOMENTUM: tl.constexpr, HAS_LEN: tl.constexpr, IS_VARLEN: tl.constexpr,
                 USE_INIT: tl.constexpr, REVERSE: tl.constexpr):
    """Grid (cdiv(DK, BK)·cdiv(DV, BV), rows): chains one row's G splits, given each split's
    state from zero (forward) or gradient from zero (REVERSE) in s/m/z_loc (rows·G, public sign
    m = −M'). Forward: from s/m/z_init (the initial state, if USE_INIT) the state entering each
    split into s/m/z_seg and the final state into s/m/z_fin; REVERSE: from the final state's
    gradient the gradient leaving each split, and that of the initial state."""
    i_kv = tl.program_id(0)
    i_r = tl.program_id(1)
    NV = tl.cdiv(DV, BV)
    i_k = i_kv // NV
    i_v = i_kv % NV
    if IS_VARLEN:
        L = tl.load(cu_seqlens + i_r // H + 1) - tl.load(cu_seqlens + i_r // H)
    elif HAS_LEN:
        L = tl.load(lengths + i_r // H).to(tl.int32)
    else:
        L = N
    r = i_r.to(tl.int64)
    log_beta = tl.load(coef + 0)
    inv = tl.load(coef + 1)
    gamma = tl.load(coef + 2)
    beta = tl.load(coef + 4)
    ACC: tl.constexpr = coef.dtype.element_ty
    o_k = i_k * BK + tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    mk = o_k < DK
    state_off = o_k[:, None] * DV + o_v[None, :]
    state_mask = mk[:, None] & (o_v < DV)[None, :]

    S = tl.zeros([BK, BV], dtype=ACC)
    M = tl.zeros([BK, BV], dtype=ACC)                       # m′ = −m: the public m is stored
    Z = tl.zeros([BK], dtype=ACC)
    if USE_INIT:
        S += tl.load(s_init + r * DK * DV + state_off, mask=state_mask, other=0.0).to(ACC)
        M -= tl.load(m_init + r * DK * DV + state_off, mask=state_mask, other=0.0).to(ACC)
        Z += tl.load(z_init + r * DK + o_k, mask=mk, other=0.0).to(ACC)
    for i in range(G):
        if REVERSE:
            g = G - 1 - i
        else:
            g = i
        at = (r * G + g) * DK * DV + state_off
        tl.store(s_seg + at, S, mask=state_mask)
        if MOMENTUM:
            tl.store(m_seg + at, -M, mask=state_mask)
        if i_v == 0:
            tl.store(z_seg + (r * G + g) * DK + o_k, Z, mask=mk)
        S, M, Z = add_split(S, M, Z, s_loc, m_loc, z_loc, r * G + g, L - g * CPS * BT, CPS * BT, state_off,
                            state_mask, o_k, mk, log_beta, inv, gamma, beta, DK, DV, MOMENTUM, REVERSE)
    tl.store(s_fin + r * DK * DV + state_off, S, mask=state_mask)
    tl.store(m_fin + r * DK * DV + state_off, -M, mask=state_mask)
    if i_v == 0:
        tl.store(z_fin + r * DK + o_k, Z, mask=mk)


def merge(loc, init, seg, fin, layout, G, CPS, coef, meta, reverse: bool) -> None:
    """Launches merge_splits over layout's S·H rows; loc, seg are (s, m, z) of rows·G, init and
    fin of rows (init None: a zero initial state / final gradient)."""
    BK, BV = block(layout.DK, 32), block(layout.DV, 32)
    rows = layout.S * layout.H
    dummy = coef
    lengths = layout.lengths if layout.lengths is not None else dummy
    cu = layout.cu_seqlens if layout.varlen else dummy
    use_init = init is not None
    direct(merge_splits)[(cdiv(layout.DK, BK) * cdiv(layout.DV, BV), rows)](
        *loc, *(init if use_init else fin), *seg, *fin, lengths, cu, coef, layout.N, layout.H, G, CPS,
        DK=layout.DK, DV=layout.DV, BT=layout.BT, BK=BK, BV=BV, MOMENTUM=meta["MOMENTUM"],
        HAS_LEN=meta["HAS_LEN"], IS_VARLEN=meta["IS_VARLEN"], USE_INIT=use_init, REVERSE=reverse)

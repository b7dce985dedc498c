"""Launchers of the fused chunk kernels (fused_chunk_kernels): chunked causal momentum attention
(Momentum Transformer, eq. 13) with the states kept in registers, for head dimensions up to 64.
A forward is one launch and a backward two (fused_bwd_dkv backwards, then fused_bwd_dq); where
the rows are split (split.scan_splits), a scan from zero per split (chunk_kernels' fwd_h, or bwd_dh,
which also stores dden) comes first, and each fused program chains the splits' states in-kernel.
The forward's split states are returned (`splits`, one flat tensor) for the backward's dq pass,
so the backward does not scan the keys and values again; they are rows·G states, not a sequence's
worth."""
import torch

from ...triton_launch import cdiv
from .launches import F, K
from .utils import block


def split_numel(rows: int, G: int, DK: int, DV: int) -> int:
    """Values of `splits`: S, M' (DK × DV) and Z (DK) of each of rows·G splits; none for G = 1."""
    return 0 if G == 1 else rows * G * (2 * DK * DV + DK)


def split_views(flat: torch.Tensor, rows: int, G: int, DK: int, DV: int) -> tuple:
    """(s, m, z) of `flat`: contiguous (rows·G, DK, DV), (rows·G, DK, DV) and (rows·G, DK) views."""
    n = rows * G * DK * DV
    return (flat[:n].view(rows * G, DK, DV), flat[n:2 * n].view(rows * G, DK, DV),
            flat[2 * n:].view(rows * G, DK))


def _tiles(layout) -> dict:
    return dict(BK=block(layout.DK), BV=block(layout.DV))


def _scan_from_zero(fk, v, layout, G, CPS, coef, meta):
    """Each split's state from zero (fwd_h, nothing stored per chunk): the flat `splits`."""
    rows = layout.S * layout.H
    flat = coef.new_empty(split_numel(rows, G, layout.DK, layout.DV))
    loc = split_views(flat, rows, G, layout.DK, layout.DV)
    K.fwd_h[layout.scan_grid(G)](fk, v, *loc, *loc, *loc, *layout.scan_tables(flat), coef,
                                 layout.N, layout.H, layout.NT, CPS, G, USE_INIT=False, STORE_H=False, **meta)
    return flat


def fused_forward(fq, fk, v, s0, z0, m0, layout, coef, meta):
    """(out, den, s, z, m, splits): as chunk.chunk_forward, through fused_fwd."""
    B, H, N, DK, DV, S = layout.B, layout.H, layout.N, layout.DK, layout.DV, layout.S
    acc = coef.dtype
    G, CPS = layout.splits(fq.device)
    rows = S * H
    s, m, z = layout.states(fq, acc)
    flat = _scan_from_zero(fk, v, layout, G, CPS, coef, meta) if G > 1 else coef.new_empty(0)
    loc = split_views(flat, rows, G, DK, DV) if G > 1 else (flat,) * 3        # G = 1: none read
    use_init = s0 is not None
    out = torch.empty_like(v)
    den = fq.new_empty(B, H, N, dtype=acc)
    lengths, cu_seqlens, _ = layout.chunk_tables(den)

    def grid(c):
        return cdiv(DV, c["BV"] // 2 if c["SPLIT_V"] else c["BV"]), rows * G
    F.fused_fwd[grid](fq, fk, v, out, den, *((s0, m0, z0) if use_init else (s, m, z)), *loc, s, m, z, lengths,
                      cu_seqlens, coef, N, H, layout.NT, CPS, G, USE_INIT=use_init, **_tiles(layout), **meta)
    return out, den, s, z, m, flat


def fused_backward(fq, fk, v, out, den, do, s0, z0, m0, ds, dz, dm, splits, layout, coef, meta):
    """(dq, dk, dv, ds0, dz0, dm0): as chunk.chunk_backward, through fused_bwd_dkv and fused_bwd_dq,
    given the forward's `splits` (recomputed if the forward kept none, as after the chunked
    kernels' forward)."""
    H, N, DK, DV, S, NT = layout.H, layout.N, layout.DK, layout.DV, layout.S, layout.NT
    acc = coef.dtype
    G, CPS = layout.splits(fq.device)
    rows = S * H
    ds0, dm0, dz0 = layout.states(fq, acc)
    dden = torch.empty_like(den)            # stored at the real positions, read there only
    lengths, cu_seqlens, _ = layout.chunk_tables(den)
    has_final = ds is not None
    back = (coef.new_empty(0),) * 3                                          # G = 1: none read
    if G > 1:
        back_flat = coef.new_empty(split_numel(rows, G, DK, DV))
        back = split_views(back_flat, rows, G, DK, DV)
        K.bwd_dh[layout.scan_grid(G)](fq, out, do, den, dden, *back, *back, *back, *layout.scan_tables(den),
                                      coef, N, H, NT, CPS, G, HAS_FINAL_GRAD=False, STORE_H=False, **meta)
        if splits.numel() != split_numel(rows, G, DK, DV):
            splits = _scan_from_zero(fk, v, layout, G, CPS, coef, meta)
    dk = torch.empty_like(fk)
    dv = torch.empty_like(v)
    final = (ds, dm, dz) if has_final else (ds0, dm0, dz0)                    # not read without
    F.fused_bwd_dkv[(rows * G,)](fq, fk, v, out, do, den, dden, dk, dv, *final, ds0, dm0, dz0, *back, lengths,
                                 cu_seqlens, coef, N, H, NT, CPS, G, HAS_FINAL_GRAD=has_final,
                                 DDEN_READY=G > 1, **_tiles(layout), **meta)
    loc = split_views(splits, rows, G, DK, DV) if G > 1 else back
    use_init = s0 is not None
    init = (s0, m0, z0) if use_init else (ds0, dm0, dz0)                      # not read without
    dq = torch.empty_like(fq)
    F.fused_bwd_dq[(rows * G,)](fk, v, do, den, dden, dq, *init, *loc, lengths, cu_seqlens, coef, N, H, NT,
                                CPS, G, USE_INIT=use_init, **_tiles(layout), **meta)
    return dq, dk, dv, ds0, dz0, dm0

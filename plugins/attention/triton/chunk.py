"""Chunked causal momentum attention (Momentum Transformer, eq. 13) in Triton: the launchers of
the forward and backward kernels, on prepared inputs (`op` registers them as custom ops,
`entry_points` prepares the inputs).

Memory: the forward keeps q, k, v, the output and one float per position (the denominator); the
states entering each chunk (2·nchunks·Dk·Dv values, bf16 for bf16 inputs, fp32/fp64 otherwise)
exist only during a kernel pair and are recomputed in the backward, so nothing of size N·Dk·Dv is
ever stored. Launches run on the inputs' CUDA device.

Packed sequences (`cu_seqlens`, one row): the scans get one program per (segment, head), the
per-chunk kernels one per chunk of any segment, through the tables of `varlen_tables`; the
kernels read the packed row in place (no copy into a padded batch, no loop over segments).

Where the rows (batch·heads, or segments·heads) are fewer than the SMs, the state scans run in
splits of the sequence (`split`): each split scanned from zero, a short merge of the splits' edge
states, and the per-chunk kernels (SPLIT) add each chunk's share of its split's edge state where
they read the per-chunk states, so the scan runs once either way.

With SCAN = "fused" (MOMENTUM_TRITON_SCAN=fused) and head dimensions up to 64, the launchers of
`fused_chunk` run instead: the states stay in registers, a forward is one launch and a backward
two (after a scan from zero per split where split), and no per-chunk state reaches memory."""
import os
from typing import NamedTuple, Optional

import torch

from ...triton_launch import cdiv, described, launch_plan
from .fused_chunk import fused_backward, fused_forward, split_numel
from .fused_chunk_kernels import fits, fused_chunk_size
from .launches import K
from .split import merge, scan_splits
from .utils import (
    accumulator_dtype,
    check_grid,
    chunk_block,
    chunk_state_dtype,
    coefficients,
    device_of,
    kernel_flags,
    tuning_buckets,
    with_chunk_dots,
)

# The kernels that run eq. 13 where both can: "chunked" (chunk_kernels, the per-chunk states through
# memory) or "fused" (fused_chunk_kernels, the states in registers, head dimensions up to 64: half
# the modelled bytes and the peak memory). On an H200 (docs/benchmarks.md, 2026-11-27) the fused
# kernels took longer on the device at every shape (bf16 fwd+bwd 1174 vs 790 µs at B16-H16-T1k; one
# program per SM) and tied or lost in wall time: "chunked" stays the default.
SCANS = ("chunked", "fused")
SCAN = os.environ.get("MOMENTUM_TRITON_SCAN", "chunked")


def fused_scans(DK: int, DV: int) -> bool:
    """Whether a launch of these head dimensions runs the fused kernels (SCAN, where they fit)."""
    if SCAN not in SCANS:
        raise ValueError(f"MOMENTUM_TRITON_SCAN must be one of {SCANS}, got {SCAN!r}")
    return SCAN == "fused" and fits(DK, DV)


def kept_splits_numel(fq, v, cu_seqlens, chunk: int) -> int:
    """Values of the split states that chunk_forward returns for the backward (`splits`): the fused
    kernels' states of each split from zero where the rows are split, else none."""
    _, H, N, DK = fq.shape
    DV = v.shape[-1]
    if not fused_scans(DK, DV):
        return 0
    rows = (fq.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1) * H
    G, _ = scan_splits(rows, cdiv(N, chunk_block(fused_chunk_size(chunk))), fq.device)
    return split_numel(rows, G, DK, DV)


class _Layout:
    """Shapes and index tables of one launch: B·H rows of N tokens (B rows of `lengths` real
    tokens), or with `cu_seqlens` one row (B = 1) holding n segments. `S` is the states' batch
    (B, or n), `NT` the number of chunks (per row; packed, of all segments together, an upper
    bound: see varlen_tables)."""

    def __init__(self, fq, v, chunk, lengths, cu_seqlens):
        self.B, self.H, self.N, self.DK = fq.shape
        self.DV = v.shape[-1]
        self.BT = chunk_block(chunk)
        self.varlen = cu_seqlens is not None
        if self.varlen:
            self.S = cu_seqlens.numel() - 1
            self.cu_seqlens = cu_seqlens
            self.chunk_offsets, self.chunk_indices = varlen_tables(cu_seqlens, self.N, self.BT)
            self.NT = self.chunk_indices.shape[0]
        else:
            self.S = self.B
            self.NT = cdiv(self.N, self.BT)
        self.lengths = lengths
        self._splits = None

    def scan_grid(self, G: int = 1):
        """State scans: one program per (Dk block, Dv block, batch·head or segment·head, split)."""
        DK, DV, rows = self.DK, self.DV, self.S * self.H * G
        return lambda meta: (cdiv(DK, meta["BK"]) * cdiv(DV, meta["BV"]), rows)

    def splits(self, device):
        """(G, CPS) of the state scans (split.scan_splits); a segment has at most N tokens. Decided
        once per launcher call: the launch plan's signature holds it."""
        if self._splits is None:
            self._splits = scan_splits(self.S * self.H, cdiv(self.N, self.BT), device)
        return self._splits

    def states(self, like, dtype):
        """(s, m, z) of the S sequences: (S, H, DK, DV) twice and (S, H, DK), empty, in `dtype`."""
        s = like.new_empty(self.S, self.H, self.DK, self.DV, dtype=dtype)
        return s, torch.empty_like(s), like.new_empty(self.S, self.H, self.DK, dtype=dtype)

    def split_states(self, like, G: int, with_m: bool = True):
        """(s, m, z) scratch of the splits' states, S·H·G of them, in the accumulator dtype."""
        s = like.new_empty(self.S * self.H * G, self.DK, self.DV)
        return s, (torch.empty_like(s) if with_m else s), like.new_empty(self.S * self.H * G, self.DK)

    def chunk_grid(self, tile, dim):
        """Per-chunk kernels: one program per (block of `dim`, chunk, batch·head)."""
        NT, rows = self.NT, self.B * self.H
        return lambda meta: (cdiv(dim, meta[tile]), NT, rows)

    def meta(self, dtype, momentum):
        """The autotuned kernels' constants and tuning buckets (packed: the mean segment length
        and segments·heads, what a scan program runs over and how many there are)."""
        n = max(self.S, 1)
        return dict(DK=self.DK, DV=self.DV, BT=self.BT, MOMENTUM=momentum > 0.0,
                    HAS_LEN=self.lengths is not None, IS_VARLEN=self.varlen, **kernel_flags(dtype),
                    **tuning_buckets(self.N // n if self.varlen else self.N, n * self.H))

    def scan_tables(self, dummy):
        """(lengths, cu_seqlens, chunk_offsets) of the scans; `dummy` where a kernel reads none."""
        if self.varlen:
            return dummy, self.cu_seqlens, self.chunk_offsets
        return (self.lengths if self.lengths is not None else dummy), dummy, dummy

    def chunk_tables(self, dummy):
        """(lengths, cu_seqlens, chunk_indices) of the per-chunk kernels."""
        if self.varlen:
            return dummy, self.cu_seqlens, self.chunk_indices
        return (self.lengths if self.lengths is not None else dummy), dummy, dummy


def varlen_tables(cu_seqlens, N: int, BT: int):
    """fla's prepare_chunk_offsets / prepare_chunk_indices on the device, without a host sync:
    chunk_offsets (n+1,) int32, segment s's chunks are [chunk_offsets[s], chunk_offsets[s+1]) of
    all segments' chunks; chunk_indices (NT, 2) int32, (segment, chunk within it) of each. NT is
    the bound min(N, ⌊(N + n(BT − 1))/BT⌋) on Σ_s ⌈L_s/BT⌉ known from the shapes alone (fla reads
    the count back to the host instead): the spare rows are (−1, ·), programs that do nothing.
    It exceeds the count by at most n (by less than the count itself), all of it unused chunk
    states. Empty segments own no chunk."""
    n = cu_seqlens.numel() - 1
    cu = cu_seqlens.long()
    counts = (cu[1:] - cu[:-1] + BT - 1) // BT
    offsets = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
    NT = min(N, (N + n * (BT - 1)) // BT)
    chunks = torch.arange(NT, device=cu.device)
    segment = torch.searchsorted(offsets, chunks, right=True) - 1        # offsets[s] <= i < offsets[s+1]
    within = chunks - offsets[segment]
    segment = torch.where(segment < n, segment, -1)                     # past the last chunk: spare
    return offsets.to(torch.int32), torch.stack([segment, within], 1).to(torch.int32).contiguous()


def states_entering_chunks(fk, v, s0, z0, m0, layout, coef, meta, finals=None):
    """S, M' (in `chunk_state_dtype`) and Z (fp32/fp64) entering each chunk, the final state
    (s, z, m with m = −M', fp32/fp64; batch B, or n segments; written into `finals` (s, m, z) if
    given), and `edges`: None, or where the scan ran in G splits, the per-chunk states from each
    split's start and edges = (s, m, z) of the states entering the splits (rows·G), which the
    per-chunk kernels add (SPLIT)."""
    B, H, N, DK, DV, NT = layout.B, layout.H, layout.N, layout.DK, layout.DV, layout.NT
    acc = coef.dtype
    h_s = fk.new_empty(B * H, NT, DK, DV, dtype=chunk_state_dtype(fk.dtype))
    h_m = torch.empty_like(h_s) if meta["MOMENTUM"] else h_s
    h_z = fk.new_empty(B * H, NT, DK, dtype=acc)
    s, m, z = layout.states(fk, acc) if finals is None else finals
    use_init = s0 is not None
    G, CPS = layout.splits(fk.device)
    tables = layout.scan_tables(z)
    if G == 1:
        K.fwd_h[layout.scan_grid()](fk, v, h_s, h_m, h_z, s0 if use_init else s, m0 if use_init else m,
                                    z0 if use_init else z, s, m, z, *tables, coef,
                                    N, H, NT, CPS, 1, USE_INIT=use_init, STORE_H=True, **meta)
        return h_s, h_m, h_z, s, z, m, None
    local = layout.split_states(coef, G)
    K.fwd_h[layout.scan_grid(G)](fk, v, h_s, h_m, h_z, *local, *local, *tables, coef,
                                 N, H, NT, CPS, G, USE_INIT=False, STORE_H=True, **meta)
    edges = layout.split_states(coef, G)
    merge(local, (s0, m0, z0) if use_init else None, edges, (s, m, z), layout, G, CPS, coef, meta,
          reverse=False)
    return h_s, h_m, h_z, s, z, m, SplitEdges(edges, CPS, G)


class SplitEdges(NamedTuple):
    """The merged states (s, m, z) at the edges of G splits of CPS chunks (rows·G of them)."""
    states: tuple
    cps: int
    g: int


def split_args(edges: Optional[SplitEdges], dummy: tuple, NT: int) -> tuple:
    """The per-chunk kernels' (e_s, e_m, e_z), (CPS, G) and SPLIT flag; without splits `dummy`
    (accumulator-dtype tensors the kernels do not read) and one split of all NT chunks."""
    if edges is None:
        return dummy, (NT, 1), False
    return edges.states, (edges.cps, edges.g), True


def chunk_forward(fq, fk, v, s0, z0, m0, lengths, cu_seqlens, momentum: float, step_size: float,
                  eps: float, chunk: int):
    """out (input dtype), den (B, H, N) accumulator dtype, the final s, z, m (batch B, or n
    segments with `cu_seqlens`: int32, n + 1 offsets over the one row), and `splits` for the
    backward (kept_splits_numel values, accumulator dtype; empty for the chunked kernels)."""
    with device_of(fq):
        return _chunk_forward(fq, fk, v, s0, z0, m0, lengths, cu_seqlens, momentum, step_size, eps, chunk)


def _chunk_forward(fq, fk, v, s0, z0, m0, lengths, cu_seqlens, momentum, step_size, eps, chunk):
    fused = fused_scans(fq.shape[-1], v.shape[-1])
    layout = _Layout(fq, v, fused_chunk_size(chunk) if fused else chunk, lengths, cu_seqlens)
    check_grid(max(layout.B, layout.S) * layout.H, layout.NT)
    coef = coefficients(momentum, step_size, eps, accumulator_dtype(fq.dtype), fq.device)
    meta = layout.meta(fq.dtype, momentum)
    chunk_meta = with_chunk_dots(meta, fq.dtype, fq.device)
    with launch_plan(("forward", fused, chunk, layout.splits(fq.device), *meta.values(), chunk_meta["IEEE"],
                      *described(fq, fk, v, s0, z0, m0, lengths, cu_seqlens))):
        if fused:
            return fused_forward(fq, fk, v, s0, z0, m0, layout, coef, meta)
        return _chunked_forward(fq, fk, v, s0, z0, m0, layout, coef, meta, chunk_meta)


def _chunked_forward(fq, fk, v, s0, z0, m0, layout, coef, meta, chunk_meta):
    B, H, N, DV, NT = layout.B, layout.H, layout.N, layout.DV, layout.NT
    h_s, h_m, h_z, s, z, m, edges = states_entering_chunks(fk, v, s0, z0, m0, layout, coef, meta)
    out = torch.empty_like(v)
    den = fq.new_empty(B, H, N, dtype=coef.dtype)
    e, splits, split = split_args(edges, (s, m, z), layout.NT)
    K.fwd_o[layout.chunk_grid("BV", DV)](fq, fk, v, h_s, h_m, h_z, *e, out, den, *layout.chunk_tables(den),
                                         coef, N, H, NT, *splits, SPLIT=split, **chunk_meta)
    return out, den, s, z, m, den.new_empty(0)


def chunk_backward(fq, fk, v, out, den, splits, do, s0, z0, m0, ds, dz, dm, lengths, cu_seqlens,
                   momentum: float, step_size: float, eps: float, chunk: int):
    """Gradients of fq, fk, v (input dtype) and of the initial s, z, m (accumulator dtype), given
    the forward's out, den and splits, the output gradient do and the final state's gradients ds,
    dz, dm (None = 0)."""
    with device_of(fq):
        return _chunk_backward(fq, fk, v, out, den, splits, do, s0, z0, m0, ds, dz, dm, lengths, cu_seqlens,
                               momentum, step_size, eps, chunk)


def _chunk_backward(fq, fk, v, out, den, splits, do, s0, z0, m0, ds, dz, dm, lengths, cu_seqlens, momentum,
                    step_size, eps, chunk):
    fused = fused_scans(fq.shape[-1], v.shape[-1])
    layout = _Layout(fq, v, fused_chunk_size(chunk) if fused else chunk, lengths, cu_seqlens)
    coef = coefficients(momentum, step_size, eps, accumulator_dtype(fq.dtype), fq.device)
    meta = layout.meta(fq.dtype, momentum)
    chunk_meta = with_chunk_dots(meta, fq.dtype, fq.device)
    with launch_plan(("backward", fused, chunk, layout.splits(fq.device), *meta.values(), chunk_meta["IEEE"],
                      *described(fq, fk, v, out, den, splits, do, s0, z0, m0, ds, dz, dm, lengths,
                                 cu_seqlens))):
        if fused:
            return fused_backward(fq, fk, v, out, den, do, s0, z0, m0, ds, dz, dm, splits, layout, coef, meta)
        return _chunked_backward(fq, fk, v, out, den, do, s0, z0, m0, ds, dz, dm, layout, coef, meta,
                                 chunk_meta)


def _chunked_backward(fq, fk, v, out, den, do, s0, z0, m0, ds, dz, dm, layout, coef, meta, chunk_meta):
    H, N, DK, DV, NT = layout.H, layout.N, layout.DK, layout.DV, layout.NT
    ds0, dm0, dz0 = layout.states(fq, coef.dtype)
    # the recomputed final state is not needed: written where bwd_dh (or the merge) writes its gradient later
    h_s, h_m, h_z, _s, _z, _m, edges = states_entering_chunks(fk, v, s0, z0, m0, layout, coef, meta,
                                                              finals=(ds0, dm0, dz0))

    dden = torch.empty_like(den)           # written by bwd_dh at the real positions, read there only
    has_final = ds is not None
    dh_s = torch.empty_like(h_s)
    dh_m = torch.empty_like(h_m) if meta["MOMENTUM"] else dh_s
    dh_z = torch.empty_like(h_z)
    tables = layout.scan_tables(den)
    back_edges = None
    if edges is None:
        K.bwd_dh[layout.scan_grid()](fq, out, do, den, dden, dh_s, dh_m, dh_z, ds if has_final else ds0,
                                     dm if has_final else dm0, dz if has_final else dz0, ds0, dm0, dz0,
                                     *tables, coef, N, H, NT, NT, 1, HAS_FINAL_GRAD=has_final, STORE_H=True,
                                     **meta)
    else:
        G, CPS = edges.g, edges.cps
        local = layout.split_states(coef, G)
        K.bwd_dh[layout.scan_grid(G)](fq, out, do, den, dden, dh_s, dh_m, dh_z, *local, *local, *tables, coef,
                                      N, H, NT, CPS, G, HAS_FINAL_GRAD=False, STORE_H=True, **meta)
        leaving = layout.split_states(coef, G)
        final = (ds, dm, dz) if has_final else None
        merge(local, final, leaving, (ds0, dm0, dz0), layout, G, CPS, coef, meta, reverse=True)
        back_edges = SplitEdges(leaving, CPS, G)

    e, splits, split = split_args(edges, (ds0, dm0, dz0), NT)
    de, _, _ = split_args(back_edges, (ds0, dm0, dz0), NT)
    dv = torch.empty_like(v)
    K.bwd_dv[layout.chunk_grid("BV", DV)](fq, fk, do, den, dh_s, dh_m, *de[:2], dv, *layout.chunk_tables(den),
                                          coef, N, H, NT, *splits, SPLIT=split, **chunk_meta)
    dq = torch.empty_like(fq)
    dk = torch.empty_like(fk)
    K.bwd_dqk[layout.chunk_grid("BK", DK)](fq, fk, v, do, den, dden, h_s, h_m, h_z, *e, dh_s, dh_m, dh_z, *de,
                                           dq, dk, *layout.chunk_tables(den), coef, N, H, NT, *splits,
                                           SPLIT=split, **chunk_meta)
    return dq, dk, dv, ds0, dz0, dm0

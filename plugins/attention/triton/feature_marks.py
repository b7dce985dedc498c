"""The finite parts, a built-in feature map and the NaN marks of nonfinite.NonFiniteMarks for q, k
and v in one launch forward and one backward, for the Triton path in eager mode.

In PyTorch ops the marks cost q, k and v each a nan_to_num, a multiplication by 0 (and for q, k a
sum) and φ forward, and backward φ's gradient and nan_to_num's (isfinite: four more passes), a
`where` each for padding, and a copy to contiguous for heads transposed out of (B, N, H, D): 43
aten ops and 6.6× the attention's ideal bytes per forward+backward at B1-H8-T1024, D 64, bf16
(8.5× padded), against 3.3× for the attention kernels themselves (docs/benchmarks.md). Here each
tensor is read once and written once forward (read in any layout, written contiguous, as the
attention kernels take it) and read twice and written once backward. The results are nonfinite's
after attend.mask_keys: φ(x·[x finite]) with x's non-finite entries and padding as 0, the marks 0
where finite and NaN where not (per row of q and k, per entry of v), and the gradient
g·φ′·[x finite] (a product, as nan_to_num's backward: an upstream NaN stays), 0 at padding. One
launch serves all three tensors (the grid's third axis picks one): a layer's host time is mostly
per launch and per autograd node (docs/benchmarks.md, 2026-11-28: an eager layer's host work sets
its wall on an H200). `marked_output` then adds the causal marks to the attention's output in one
kernel, from each column's first marked position per row or per packed sequence, where
NonFiniteMarks.causal takes three adds and a cumsum (a cummax and a searchsorted when packed)."""

import torch
import triton
import triton.language as tl

from ...triton_launch import cdiv, described, direct, launch_plan, next_power_of_2
from ..checks import as_dtype
from .fused_recurrent import _feature, _mark
from .utils import check_grid, device_of, kernel_dtype

# Elements per program: one (BLOCK_N, BLOCK_D) tile.
TILE = 4096
# φ's code for v, whose finite part passes as it is (entry_points.MARKED_FEATURE_MAPS)
IDENTITY = tl.constexpr(3)


@triton.jit
def _feature_grad(grad, x, PHI: tl.constexpr):
    """g·φ′(x) at a finite x as torch's backward of each map gives it: 1 elu + 1 (a product:
    g·exp(x) where x ≤ 0), 2 relu (a choice: 0 where x ≤ 0, even for a NaN g), 3 identity."""
    if PHI == 1:
        return tl.where(x > 0, grad, grad * tl.exp(x))
    elif PHI == 2:
        return tl.where(x > 0, grad, 0.0)
    else:
        return grad


@triton.jit
def _real(lengths, b, rows, HAS_LEN: tl.constexpr):
    """Whether each row is a real token: before its batch row's length (HAS_LEN), else all."""
    if HAS_LEN:
        return rows < tl.load(lengths + b)
    else:
        return rows >= 0


@triton.jit
def _strided(i_bh, H, rows, cols, sb, sh, sn, sd):
    """Offsets of a (rows, cols) tile of row i_bh = b·H + h of a (B, H, N, D) tensor of strides s*."""
    return (i_bh // H) * sb + (i_bh % H) * sh + rows[:, None].to(tl.int64) * sn + cols[None, :] * sd


@triton.jit
def _first_row(seg, b, rows, N, R, HAS_SEG: tl.constexpr):
    """The row of `first` that each position's marks go to: its packed sequence seg[i] (HAS_SEG;
    R, no row, past N) or its batch row b."""
    if HAS_SEG:
        return tl.load(seg + rows, mask=rows < N, other=R)
    else:
        return tl.zeros_like(rows).to(tl.int64) + b


@triton.jit
def _read_tile(x, lengths, N, H, sxb, sxh, sxn, sxd, D: tl.constexpr, HAS_LEN: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """This program's tile of x (grid (cdiv(N, BLOCK_N), B·H, ·)) in fp32, padding read as 0: its row
    i_bh, positions, columns, in-bounds mask, which positions are real (a column) and the values."""
    i_bh = tl.program_id(1).to(tl.int64)
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, BLOCK_D)
    mask = (rows < N)[:, None] & (cols < D)[None, :]
    real = _real(lengths, i_bh // H, rows, HAS_LEN)[:, None]
    value = tl.load(x + _strided(i_bh, H, rows, cols, sxb, sxh, sxn, sxd), mask=mask & real, other=0.0)
    return i_bh, rows, cols, mask, real, value.to(tl.float32)


@triton.jit
def _features(x, y, marks, lengths, seg, first, first_row, R, N, H, sxb, sxh, sxn, sxd, D: tl.constexpr,
              PHI: tl.constexpr, ROW_MARKS: tl.constexpr, HAS_LEN: tl.constexpr, ZERO_PAD: tl.constexpr,
              HAS_FIRST: tl.constexpr, HAS_SEG: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """One tile of one tensor x. y (B, H, N, D) contiguous: φ of x's finite part; marks
    (B, H, N) per row (ROW_MARKS: NaN where any entry of the row is not finite) or (B, H, N, D).
    HAS_LEN: positions from `lengths[b]` on are padding, read as 0 (attend.mask_keys): no marks,
    φ(0), or 0 with ZERO_PAD (for keys, masked again after φ). HAS_FIRST: `first` (row r·H + h at
    (r·H + h)·first_row; one int32 per column, or one per row with ROW_MARKS) gets the first marked
    position by atomic min (it holds N or less before), for mark_causal_kernel: r is the batch row,
    or with HAS_SEG each position's packed sequence `seg[i]` (of R). Only marked entries issue one."""
    i_bh, rows, cols, mask, real, value = _read_tile(x, lengths, N, H, sxb, sxh, sxn, sxd, D, HAS_LEN,
                                                     BLOCK_N, BLOCK_D)
    mark = _mark(value)
    finite = tl.where(mark == 0.0, value, 0.0)
    out = (i_bh * N + rows[:, None]) * D + cols[None, :]
    feature = _feature(finite, PHI)
    if ZERO_PAD:
        feature = tl.where(real, feature, 0.0)
    tl.store(y + out, feature.to(y.dtype.element_ty), mask=mask)
    if ROW_MARKS:
        row_mark = tl.sum(mark, axis=1)
        tl.store(marks + i_bh * N + rows, row_mark.to(marks.dtype.element_ty), mask=rows < N)
    else:
        tl.store(marks + out, mark.to(marks.dtype.element_ty), mask=mask)
    if HAS_FIRST:
        r = _first_row(seg, i_bh // H, rows, N, R, HAS_SEG)
        cell = first + (r * H + i_bh % H) * first_row
        if ROW_MARKS:
            tl.atomic_min(cell, rows, mask=((row_mark == 0.0) == 0) & (r < R))
        else:
            hit = mask & ((mark == 0.0) == 0) & (r < R)[:, None]
            tl.atomic_min(cell[:, None] + cols[None, :], tl.broadcast_to(rows[:, None], (BLOCK_N, BLOCK_D)),
                          mask=hit)


@triton.jit
def _feature_grads(x, g, dx, lengths, N, H, sxb, sxh, sxn, sxd, sdb, sdh, sdn, sdd, D: tl.constexpr,
                   PHI: tl.constexpr, HAS_LEN: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """One tile of one tensor: dx (x's shape, strides sd*) = g·φ′(x's finite part)·[x finite], g (B, H, N, D)
    contiguous, and 0 at padding (a choice, as mask_keys' `where`); in fp32 (bf16, fp16 and fp32
    inputs: float64 stays on the PyTorch path)."""
    i_bh, rows, cols, mask, real, value = _read_tile(x, lengths, N, H, sxb, sxh, sxn, sxd, D, HAS_LEN,
                                                     BLOCK_N, BLOCK_D)
    keep = _mark(value) == 0.0
    grad = tl.load(g + (i_bh * N + rows[:, None]) * D + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    out = _feature_grad(grad, tl.where(keep, value, 0.0), PHI) * tl.where(keep, 1.0, 0.0)
    out = tl.where(real, out, 0.0)
    tl.store(dx + _strided(i_bh, H, rows, cols, sdb, sdh, sdn, sdd), out.to(dx.dtype.element_ty), mask=mask)


@triton.jit
def finite_features_fwd(q, k, v, fq, fk, fv, mq, mk, mv, lengths, seg, first, R, N, H,
                        sqb, sqh, sqn, sqd, skb, skh, skn, skd, svb, svh, svn, svd, DK: tl.constexpr,
                        DV: tl.constexpr, PHI: tl.constexpr, HAS_LEN: tl.constexpr, HAS_SEG: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """Grid (cdiv(N, BLOCK_N), B·H, 3), the third axis q, k, v (strides s*): φ(q) and its row marks;
    φ(k), 0 at padding, its row marks, and its first marked position into column 0 of `first`
    ((R·H, 1 + DV) int32: R batch rows, or with HAS_SEG the R packed sequences of `seg`); v's
    finite part, 0 at padding, its marks per entry, and each column's first marked position into
    columns 1 to DV."""
    which = tl.program_id(2)
    if which == 0:
        _features(q, fq, mq, lengths, seg, first, 0, R, N, H, sqb, sqh, sqn, sqd, DK, PHI, True, HAS_LEN,
                  False, False, False, BLOCK_N, BLOCK_D)
    elif which == 1:
        _features(k, fk, mk, lengths, seg, first, 1 + DV, R, N, H, skb, skh, skn, skd, DK, PHI, True,
                  HAS_LEN, True, True, HAS_SEG, BLOCK_N, BLOCK_D)
    else:
        _features(v, fv, mv, lengths, seg, first + 1, 1 + DV, R, N, H, svb, svh, svn, svd, DV, IDENTITY,
                  False, HAS_LEN, True, True, HAS_SEG, BLOCK_N, BLOCK_D)


@triton.jit
def finite_features_bwd(q, k, v, gq, gk, gv, dq, dk, dv, lengths, N, H, sqb, sqh, sqn, sqd, skb, skh, skn,
                        skd, svb, svh, svn, svd, s1b, s1h, s1n, s1d, s2b, s2h, s2n, s2d, s3b, s3h, s3n, s3d,
                        DK: tl.constexpr, DV: tl.constexpr, PHI: tl.constexpr, HAS_LEN: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """Grid as forward: the gradients of q, k, v (strides s1*, s2*, s3*) from those of φ(q), φ(k)
    and v's finite part (gq, gk, gv, contiguous)."""
    which = tl.program_id(2)
    if which == 0:
        _feature_grads(q, gq, dq, lengths, N, H, sqb, sqh, sqn, sqd, s1b, s1h, s1n, s1d, DK, PHI, HAS_LEN,
                       BLOCK_N, BLOCK_D)
    elif which == 1:
        _feature_grads(k, gk, dk, lengths, N, H, skb, skh, skn, skd, s2b, s2h, s2n, s2d, DK, PHI, HAS_LEN,
                       BLOCK_N, BLOCK_D)
    else:
        _feature_grads(v, gv, dv, lengths, N, H, svb, svh, svn, svd, s3b, s3h, s3n, s3d, DV, IDENTITY,
                       HAS_LEN, BLOCK_N, BLOCK_D)


@triton.jit
def mark_causal_kernel(out, query, seg, first, res, R, N, H, DV: tl.constexpr, HAS_SEG: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr):
    """Grid (cdiv(N, BLOCK_N), B·H): res = out + query_i, and NaN at i from the first marked key of
    i's row in it on (first (R·H, 1 + DV): the first position with a non-finite key in column 0,
    with a non-finite value entry in column 1 + c, N where none; per batch row, or with HAS_SEG per
    packed sequence seg[i] of R): the causal marks of nonfinite.NonFiniteMarks.causal, whose cumsum
    of 0/NaN marks is NaN exactly from there on, on (B, H, N, ·) contiguous tensors. Each program
    reads its tile alone: no scan along the row."""
    i_bh = tl.program_id(1).to(tl.int64)
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, BLOCK_V)
    inside = rows < N
    mask = inside[:, None] & (cols < DV)[None, :]
    at = (i_bh * N + rows[:, None]) * DV + cols[None, :]
    r = _first_row(seg, i_bh // H, rows, N, R, HAS_SEG)
    known = inside & (r < R)
    cell = first + (tl.where(known, r, 0) * H + i_bh % H) * (1 + DV)
    key_first = tl.load(cell, mask=known, other=N)
    value_first = tl.load(cell[:, None] + 1 + cols[None, :], mask=mask & known[:, None], other=N)
    since = tl.minimum(key_first[:, None], value_first)
    marks = tl.load(query + i_bh * N + rows, mask=inside, other=0.0).to(tl.float32)[:, None]
    marks += tl.where(rows[:, None] >= since, float("nan"), 0.0)
    total = tl.load(out + at, mask=mask, other=0.0).to(tl.float32) + marks
    tl.store(res + at, total.to(res.dtype.element_ty), mask=mask)


def _blocks(D: int) -> tuple[int, int]:
    BLOCK_D = next_power_of_2(D)
    return max(1, min(TILE // BLOCK_D, 128)), BLOCK_D


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, phi: int,
            lengths: torch.Tensor | None = None, segments: torch.Tensor | None = None,
            count: int = 0) -> tuple:
    """(φ(q), φ(k), v's finite part, contiguous and in their inputs' dtypes; the marks of q and k
    (B, H, N, 1) and of v (B, H, N, Dv); `first_marked`'s buffer, filled) of q, k (B, H, N, Dk)
    and v (B, H, N, Dv) in any layout. `lengths` (B,) integers: positions from lengths[b] on are
    padding, read as 0 (φ(0) for q; φ(k) and v 0 there). `segments` (N,) integers of one packed
    row (B = 1): each position's sequence, of `count`; the first marks are then per sequence."""
    B, H, N, DK = q.shape
    DV = v.shape[3]
    check_grid(B * H)
    sources = [as_dtype(t, kernel_dtype(t.dtype)) for t in (q, k, v)]
    features = [torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in sources]
    marks = [torch.empty(B, H, N, width, dtype=t.dtype, device=t.device)
             for t, width in zip(sources, (1, 1, DV))]
    rows = B if segments is None else count
    first = first_marked(rows, H, N, DV, q.device)
    BLOCK_N, BLOCK_D = _blocks(max(DK, DV))
    if B * H * N:
        with device_of(q), launch_plan(("features", phi, count, *(t.stride() for t in sources),
                                        *described(*sources, lengths, segments))):
            direct(finite_features_fwd)[(cdiv(N, BLOCK_N), B * H, 3)](
                *sources, *features, *marks, sources[0] if lengths is None else lengths,
                first if segments is None else segments, first, rows, N, H, *sources[0].stride(),
                *sources[1].stride(), *sources[2].stride(), DK=DK, DV=DV, PHI=phi,
                HAS_LEN=lengths is not None, HAS_SEG=segments is not None, BLOCK_N=BLOCK_N, BLOCK_D=BLOCK_D)
    inputs = (q, k, v)
    return (*(as_dtype(y, x.dtype) for y, x in zip(features, inputs)),
            *(as_dtype(m, x.dtype) for m, x in zip(marks, inputs)), first)


def backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grads: list, phi: int,
             lengths: torch.Tensor | None = None) -> list:
    """The gradients of q, k and v, each in its own layout, from those of forward's φ(q), φ(k) and
    v's finite part (`grads`)."""
    B, H, N, DK = q.shape
    DV = v.shape[3]
    sources = [as_dtype(t, kernel_dtype(t.dtype)) for t in (q, k, v)]
    grads = [as_dtype(g, s.dtype).contiguous() for g, s in zip(grads, sources)]
    out = [torch.empty_like(s) for s in sources]
    BLOCK_N, BLOCK_D = _blocks(max(DK, DV))
    if B * H * N:
        with device_of(q), launch_plan(("feature grads", phi, *(t.stride() for t in sources),
                                        *described(*sources, lengths, *grads))):
            direct(finite_features_bwd)[(cdiv(N, BLOCK_N), B * H, 3)](
                *sources, *grads, *out, sources[0] if lengths is None else lengths, N, H,
                *sources[0].stride(), *sources[1].stride(), *sources[2].stride(), *out[0].stride(),
                *out[1].stride(), *out[2].stride(), DK=DK, DV=DV, PHI=phi, HAS_LEN=lengths is not None,
                BLOCK_N=BLOCK_N, BLOCK_D=BLOCK_D)
    return [as_dtype(d, x.dtype) for d, x in zip(out, (q, k, v))]


class FiniteFeatures(torch.autograd.Function):
    """`forward`'s seven results, the features differentiable in q, k and v (one autograd node and
    one launch each way for the three)."""

    @staticmethod
    def forward(ctx, q, k, v, phi: int, lengths, segments=None, count: int = 0):
        results = forward(q, k, v, phi, lengths, segments, count)
        ctx.save_for_backward(q, k, v, lengths)
        ctx.phi = phi
        ctx.mark_non_differentiable(*results[3:])
        ctx.set_materialize_grads(False)           # no zeros filled for the marks
        return results

    @staticmethod
    def backward(ctx, gq, gk, gv, *_marks):
        q, k, v, lengths = ctx.saved_tensors
        given = (gq, gk, gv)
        need = [wanted and g is not None for wanted, g in zip(ctx.needs_input_grad[:3], given)]
        if not any(need):
            return (None,) * 7
        grads = [torch.zeros_like(x) if g is None else g for g, x in zip(given, (q, k, v))]
        dq, dk, dv = backward(q, k, v, grads, ctx.phi, lengths)
        return (dq if need[0] else None, dk if need[1] else None, dv if need[2] else None) + (None,) * 4


def first_marked(rows: int, H: int, N: int, DV: int, device) -> torch.Tensor:
    """The buffer that `forward` fills for `marked_output`: (rows, H, 1 + DV) int32 (rows: batch
    rows, or packed sequences), all N (no mark yet); the keys take column 0, the values 1 to DV."""
    return torch.full((rows, H, 1 + DV), N, dtype=torch.int32, device=device)


def marked_output(out: torch.Tensor, query: torch.Tensor, first: torch.Tensor,
                  segments: torch.Tensor | None = None) -> torch.Tensor:
    """out (B, H, N, Dv) with the causal marks of query (B, H, N, 1) and of the keys and values
    whose first marked positions `first` (`first_marked`: per batch row, or per packed sequence of
    `segments` (N,), B = 1) holds, a new tensor in out's dtype."""
    B, H, N, DV = out.shape
    source = as_dtype(out, kernel_dtype(out.dtype)).contiguous()
    query = as_dtype(query, kernel_dtype(query.dtype)).contiguous()
    res = torch.empty_like(source)
    BLOCK_V = next_power_of_2(DV)
    if res.numel():
        with device_of(out), launch_plan(("marks", *described(source, query, first, segments))):
            BLOCK_N = max(1, min(TILE // BLOCK_V, 128))
            direct(mark_causal_kernel)[(cdiv(N, BLOCK_N), B * H)](
                source, query, first if segments is None else segments, first, res, first.shape[0], N, H,
                DV=DV, HAS_SEG=segments is not None, BLOCK_N=BLOCK_N, BLOCK_V=BLOCK_V)
    return as_dtype(res, out.dtype)


class MarkedOutput(torch.autograd.Function):
    """`marked_output`, differentiable in out (the marks carry no gradient: out's passes through)."""

    @staticmethod
    def forward(ctx, out, query, first, segments=None):
        return marked_output(out, query, first, segments)

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None, None

"""The finite parts, a built-in feature map and the NaN marks of nonfinite.NonFiniteMarks in one pass
per tensor, forward and backward, for the Triton path in eager mode.

In PyTorch ops the marks cost q, k and v each a nan_to_num, a multiplication by 0 (and for q, k a
sum) and φ forward, and backward φ's gradient and nan_to_num's (isfinite: four more passes), a
`where` each for padding, and a copy to contiguous for heads transposed out of (B, N, H, D): 43
aten ops and 6.6× the attention's ideal bytes per forward+backward at B1-H8-T1024, D 64, bf16
(8.5× padded), against 3.3× for the attention kernels themselves (docs/benchmarks.md). Here each
tensor is read once and written once forward (read in any layout, written contiguous, as the
attention kernels take it) and read twice and written once backward. The results are nonfinite's
after attend.mask_keys: φ(x·[x finite]) with x's non-finite entries and padding as 0, the marks 0
where finite and NaN where not (per row of q and k, per entry of v), and the gradient
g·φ′·[x finite] (a product, as nan_to_num's backward: an upstream NaN stays), 0 at padding.
`marked_output` then adds the causal marks to the attention's output of unpacked rows in one
kernel, where NonFiniteMarks.causal takes three adds and a cumsum."""

import torch
import triton
import triton.language as tl

from ...triton_launch import cdiv, direct, next_power_of_2
from .fused_recurrent import _feature, _mark
from .utils import check_grid, device_of, kernel_dtype

# Elements per program: one (BLOCK_N, BLOCK_D) tile.
TILE = 4096


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
def _read_tile(x, lengths, N, H, sxb, sxh, sxn, sxd, D: tl.constexpr, HAS_LEN: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """This program's tile of x (grid (cdiv(N, BLOCK_N), B·H)) in fp32, padding read as 0: its row
    i_bh, positions, columns, in-bounds mask, which positions are real (a column) and the values."""
    i_bh = tl.program_id(1).to(tl.int64)
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, BLOCK_D)
    mask = (rows < N)[:, None] & (cols < D)[None, :]
    real = _real(lengths, i_bh // H, rows, HAS_LEN)[:, None]
    value = tl.load(x + _strided(i_bh, H, rows, cols, sxb, sxh, sxn, sxd), mask=mask & real, other=0.0)
    return i_bh, rows, cols, mask, real, value.to(tl.float32)


@triton.jit
def finite_features_fwd(x, y, marks, lengths, first, first_row, N, H, sxb, sxh, sxn, sxd, D: tl.constexpr,
                        PHI: tl.constexpr, ROW_MARKS: tl.constexpr, HAS_LEN: tl.constexpr,
                        ZERO_PAD: tl.constexpr, HAS_FIRST: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_D: tl.constexpr):
    """Grid (cdiv(N, BLOCK_N), B·H). y (B, H, N, D) contiguous: φ of x's finite part; marks
    (B, H, N) per row (ROW_MARKS: NaN where any entry of the row is not finite) or (B, H, N, D).
    HAS_LEN: positions from `lengths[b]` on are padding, read as 0 (attend.mask_keys): no marks,
    φ(0), or 0 with ZERO_PAD (for keys, masked again after φ). HAS_FIRST: `first` (row i_bh at
    i_bh·first_row; one int32 per column, or one per row with ROW_MARKS) gets the first marked
    position by atomic min (it holds N or less before), for mark_causal_kernel."""
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
        if HAS_FIRST:
            earliest = tl.min(tl.where(row_mark == 0.0, N, rows), axis=0)
            tl.atomic_min(first + i_bh * first_row, earliest, mask=earliest < N)
    else:
        tl.store(marks + out, mark.to(marks.dtype.element_ty), mask=mask)
        if HAS_FIRST:
            earliest = tl.min(tl.where(mark == 0.0, N, rows[:, None]), axis=0)
            tl.atomic_min(first + i_bh * first_row + cols, earliest, mask=(cols < D) & (earliest < N))


@triton.jit
def finite_features_bwd(x, g, dx, lengths, N, H, sxb, sxh, sxn, sxd, sdb, sdh, sdn, sdd, D: tl.constexpr,
                        PHI: tl.constexpr, HAS_LEN: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_D: tl.constexpr):
    """Grid as forward: dx (x's shape, strides sd*) = g·φ′(x's finite part)·[x finite], g (B, H, N, D)
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
def mark_causal_kernel(out, query, first, res, N, DV: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_V: tl.constexpr):
    """Grid (cdiv(N, BLOCK_N), B·H): res = out + query_i, and NaN at i from the row's first marked
    key in it on (first (B·H, 1 + DV): the first position with a non-finite key in column 0, with a
    non-finite value entry in column 1 + c; N where none): the causal marks of
    nonfinite.NonFiniteMarks.causal, whose cumsum of 0/NaN marks is NaN exactly from there on, on
    (B, H, N, ·) contiguous tensors. Each program reads its tile alone: no scan along the row."""
    i_bh = tl.program_id(1).to(tl.int64)
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, BLOCK_V)
    inside = rows < N
    mask = inside[:, None] & (cols < DV)[None, :]
    at = (i_bh * N + rows[:, None]) * DV + cols[None, :]
    row_first = first + i_bh * (1 + DV)
    since = tl.minimum(tl.load(row_first), tl.load(row_first + 1 + cols, mask=cols < DV, other=N))
    marks = tl.load(query + i_bh * N + rows, mask=inside, other=0.0).to(tl.float32)[:, None]
    marks += tl.where(rows[:, None] >= since[None, :], float("nan"), 0.0)
    total = tl.load(out + at, mask=mask, other=0.0).to(tl.float32) + marks
    tl.store(res + at, total.to(res.dtype.element_ty), mask=mask)


def _blocks(D: int) -> tuple[int, int]:
    BLOCK_D = next_power_of_2(D)
    return max(1, min(TILE // BLOCK_D, 128)), BLOCK_D


def forward(x: torch.Tensor, phi: int, row_marks: bool, lengths: torch.Tensor | None = None,
            zero_pad: bool = False, first: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(φ(finite part) contiguous, marks (B, H, N, 1) or (B, H, N, D)) of x (B, H, N, D), in x's
    dtype; `lengths` (B,) integers: positions from lengths[b] on read as 0 (φ(0), or 0 with
    zero_pad). `first`: an int32 (B, H, 1 or D) view of a contiguous buffer filled with N, which
    gets each column's first marked position (`first_marked`)."""
    B, H, N, D = x.shape
    check_grid(B * H)
    source = x.to(kernel_dtype(x.dtype))
    y = torch.empty(B, H, N, D, dtype=source.dtype, device=x.device)
    marks = torch.empty(B, H, N, 1 if row_marks else D, dtype=source.dtype, device=x.device)
    BLOCK_N, BLOCK_D = _blocks(D)
    if y.numel():
        with device_of(x):
            direct(finite_features_fwd)[(cdiv(N, BLOCK_N), B * H)](
                source, y, marks, source if lengths is None else lengths, marks if first is None else first,
                0 if first is None else first.stride(1), N, H, *source.stride(), D=D, PHI=phi,
                ROW_MARKS=row_marks, HAS_LEN=lengths is not None, ZERO_PAD=zero_pad,
                HAS_FIRST=first is not None, BLOCK_N=BLOCK_N, BLOCK_D=BLOCK_D)
    return y.to(x.dtype), marks.to(x.dtype)


def backward(x: torch.Tensor, grad: torch.Tensor, phi: int,
             lengths: torch.Tensor | None = None) -> torch.Tensor:
    """The gradient of forward's first result with respect to x, in x's layout."""
    B, H, N, D = x.shape
    source = x.to(kernel_dtype(x.dtype))
    grad = grad.to(source.dtype).contiguous()
    dx = torch.empty_like(source)
    BLOCK_N, BLOCK_D = _blocks(D)
    if dx.numel():
        with device_of(x):
            direct(finite_features_bwd)[(cdiv(N, BLOCK_N), B * H)](
                source, grad, dx, source if lengths is None else lengths, N, H, *source.stride(),
                *dx.stride(), D=D, PHI=phi, HAS_LEN=lengths is not None, BLOCK_N=BLOCK_N, BLOCK_D=BLOCK_D)
    return dx.to(x.dtype)


class FiniteFeatures(torch.autograd.Function):
    """φ(x's finite part) and x's marks (no gradient), differentiable in x; `lengths` and
    `zero_pad` and `first` as in `forward`."""

    @staticmethod
    def forward(ctx, x, phi: int, row_marks: bool, lengths, zero_pad: bool, first=None):
        y, marks = forward(x, phi, row_marks, lengths, zero_pad, first)
        ctx.save_for_backward(x, lengths)
        ctx.phi = phi
        ctx.mark_non_differentiable(marks)
        ctx.set_materialize_grads(False)           # no zeros filled for the marks, nor for an unused y
        return y, marks

    @staticmethod
    def backward(ctx, grad, _marks):
        x, lengths = ctx.saved_tensors
        if grad is None or not ctx.needs_input_grad[0]:
            return None, None, None, None, None, None
        return backward(x, grad, ctx.phi, lengths), None, None, None, None, None


def first_marked(B: int, H: int, N: int, DV: int, device) -> torch.Tensor:
    """The buffer that `forward` fills for `marked_output`: (B, H, 1 + DV) int32, all N (no mark
    yet); the keys' calls take column 0, the values' columns 1 to DV."""
    return torch.full((B, H, 1 + DV), N, dtype=torch.int32, device=device)


def marked_output(out: torch.Tensor, query: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
    """out (B, H, N, Dv) with the causal marks of query (B, H, N, 1) and of the keys and values
    whose first marked positions `first` (`first_marked`) holds, a new tensor in out's dtype."""
    B, H, N, DV = out.shape
    source = out.to(kernel_dtype(out.dtype)).contiguous()
    query = query.to(kernel_dtype(query.dtype)).contiguous()
    res = torch.empty_like(source)
    BLOCK_V = next_power_of_2(DV)
    if res.numel():
        with device_of(out):
            BLOCK_N = max(1, min(TILE // BLOCK_V, 128))
            direct(mark_causal_kernel)[(cdiv(N, BLOCK_N), B * H)](
                source, query, first, res, N, DV=DV, BLOCK_N=BLOCK_N, BLOCK_V=BLOCK_V)
    return res.to(out.dtype)


class MarkedOutput(torch.autograd.Function):
    """`marked_output`, differentiable in out (the marks carry no gradient: out's passes through)."""

    @staticmethod
    def forward(ctx, out, query, first):
        return marked_output(out, query, first)

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None

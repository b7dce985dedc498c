"""The scan that carries eq. 12's states across chunks (Momentum Transformer, eq. 12, read per
chunk): y[t] = a[t]·y[t−1] + u[t], with a restarting wherever a sequence starts (a = 0 there).

Causality holds entry by entry: `entering` shifts the chunk contributions by one before the scan,
so the contribution of chunk c′ never meets, even with weight 0, the state entering a chunk
c ≤ c′ (inf·0 = NaN). Decay powers are float64 products, cast once where they are used."""
import math
from typing import Optional, Union

import torch

from ..exporting import exported_scan, exports_a_symbolic

SCAN_BLOCK = 16


def entering(local: torch.Tensor, decay: float, first: Optional[torch.Tensor],
             restart: Optional[torch.Tensor]) -> torch.Tensor:
    """The state entering each chunk (dim 2 of local (B, H, T, ...), the state each chunk adds
    from a zero start): y[t] = restart[t] (0 if None) where a sequence starts at chunk t, else
    decay·y[t−1] + local[t−1]. first (T,) bool marks the starting chunks; None: only chunk 0
    starts (one sequence per row), and restart (B, H, 1, ...) is read there."""
    zero = torch.zeros((), dtype=local.dtype, device=local.device)
    start = zero if restart is None else restart
    if first is None and exports_a_symbolic(local.shape[2]):
        return _exported_entering(local, decay, start)
    if first is None:
        head = torch.broadcast_to(start, (*local.shape[:2], 1, *local.shape[3:]))
        return affine_scan(decay, shifted_by_one(local, head))
    shifted = shifted_by_one(local, torch.zeros_like(local[:, :, :1]))
    flag = first.view(1, 1, -1, *([1] * (local.dim() - 3)))
    a = torch.where(first, torch.zeros((), dtype=torch.float64, device=first.device),
                    torch.full((), decay, dtype=torch.float64, device=first.device))
    return affine_scan(a, torch.where(flag, start, shifted))


def shifted_by_one(u: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
    """head (B, H, 1, ...) then u[:, :, :−1] along dim 2. Traced, the slice is taken after the
    concatenation: a slice of T − 1 makes T = 2 (a size 1) a graph of its own under dynamic shapes."""
    if torch.compiler.is_compiling():
        return torch.cat([head, u], 2)[:, :, :-1]
    return torch.cat([head, u[:, :, :-1]], 2)


def affine_scan(a: Union[float, torch.Tensor], u: torch.Tensor) -> torch.Tensor:
    """y[t] = a[t]·y[t−1] + u[t] with y[−1] = 0, along dim 2 of u (B, H, T, ...); a is one float
    for every t or a float64 tensor (T,). a = 1 is a cumulative sum. Otherwise up to SCAN_BLOCK
    steps run as the recurrence (by doubling, `_recurrence`); longer scans run it inside blocks of
    SCAN_BLOCK and recurse on the block totals (O(log T) levels), each y[t] reading only u[t′ ≤ t].
    Traced (torch.compile), every T takes the blocks, padded, so that with dynamic shapes the graph
    depends on the number of levels only, not on T (a loop of T steps would fix T; dynamo reports
    a symbolic T as an int, so the choice cannot follow the type)."""
    if isinstance(a, float) and a == 1.0:
        return u.cumsum(2)
    B, H, T = u.shape[:3]
    width = math.prod(u.shape[3:])                  # explicit, so that B = 0 reshapes too
    return _scan_rows(a, u.reshape(B, H, T, width)).reshape(u.shape)


def _scan_rows(a: Union[float, torch.Tensor], flat: torch.Tensor) -> torch.Tensor:
    """affine_scan on flat (B, H, T, W), with views only (no reshape of a strided input, whose
    stride checks would add guards on T under dynamic shapes)."""
    B, H, T, width = flat.shape
    traced = torch.compiler.is_compiling()
    if not traced and T <= SCAN_BLOCK:
        return _recurrence(a, flat)
    G = SCAN_BLOCK
    ng = T // G + 1 if traced else -(-T // G)       # traced, never a pad of 0 (a size 0 is a graph)
    pad = ng * G - T
    padded = torch.cat([flat, flat.new_zeros(B, H, pad, width)], 2) if traced or pad else flat
    u_blocks = padded.unflatten(2, (ng, G))
    if isinstance(a, float):
        reach = torch.tensor(a, dtype=torch.float64) ** torch.arange(1, G + 1, dtype=torch.float64)
        a_within, a_blocks = a, a ** G                          # a float: no tensor is read back
        reach = reach[None].expand(ng, G)
    else:
        blocks = torch.cat([a, a.new_ones(pad)]).reshape(ng, G)
        reach = blocks.cumprod(1)                                       # Π a over the block so far
        a_within, a_blocks = blocks.transpose(0, 1), reach[:, -1]
    within = _recurrence(a_within, u_blocks.transpose(2, 3)).transpose(2, 3)     # from a zero start
    if traced and ng == 1:                  # with dynamic shapes a guard on T < G, not on T
        return _owned(within[:, :, 0, :T])
    ends = _scan_rows(a_blocks, within[:, :, :, -1])                    # y at the end of each block
    before = shifted_by_one(ends, torch.zeros_like(ends[:, :, :1]))
    reach = reach.to(dtype=flat.dtype, device=flat.device)
    y = within + reach[None, None, :, :, None] * before[:, :, :, None]
    y = y.flatten(2, 3)[:, :, :T]
    return _owned(y) if traced else y


def _owned(view: torch.Tensor) -> torch.Tensor:
    """A traced scan's result in memory of its own. A view into the padded blocks, where the
    backward saves it, inductor stores compactly, and torch (2.13) then gives the backward's input
    the first call's strides as numbers: under dynamic shapes the next length failed
    assert_size_stride (pytorch/pytorch#191885)."""
    return view.contiguous()


def _recurrence(a: Union[float, torch.Tensor], u: torch.Tensor) -> torch.Tensor:
    """y[t] = a[t]·y[t−1] + u[t] along dim 2 of u (a short axis: SCAN_BLOCK at most); a float, or
    a float64 tensor (T, ...) broadcast against u's dims 3... By doubling (Hillis–Steele): after
    the step of span d, y[t] sums the u[t′] of t − 2d < t′ ≤ t, and a[t] is the product of the
    a over (t − 2d, t]. log₂ T steps of a few ops each instead of T − 1, which under dynamic shapes
    halves the traced graph and its compile time; every step reads only earlier entries (the
    shift brings in zeros, never a later entry)."""
    T = u.shape[2]
    if not isinstance(a, float):
        a = a.reshape(*a.shape, *([1] * (u.dim() - 2 - a.dim())))
    y, d = u, 1
    while d < T:
        gain = a ** d if isinstance(a, float) else a.to(dtype=u.dtype, device=u.device)
        y = y + gain * _shifted(y, 2, d, 0.0)
        if not isinstance(a, float) and 2 * d < T:
            a = a * _shifted(a, 0, d, 1.0)
        d *= 2
    return y


def _shifted(t: torch.Tensor, dim: int, d: int, fill: float) -> torch.Tensor:
    """t moved d entries later along dim, `fill` in the first d, the last d dropped: one pad op
    (a negative pad at the end crops)."""
    return torch.nn.functional.pad(t, [0, 0] * (t.dim() - 1 - dim) + [d, -d], value=fill)


def _exported_entering(local: torch.Tensor, decay: float, start: torch.Tensor) -> torch.Tensor:
    """`entering` with one sequence per row under torch.export with a dynamic length (the chunk
    count T symbolic), with no Python loop, branch or slice on T, each of which would fix it (a
    slice's contiguity check guards T − 1 = 1). A decay of 1 (s and z) is the cumulative sum of
    local shifted by one chunk (a gather after a zero chunk). Another (m′) is torch's scan over
    the chunks, y[t] then decay·y[t] + local[t]: an ONNX Scan, O(T); the (T, T) product of decay
    powers it replaced took 6.6× its time in onnxruntime at 256 chunks (docs/benchmarks.md)."""
    if decay == 1.0:
        ahead = torch.cat([local.new_zeros(*local.shape[:2], 1, *local.shape[3:]), local], 2)
        shifted = ahead.index_select(2, torch.arange(local.shape[2], device=local.device))
        return shifted.cumsum(2) + start
    first = torch.broadcast_to(start, (*local.shape[:2], 1, *local.shape[3:]))[:, :, 0].contiguous()
    # a tensor: torch 2.15 runs an eager scan through dynamo, which refuses a float it closes over
    gain = torch.full((), decay, dtype=local.dtype, device=local.device)

    def chunk(state, gained):
        # the scan's output may not alias its carry
        return gain * state + gained, state.clone()

    return exported_scan(chunk, first, local.movedim(2, 0))[1].movedim(0, 2)

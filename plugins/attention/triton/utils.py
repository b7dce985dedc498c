"""Shared pieces of the Triton kernels: the β-power coefficients of eq. 12/13, computed in-kernel
without cancellation, and the matmul precision rules. States, denominators and all matmul
accumulators are fp32 (fp64 for fp64 input). Matmul operands: φ(q)φ(k)ᵀ in the input dtype;
operands holding fp32 values (states, weighted keys, scaled gradients) in bf16 for bf16 inputs
(bf16 has fp32's range), in fp32 as tf32 for fp16 inputs (fp16 would overflow on long sequences),
exact fp32/fp64 for fp32/fp64 inputs — except that fp32 inputs take tf32 dots (tensor cores,
every operand of every dot rounded to tf32) where torch allows it for its own float32 matmuls:
`torch.get_float32_matmul_precision()` "high" or "medium", read when the kernels are launched
(`kernel_flags`; torch's default "highest" keeps exact fp32).

Tolerances against float64 on the same inputs, relative RMS: exact fp32 1e-4 (outputs, states
and gradients; tests/test_attention_triton.py), its dots in fp32 FMA or as six bf16 products
(`exact_fp32_dots`): each operand split into bf16 parts of 8 significant bits (24 in all, fp32's),
the three products below 2⁻¹⁶ of the leading one left out, so a product's error stays near fp32's
2⁻²⁴. tf32 keeps 10 of fp32's 23 mantissa bits: an
operand error up to 2⁻¹¹ ≈ 4.9e-4 rounded, 2⁻¹⁰ and biased towards zero where the tensor cores
truncate. An output passes through two or three such dots; the states entering late chunks add
their own operands' error, so the error grows with the position towards ~3 × 2⁻¹¹ (truncated
tf32 emulated in the interpreter: 1.0e-3 at N = 70, 1.4e-3 over the last quarter of N = 1024);
a gradient passes through up to six, with cancellation between the numerator's and the
denominator's terms. Stated tolerances: outputs and final states within 5e-3, gradients within
1e-2 (tests/test_attention_triton.py with tf32 emulated, tests/test_attention_gpu.py on a GPU).
bf16 inputs (8 significant bits, rounding error up to 2⁻⁹ ≈ 2e-3) against float64 on the same
bf16 values: outputs and states within 1e-2, gradients within 3e-2 (derived in
tests/test_attention_gpu.py::test_bf16_kernels_match_float64_on_the_same_inputs)."""
import contextlib
import functools
import math
import os

import torch
import triton
import triton.language as tl

from ...triton_launch import cdiv, next_power_of_2
from ..checks import as_dtype

PROGRAMS_PER_SM = 2
H100_SMS = 132          # CPU tensors (the interpreter, the stand-in launch driver): size for an H100


@functools.lru_cache(maxsize=16)
def sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return H100_SMS


@triton.jit
def expm1(x):
    """exp(x) − 1 without cancellation, from exp alone (which may be a fast approximation on GPU):
    for |x| < 1/2 the Taylor series x(1 + x/2(1 + x/3(1 + …))), to 18 terms in fp64 and 10 in
    fp32 (truncation 0.5⁹/10! ≈ 5e-10, below fp32 rounding; every term is work on each of the
    BT² weights, so fp32 does not pay for fp64's), beyond it exp(x) − 1, where nothing cancels."""
    TERMS: tl.constexpr = 18 if x.dtype == tl.float64 else 10
    small = tl.abs(x) < 0.5
    xs = tl.where(small, x, 0.0)
    series = tl.full(x.shape, 1.0, x.dtype)
    for i in tl.static_range(TERMS - 1):
        series = 1.0 + xs * series * (1.0 / (TERMS - i))
    return tl.where(small, xs * series, tl.exp(x) - 1.0)


@triton.jit
def geometric(n, log_beta, inv_one_minus_beta):
    """(1 − β^n)/(1 − β) = Σ_{t<n} β^t for β in (0, 1), from log β: −expm1(n log β)/(1 − β)."""
    return -expm1(n * log_beta) * inv_one_minus_beta


@triton.jit
def carried(span, log_beta, inv_one_minus_beta, gamma, beta, MOMENTUM: tl.constexpr):
    """carry(ℓ) = γβ(1 − β^ℓ)/(1 − β) and β^ℓ over a span of ℓ tokens: how a state moves across
    tokens that add nothing (Momentum Transformer, eq. 12 composed); zeros without momentum."""
    ACC: tl.constexpr = log_beta.dtype
    if MOMENTUM:
        ell = span.to(ACC)
        return gamma * beta * geometric(ell, log_beta, inv_one_minus_beta), tl.exp(ell * log_beta)
    else:
        return gamma * 0.0, gamma * 0.0


@triton.jit
def compose(S, M, dS, dM, carry, decay, MOMENTUM: tl.constexpr, REVERSE: tl.constexpr):
    """A state (S, M = m′ = −m) carried over a span of ℓ tokens that added (ΔS, ΔM) from zero,
    Momentum Transformer eq. 12 composed, with (carry, decay) = (carry(ℓ), β^ℓ) from `carried`:
      forward  S ← S + carry(ℓ)·M + ΔS,   M ← β^ℓ·M + ΔM;
      REVERSE (their gradients, from the span's end to its start)
               M ← β^ℓ·M + carry(ℓ)·S + ΔM,   S ← S + ΔS.
    Without momentum only S ← S + ΔS (M is returned as it came)."""
    if MOMENTUM:
        if REVERSE:
            M = decay * M + carry * S + dM
        else:
            S += carry * M
            M = decay * M + dM
    return S + dS, M


@triton.jit
def mixed_dot(a, b, LOW: tl.constexpr, IEEE: tl.constexpr):
    """a @ b where one side holds fp32 (fp64) values: bf16 inputs cast both to bf16 (the fla
    convention; bf16 has fp32's range), otherwise both go in fp32/fp64 so fp16 states cannot
    overflow (tf32 for fp16 inputs and for fp32 inputs where torch allows tf32, exact fp32
    otherwise)."""
    if LOW:
        return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16))
    elif IEEE:
        acc = tl.float64 if a.dtype == tl.float64 or b.dtype == tl.float64 else tl.float32
        return raw_dot(a.to(acc), b.to(acc), IEEE)
    else:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="tf32")


# IEEE's values: False (tensor-core dots), True (exact fp32/fp64 dots on the CUDA cores) or BF16X6
# (exact fp32's dots as six bf16 tensor-core products, `exact_fp32_dots`).
BF16X6 = tl.constexpr(2)


@triton.jit
def raw_dot(a, b, IEEE: tl.constexpr):
    """a @ b of two input tensors in their own dtype (tensor cores for bf16/fp16; tf32 for fp32
    unless IEEE, named here rather than left to TRITON_F32_DEFAULT), fp32 accumulate. IEEE ==
    BF16X6: each fp32 operand split into three bf16 parts, the six products that reach fp32's
    precision summed in fp32 on the tensor cores (Triton's "bf16x6")."""
    if IEEE == BF16X6:
        return tl.dot(a, b, input_precision="bf16x6")
    elif IEEE:
        return tl.dot(a, b, input_precision="ieee")
    elif a.dtype == tl.float32:
        return tl.dot(a, b, input_precision="tf32")
    else:
        return tl.dot(a, b)


@triton.jit
def finite(x):
    return tl.abs(x) < float("inf")


@functools.lru_cache(maxsize=64)
def coefficients(momentum: float, step_size: float, eps: float, dtype: torch.dtype,
           device: torch.device) -> torch.Tensor:
    """[log β, 1/(1 − β), γ, eps, β] as a small tensor in the accumulator dtype (scalar kernel
    arguments would be rounded to fp32). Cached per value and device: building it is a host to
    device copy, which synchronises the host with the GPU (no queueing ahead) and cannot be
    captured in a CUDA graph; the kernels only read it."""
    log_beta = math.log(momentum) if momentum > 0 else 0.0
    return torch.tensor([log_beta, 1.0 / (1.0 - momentum), step_size, eps, momentum], dtype=dtype,
                        device=device)


def accumulator_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


# Triton reads TRITON_INTERPRET once, when imported; so do the launchers (a lookup per call cost host time)
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def kernel_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the kernels take inputs of `dtype` in: itself, but fp32 for bf16 under
    TRITON_INTERPRET (the interpreter stores bf16 as raw 16-bit integers and its tl.dot multiplies
    those; the bf16 kernels are exercised on GPU only)."""
    if INTERPRETED and dtype == torch.bfloat16:
        return torch.float32
    return dtype


def kernel_inputs(*tensors: torch.Tensor) -> tuple:
    """The tensors in their promoted dtype (the kernels' matmuls take two operands of one dtype;
    `kernel_dtype` of it), contiguous (the kernels assume it)."""
    dtype = tensors[0].dtype
    if kernel_dtype(dtype) == dtype:         # as they come, most often (a decoding step's q, k, v)
        for t in tensors:
            if t.dtype != dtype or not t.is_contiguous():
                break
        else:
            return tensors
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    dtype = kernel_dtype(dtype)
    return tuple(as_dtype(t, dtype).contiguous() for t in tensors)


def tf32_allowed() -> bool:
    """Whether torch lets float32 matmuls use tf32 (torch.set_float32_matmul_precision)."""
    return torch.get_float32_matmul_precision() in ("high", "medium")


FP32_DOTS_VARIABLE = "MOMENTUM_TRITON_FP32_DOTS"
FP32_DOTS = ("auto", "ieee", "bf16x6")


def exact_fp32_dots() -> str:
    """How exact fp32 computes its dots (MOMENTUM_TRITON_FP32_DOTS, read at each call): "auto" (the
    default) as six bf16 tensor-core products in the per-chunk kernels (fwd_o, bwd_dv, bwd_dqk)
    where the device's Triton has them (`bf16x6_dots_run`), fp32 FMA in the state scans and the
    fused kernels; "ieee" fp32 FMA in every kernel; "bf16x6" six bf16 products in every kernel. On an
    H200 (docs/benchmarks.md, 2026-12-04; B16-H16-T1k, D 64, the kept tiles) the per-chunk kernels
    took 1134, 616 and 676 µs with bf16x6 dots against 2524, 1042 and 1026 with FMA, and the scans
    fwd_h and bwd_dh 1065 and 946 against 645 and 407."""
    value = os.environ.get(FP32_DOTS_VARIABLE, "auto")
    if value not in FP32_DOTS:
        raise ValueError(f"{FP32_DOTS_VARIABLE} must be one of {FP32_DOTS}, got {value!r}")
    if value == "bf16x6" and INTERPRETED and not bf16x6_dots_run(torch.device("cpu")):
        raise ValueError(f"{FP32_DOTS_VARIABLE}=bf16x6 needs a GPU: Triton's interpreter "
                         "(TRITON_INTERPRET=1) has no bf16x6 dots; unset it or set it to 'ieee'")
    return value


def bf16x6_dots_run(device: torch.device) -> bool:
    """Whether Triton computes bf16x6 dots for `device`: NVIDIA GPUs from sm_80 (bf16 tensor cores;
    AMD's are untimed here), not the interpreter (its dot precisions are tf32, tf32x3 and ieee)."""
    if INTERPRETED:
        from triton.runtime.interpreter import interpreter_builder
        return "bf16x6" in interpreter_builder.options.allowed_dot_input_precisions
    return _target_has_bf16x6(device)


@functools.lru_cache(maxsize=16)
def _target_has_bf16x6(device: torch.device) -> bool:
    """Per device (the launchers run under `device_of`, so the current target is the device's): a
    lookup per call would read the device's properties at every launch."""
    target = current_target()
    if target.backend != "cuda" or target.arch < 80:
        return False
    from triton.backends.nvidia.compiler import CUDAOptions
    return "bf16x6" in CUDAOptions.allowed_dot_input_precisions


def current_target():
    """The GPU target Triton compiles for on the current device."""
    return triton.runtime.driver.active.get_current_target()


def kernel_flags(dtype: torch.dtype) -> dict:
    """The state scans' and fused kernels' LOW and IEEE. LOW: derived fp32 operands are cast to bf16
    for the tensor cores; IEEE: exact fp32/fp64 dots, for fp64 and for fp32 unless `tf32_allowed()`,
    read here, when the launchers run (inside the custom ops, which torch.compile does not trace):
    fp32 with IEEE False runs the fp16 inputs' rules, every dot in tf32. Exact fp32 takes IEEE =
    BF16X6 under "bf16x6" (`exact_fp32_dots`); fp64 always IEEE dots."""
    ieee = dtype == torch.float64 or (dtype == torch.float32 and not tf32_allowed())
    if ieee and dtype == torch.float32 and exact_fp32_dots() == "bf16x6":
        ieee = BF16X6.value
    return {"LOW": dtype == torch.bfloat16, "IEEE": ieee}


def with_chunk_dots(meta: dict, dtype: torch.dtype, device: torch.device) -> dict:
    """The per-chunk kernels' constants: `meta` (with `kernel_flags`' IEEE), but exact fp32's dots
    as six bf16 products under "auto" where the device's Triton has them."""
    if (meta["IEEE"] is True and dtype == torch.float32 and exact_fp32_dots() == "auto"
            and bf16x6_dots_run(device)):
        return {**meta, "IEEE": BF16X6.value}
    return meta


def chunk_state_dtype(dtype: torch.dtype) -> torch.dtype:
    """Storage of the per-chunk states and their gradients between kernels: bf16 for bf16 inputs,
    since every kernel reading them casts them to bf16 for its matmul (the LOW rule), so storing
    them rounded changes no result and halves their memory and traffic; the accumulator dtype
    otherwise."""
    return torch.bfloat16 if dtype == torch.bfloat16 else accumulator_dtype(dtype)


def device_of(t: torch.Tensor):
    """Launches go to the stream of the current CUDA device: make it the tensors' device (a model
    on cuda:1 while cuda:0 is current)."""
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


@functools.lru_cache(maxsize=256)
def block(dim: int, cap: int = 64) -> int:
    """Tile size along a head dimension: a power of two, at least 16 (tl.dot's minimum)."""
    return max(16, min(cap, next_power_of_2(dim)))


GRID_LIMIT = 65535            # CUDA's limit on a grid's second and third dimensions


def check_grid(batch_heads: int, chunks: int = 1) -> None:
    """The kernels put batch·head and the chunk index on those dimensions: a clear error before a
    launch CUDA would refuse."""
    if batch_heads > GRID_LIMIT:
        raise ValueError(f"batch size × heads = {batch_heads} is more than one launch of the Triton kernels "
                         f"covers ({GRID_LIMIT}); split the batch")
    if chunks > GRID_LIMIT:
        raise ValueError(f"the sequence has {chunks} chunks, more than one launch of the Triton kernels "
                         f"covers ({GRID_LIMIT}); use chunk_size 64 or split the sequence with initial_state")


def chunk_block(chunk_size: int) -> int:
    """The kernels' chunk length: chunk_size rounded up to a power of two in [16, 64]. The result
    does not depend on it beyond rounding (eq. 13 is computed exactly for any chunk)."""
    return max(16, min(64, next_power_of_2(chunk_size)))


def power_of_two_bucket(n: int, low: int, high: int) -> int:
    return max(low, min(high, next_power_of_2(max(n, 1))))


def tuning_buckets(n: int, batch_heads: int) -> dict:
    """The shape part of the autotuning key: the sequence length and batch·heads, each rounded up
    to a power of two, N in [64, 16384] (one chunk to 256) and B·H in [1, 1024]. The best tiles
    change with them (how many programs fill the GPU, how long each scan runs), but not within a
    factor of two, nor past the caps, where the grid fills the GPU many times over. A new pair of
    buckets re-times the kept configs once (kernel arguments, not constants: nothing compiles)."""
    return {"N_BUCKET": power_of_two_bucket(n, 64, 16384),
            "BH_BUCKET": power_of_two_bucket(batch_heads, 1, 1024)}


def tuning_configs() -> list:
    """Tile sizes BK, BV and warps, autotuned per shape on GPU among the few that `prune_scan` /
    `prune_chunk` keep; under the interpreter, where timing means nothing, the one config whose
    tiles fit the head dimension. Every kernel overwrites its outputs, so repeated tuning runs
    are harmless (no reset_to_zero / restore_value)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return [triton.Config({"BK": bk, "BV": bv}, num_warps=4)
                for bk in (16, 32, 64) for bv in (16, 32, 64)]
    return [triton.Config({"BK": bk, "BV": bv}, num_warps=w, num_stages=2)
            for bk in (16, 32, 64) for bv in (16, 32, 64) for w in (4, 8)]


def _prune(configs, named_args, kwargs, warps: int, other: tuple) -> list:
    """Each config is compiled on first use, for each kernel and each combination of key values,
    so few are kept, chosen from the kernels' register needs on sm_90 (ptxas -v): tiles no larger
    than the head dimension's block and at least 32 where it allows, with `warps`, plus the
    (BK, BV, warps) in `other`. fp32/fp64 inputs with exact dots (CUDA cores: slow to compile, and
    with 4 warps kilobytes of spills) get two: tiles of min(32, block) with 8 warps, and of
    min(16, block) with 4 (at 32 × 32 the momentum scans and bwd_dqk take 255 registers, the
    whole register file of an SM at 8 warps, and bwd_dqk spills: the autotuner times both on the
    GPU). fp32 inputs with
    tf32 dots hold fp32 operand tiles, twice fp16's, and reach 255 registers or spill with 4
    warps: the same tiles with 8 warps only."""
    dk, dv = block(kwargs["DK"]), block(kwargs["DV"])
    if os.environ.get("TRITON_INTERPRET") == "1":
        return [c for c in configs if c.kwargs["BK"] == dk and c.kwargs["BV"] == dv]
    low_k, low_v = min(32, dk), min(32, dv)
    if kwargs["IEEE"]:
        keep = {(low_k, low_v, 8), (min(16, dk), min(16, dv), 4)}
    else:
        keep = {(bk, bv, warps) for bk in (16, 32, 64) for bv in (16, 32, 64)
                if low_k <= bk <= dk and low_v <= bv <= dv}
        keep |= {(min(bk, dk), min(bv, dv), w) for bk, bv, w in other}
        first = next(iter(named_args.values()), None)          # the kernel's first input
        if getattr(first, "dtype", None) == torch.float32:
            keep = {(bk, bv, 8) for bk, bv, _ in keep}
    return [c for c in configs if (c.kwargs["BK"], c.kwargs["BV"], c.num_warps) in keep]


def prune_scan(configs, named_args, **kwargs) -> list:
    """The state scans hold two (BK, BV) fp32 states: 4 warps, and 64 × 64 with 8 (4 spill); of
    those, the tiles that give each SM PROGRAMS_PER_SM programs, where any do (issue 27: one pass
    over 256 rows at D 64 has 256 programs of 64 × 64 tiles, fewer than 2 per SM on an H100, and
    512 or 1024 of smaller ones)."""
    kept = _prune(configs, named_args, kwargs, 4, ((64, 64, 8),))
    first = next(iter(named_args.values()), None)
    return filling(kept, kwargs, getattr(first, "device", torch.device("cpu")))


def filling(configs, kwargs, device: torch.device) -> list:
    """Of `configs`, those whose tiles give a scan over BH_BUCKET rows (batch·heads rounded up to
    a power of two: the tuning key's, so the kept set is the key's alone) PROGRAMS_PER_SM programs
    per SM; all of them where none does (few rows: those are split, split.scan_splits), or where
    the rows are not given (a compile check's constants)."""
    wanted = PROGRAMS_PER_SM * sm_count(device)
    rows = kwargs.get("BH_BUCKET")
    if rows is None:
        return configs
    full = [c for c in configs
            if cdiv(kwargs["DK"], c.kwargs["BK"]) * cdiv(kwargs["DV"], c.kwargs["BV"]) * rows >= wanted]
    return full or configs


# (BK, BV, warps) that the chunk-parallel kernels must not take. Triton 3.6 on an H100 (sm_90),
# 2026-11-25: fwd_o with BK 64, BV 32 and 8 warps faults at its first launch (bf16, D 64:
# compute-sanitizer reports an invalid __shared__ read of 512 bytes in the tensor-core dot of
# mixed_dot), and bwd_dv, which has the same (BT × BK) @ (BK × BV) dot, faulted while tuning on a
# padded bf16 batch with Dv 48. tests/test_attention_gpu.py::test_every_kept_tile_config runs every
# kept config of every kernel on the GPU.
CHUNK_FAULTS = {(64, 32, 8)}


def prune_chunk(configs, named_args, **kwargs) -> list:
    """The chunk-parallel kernels hold several (BT, BT) and (BT, BV) fp32 tiles and spill with 4
    warps at BT = 64 (255 registers): 8 warps, and 32 × 32 with 4; none of CHUNK_FAULTS."""
    return [c for c in _prune(configs, named_args, kwargs, 8, ((32, 32, 4),))
            if (c.kwargs["BK"], c.kwargs["BV"], c.num_warps) not in CHUNK_FAULTS]


def _with_whole_head_tile(kept, configs, named_args, kwargs, side: str) -> list:
    """`kept`, plus for fp32 inputs with exact FMA dots at heads of at most 64 the tile that spans the
    whole head on `side` ("v" or "k"; the other side 16, 8 warps): a program then forms its chunk's
    (BT × BT) product once instead of once per tile of that side. On an H200 (docs/benchmarks.md,
    2026-12-04; B16-H16-T1k, D 64) fwd_o and bwd_dv at (16, 64, 8) took 656 and 639 µs against 1042
    and 1026 at the kept tiles, bwd_dqk at (64, 16, 8) 1784 against 2524; the autotuner times it
    beside them. Not for bf16x6 dots, whose tensor-core dots have never run at these tiles on a GPU
    (bf16's kept tiles do not include them; a tile of bf16's faulted on an H100, CHUNK_FAULTS):
    they compile for sm_90 without spills in fwd_o and bwd_dv and with 204 B in bwd_dqk with
    momentum, and benchmarks/gpu_call.sh times them forced."""
    first = next(iter(named_args.values()), None)          # the kernel's first input
    if (os.environ.get("TRITON_INTERPRET") == "1" or getattr(first, "dtype", None) != torch.float32
            or not kwargs["IEEE"] or kwargs["IEEE"] == BF16X6.value):
        return kept
    dk, dv = kwargs["DK"], kwargs["DV"]
    if max(dk, dv) > 64:
        return kept
    tile = (16, block(dv), 8) if side == "v" else (block(dk), 16, 8)
    return kept + [c for c in configs if (c.kwargs["BK"], c.kwargs["BV"], c.num_warps) == tile
                   and c not in kept and tile not in CHUNK_FAULTS]


def prune_chunk_v(configs, named_args, **kwargs) -> list:
    """fwd_o and bwd_dv, whose programs each own a V tile: `prune_chunk`'s tiles, and for exact
    fp32 one V tile over the whole head (`_with_whole_head_tile`)."""
    return _with_whole_head_tile(prune_chunk(configs, named_args, **kwargs), configs, named_args, kwargs, "v")


def prune_chunk_k(configs, named_args, **kwargs) -> list:
    """bwd_dqk, whose programs each own a K tile: `prune_chunk`'s tiles, and for exact fp32 one K
    tile over the whole head (`_with_whole_head_tile`)."""
    return _with_whole_head_tile(prune_chunk(configs, named_args, **kwargs), configs, named_args, kwargs, "k")


# each chunk-parallel kernel's pruner
CHUNK_PRUNERS = {"fwd_o": prune_chunk_v, "bwd_dv": prune_chunk_v, "bwd_dqk": prune_chunk_k}

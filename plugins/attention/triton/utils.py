"""Shared pieces of the Triton kernels: the β-power coefficients of eq. 12/13, computed in-kernel
without cancellation, and the matmul precision rules. States, denominators and all matmul
accumulators are fp32 (fp64 for fp64 input). Matmul operands: φ(q)φ(k)ᵀ in the input dtype;
operands holding fp32 values (states, weighted keys, scaled gradients) in bf16 for bf16 inputs
(bf16 has fp32's range), in fp32 as tf32 for fp16 inputs (fp16 would overflow on long sequences),
exact fp32/fp64 for fp32/fp64 inputs."""
import math
import os

import torch
import triton
import triton.language as tl

EXPM1_TERMS = tl.constexpr(18)


@triton.jit
def expm1(x):
    """exp(x) − 1 without cancellation, from exp alone (which may be a fast approximation on GPU):
    for |x| < 1/2 the Taylor series x(1 + x/2(1 + x/3(1 + …))) to 18 terms (truncation below
    fp64 rounding), beyond it exp(x) − 1, where nothing cancels."""
    small = tl.abs(x) < 0.5
    xs = tl.where(small, x, 0.0)
    series = tl.full(x.shape, 1.0, x.dtype)
    for i in tl.static_range(EXPM1_TERMS - 1):
        series = 1.0 + xs * series * (1.0 / (EXPM1_TERMS - i))
    return tl.where(small, xs * series, tl.exp(x) - 1.0)


@triton.jit
def geometric(n, log_beta, inv_one_minus_beta):
    """(1 − β^n)/(1 − β) = Σ_{t<n} β^t for β in (0, 1), from log β: −expm1(n log β)/(1 − β)."""
    return -expm1(n * log_beta) * inv_one_minus_beta


@triton.jit
def mixed_dot(a, b, LOW: tl.constexpr, IEEE: tl.constexpr):
    """a @ b where one side holds fp32 (fp64) values: bf16 inputs cast both to bf16 (the fla
    convention; bf16 has fp32's range), otherwise both go in fp32/fp64 so fp16 states cannot
    overflow (tf32 for fp16 inputs, exact fp32 for fp32 inputs)."""
    if LOW:
        return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16))
    elif IEEE:
        acc = tl.float64 if a.dtype == tl.float64 or b.dtype == tl.float64 else tl.float32
        return tl.dot(a.to(acc), b.to(acc), input_precision="ieee")
    else:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="tf32")


@triton.jit
def raw_dot(a, b, IEEE: tl.constexpr):
    """a @ b of two input tensors in their own dtype (tensor cores for bf16/fp16), fp32 accumulate."""
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def finite(x):
    return tl.abs(x) < float("inf")


def params(momentum: float, step_size: float, eps: float, dtype: torch.dtype,
           device: torch.device) -> torch.Tensor:
    """[log β, 1/(1 − β), γ, eps, β] as a small tensor in the accumulator dtype (scalar kernel
    arguments would be rounded to fp32)."""
    log_beta = math.log(momentum) if momentum > 0 else 0.0
    return torch.tensor([log_beta, 1.0 / (1.0 - momentum), step_size, eps, momentum], dtype=dtype,
                        device=device)


def accumulator_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def kernel_flags(dtype: torch.dtype) -> dict:
    """LOW: derived fp32 operands are cast to bf16 for the tensor cores; IEEE: exact fp32/fp64 dots."""
    return {"LOW": dtype == torch.bfloat16, "IEEE": dtype in (torch.float32, torch.float64)}


def block(dim: int, cap: int = 64) -> int:
    """Tile size along a head dimension: a power of two, at least 16 (tl.dot's minimum)."""
    return max(16, min(cap, triton.next_power_of_2(dim)))


def chunk_block(chunk_size: int) -> int:
    """The kernels' chunk length: chunk_size rounded up to a power of two in [16, 64]. The result
    does not depend on it beyond rounding (eq. 13 is computed exactly for any chunk)."""
    return max(16, min(64, triton.next_power_of_2(chunk_size)))


def tuning_configs() -> list:
    """Tile sizes BK, BV and launch settings, autotuned per shape on GPU (`prune` drops tiles
    larger than the head dimension); under the interpreter, where timing means nothing, `prune`
    keeps the one config whose tiles fit the head dimension. Every kernel overwrites its outputs,
    so repeated tuning runs are harmless."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return [triton.Config({"BK": bk, "BV": bv}, num_warps=4)
                for bk in (16, 32, 64) for bv in (16, 32, 64)]
    return [triton.Config({"BK": bk, "BV": bv}, num_warps=w, num_stages=s)
            for bk in (32, 64) for bv in (32, 64) for w in (4, 8) for s in (2, 3)]


def prune(configs, named_args, **kwargs) -> list:
    dk, dv = kwargs["DK"], kwargs["DV"]
    if os.environ.get("TRITON_INTERPRET") == "1":
        return [c for c in configs if c.kwargs["BK"] == block(dk) and c.kwargs["BV"] == block(dv)]
    fitting = [c for c in configs if c.kwargs["BK"] <= block(dk) and c.kwargs["BV"] <= block(dv)]
    return fitting or [c for c in configs if c.kwargs["BK"] == 32 and c.kwargs["BV"] == 32]

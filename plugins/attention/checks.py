"""Tensor checks shared by every form of momentum attention: bad input fails early, naming the
argument and the allowed shapes. Number checks (momentum, step sizes, eps, chunk sizes, backend
names, booleans) are `plugins.validation`'s, the project's one rule set."""
from typing import Optional

import torch

from ..validation import check_choice, check_int

__all__ = ["check_chunk_size", "check_backend", "check_qkv", "check_padding_mask", "check_feature_dims",
           "compute_dtype", "as_dtype", "BACKENDS"]

BACKENDS = ("auto", "torch", "triton")


def check_chunk_size(chunk_size: int) -> int:
    return check_int(chunk_size, "chunk_size", low=1)


def check_backend(backend: str) -> str:
    return check_choice(backend, "backend", BACKENDS)


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool) -> None:
    """q, k: (B, H, Nq|Nk, Dk); v: (B, H, Nk, Dv). Causal attention needs Nq == Nk."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must have shape (batch, heads, length, dim), got {tuple(t.shape)}")
        if not t.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if q.shape[:2] != k.shape[:2] or k.shape[:3] != v.shape[:3]:
        raise ValueError(
            "q, k, v shapes do not match: need q (B, H, Nq, Dk), k (B, H, Nk, Dk), v (B, H, Nk, Dv); "
            f"got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if q.shape[3] != k.shape[3]:
        raise ValueError(f"q and k must have the same last dimension, got {q.shape[3]} and {k.shape[3]}")
    if causal and q.shape[2] != k.shape[2]:
        raise ValueError(
            f"causal attention needs q and k of the same length, got {q.shape[2]} and {k.shape[2]}"
        )


def check_feature_dims(fq: torch.Tensor, fk: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> int:
    """The feature map may change the last dimension (Dk → D′) but nothing else, and must map
    q and k alike. Returns D′, the size of the states' key dimension."""
    for name, mapped, raw in (("q", fq, q), ("k", fk, k)):
        if not isinstance(mapped, torch.Tensor) or mapped.shape[:-1] != raw.shape[:-1]:
            got = tuple(mapped.shape) if isinstance(mapped, torch.Tensor) else type(mapped).__name__
            raise ValueError(f"feature_map must return a tensor of shape {tuple(raw.shape[:-1])} + (D′,) "
                             f"for {name} {tuple(raw.shape)}, got {got}")
    if fq.shape[-1] != fk.shape[-1]:
        raise ValueError("feature_map gives q and k different last dimensions: "
                         f"{fq.shape[-1]} and {fk.shape[-1]}")
    return fk.shape[-1]


def check_padding_mask(padding_mask: Optional[torch.Tensor], batch: int, length: int,
                       device: torch.device) -> Optional[torch.Tensor]:
    """(B, N) bool, True = real token. Returns None when every token is real (checked in eager
    mode only: under torch.compile a data-dependent branch would break the graph, and the
    masked path is exact for a full mask too)."""
    if padding_mask is None:
        return None
    if not isinstance(padding_mask, torch.Tensor) or padding_mask.dtype != torch.bool:
        got = padding_mask.dtype if isinstance(padding_mask, torch.Tensor) else type(padding_mask).__name__
        raise ValueError(f"padding_mask must be a bool tensor (True = real token), got {got}")
    if tuple(padding_mask.shape) != (batch, length):
        raise ValueError(
            f"padding_mask must have shape (batch, length) = {(batch, length)}, "
            f"got {tuple(padding_mask.shape)}"
        )
    if padding_mask.device != device:
        raise ValueError(f"padding_mask is on {padding_mask.device} but the inputs are on {device}")
    if not torch.compiler.is_compiling() and bool(padding_mask.all()):
        return None
    return padding_mask


def compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """States and denominators accumulate in float32 (float64 when an input is float64),
    whatever the input precision."""
    for t in tensors:
        if t.dtype == torch.float64:
            return torch.float64
    return torch.float32


def as_dtype(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """t.to(dtype), without the call where t already has it: Tensor.to costs a dispatch (1.5 µs of
    host time on the 2-core CPU machine) even when it returns t, and a layer's eager call made 29."""
    return t if t.dtype == dtype else t.to(dtype)

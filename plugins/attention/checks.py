"""Argument validation shared by every form of momentum attention: bad input fails early,
naming the argument and the allowed range."""
import math
from typing import Optional

import torch


def check_momentum(momentum: float, name: str = "momentum") -> float:
    momentum = _as_float(momentum, name)
    if not 0.0 <= momentum < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {momentum}")
    return momentum


def check_positive(value: float, name: str) -> float:
    value = _as_float(value, name)
    if not value > 0.0:
        raise ValueError(f"{name} must be > 0, got {value}")
    return value


def check_chunk_size(chunk_size: int) -> int:
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be an integer >= 1, got {chunk_size!r}")
    return chunk_size


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


def check_padding_mask(padding_mask: Optional[torch.Tensor], batch: int, length: int,
                       device: torch.device) -> Optional[torch.Tensor]:
    """(B, N) bool, True = real token. Returns None when every token is real."""
    if padding_mask is None:
        return None
    if not isinstance(padding_mask, torch.Tensor) or padding_mask.dtype != torch.bool:
        got = padding_mask.dtype if isinstance(padding_mask, torch.Tensor) else type(padding_mask).__name__
        raise ValueError(f"padding_mask must be a bool tensor (True = real token), got {got}")
    if tuple(padding_mask.shape) != (batch, length):
        raise ValueError(
            f"padding_mask must have shape (batch, length) = {(batch, length)}, got {tuple(padding_mask.shape)}"
        )
    if padding_mask.device != device:
        raise ValueError(f"padding_mask is on {padding_mask.device} but the inputs are on {device}")
    if bool(padding_mask.all()):
        return None
    return padding_mask


def compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """States and denominators accumulate in float32 (float64 when an input is float64),
    whatever the input precision."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def _as_float(value, name: str) -> float:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"{name} must be a scalar, got a tensor of shape {tuple(value.shape)}")
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return value

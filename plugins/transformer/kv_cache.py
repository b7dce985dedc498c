"""Generation state of causal softmax attention (Momentum Transformer, eq. 1): the keys and values
of every position so far, so that new positions attend to them without recomputing the prefix.
A step then costs O(N) in the prefix length N instead of the O(N²) of re-running it."""
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from ..attention.checks import check_padding_mask
from ..validation import check_tensors


@dataclass
class KeyValueCache:
    """key (B, H, N, Dk), value (B, H, N, Dv) of the N positions seen so far; real (B, N) bool,
    True = real token, or None when every cached position is real. Construction checks the
    layout (ValueError naming the part)."""

    key: torch.Tensor
    value: torch.Tensor
    real: Optional[torch.Tensor] = None

    def __post_init__(self):
        check_tensors({"key": self.key, "value": self.value}, "state")
        key, value = tuple(self.key.shape), tuple(self.value.shape)
        if len(key) != 4 or len(value) != 4 or key[:3] != value[:3]:
            raise ValueError(f"state must have key (B, H, N, Dk) and value (B, H, N, Dv), got key {key}, "
                             f"value {value}")
        if self.real is not None:
            if not isinstance(self.real, torch.Tensor) or self.real.dtype != torch.bool:
                raise ValueError("state.real must be a bool tensor (True = real token) or None")
            if tuple(self.real.shape) != (key[0], key[2]) or self.real.device != self.key.device:
                raise ValueError(f"state.real must have shape (B, N) = {(key[0], key[2])} on "
                                 f"{self.key.device}, got {tuple(self.real.shape)} on {self.real.device}")

    @property
    def length(self) -> int:
        return self.key.shape[2]

    def reorder(self, index: torch.Tensor) -> "KeyValueCache":
        """Select batch rows, e.g. the surviving beams in beam search."""
        index = index.to(self.key.device)
        real = None if self.real is None else self.real.index_select(0, index)
        return KeyValueCache(self.key.index_select(0, index), self.value.index_select(0, index), real)

    def within_window(self, window: Optional[int]) -> "KeyValueCache":
        """What a sliding window of `window` real tokens still reads from the next position on:
        the last window − 1 positions, when every cached position is real. With padding the
        positions to keep differ by row and are unknown without reading the mask on the host, so
        such a cache stays whole (exact either way: the window's mask ignores what is outside)."""
        if window is None or self.real is not None or self.length < window:
            return self
        keep = max(window - 1, 1)
        return KeyValueCache(self.key[:, :, -keep:], self.value[:, :, -keep:], None)

    def detach(self) -> "KeyValueCache":
        return KeyValueCache(self.key.detach(), self.value.detach(), self.real)


def extend_key_value_cache(cache: Optional[KeyValueCache], k: torch.Tensor, v: torch.Tensor,
                           padding_mask: Optional[torch.Tensor]) -> KeyValueCache:
    """The cache after appending the new positions' k (B, H, n, Dk), v (B, H, n, Dv); padding_mask
    (B, n) of the new positions, True = real (None: all real). cache None starts a fresh one."""
    batch, heads, n, dk = k.shape
    new_real = check_padding_mask(padding_mask, batch, n, k.device)
    if cache is None:
        return KeyValueCache(k, v, new_real)
    if not isinstance(cache, KeyValueCache):
        raise TypeError(f"state of attention='softmax' must be a KeyValueCache or None, got "
                        f"{type(cache).__name__}")
    expected = (batch, heads, dk, v.shape[-1], k.dtype, k.device)
    found = (cache.key.shape[0], cache.key.shape[1], cache.key.shape[3], cache.value.shape[3],
             cache.key.dtype, cache.key.device)
    if found != expected:
        raise ValueError(f"state holds (batch, heads, Dk, Dv, dtype, device) = {found}, but the new "
                         f"positions have {expected}")
    real = None
    if cache.real is not None or new_real is not None:
        old = cache.real if cache.real is not None else k.new_ones(batch, cache.length, dtype=torch.bool)
        new = new_real if new_real is not None else k.new_ones(batch, n, dtype=torch.bool)
        real = torch.cat([old, new], dim=1)
    return KeyValueCache(torch.cat([cache.key, k], dim=2), torch.cat([cache.value, v], dim=2), real)


def cached_softmax_attention(q: torch.Tensor, cache: KeyValueCache, *,
                             sliding_window: Optional[int] = None) -> torch.Tensor:
    """Causal softmax attention (eq. 1) of the last n cached positions, q (B, H, n, Dk): position
    i attends to the real cached positions ≤ i (and, with a sliding window W, fewer than W real
    positions before it) and to itself; outputs at padded positions are 0. The same convention
    as `softmax_self_attention(causal=True)`, so steps equal its output."""
    n, length = q.shape[2], cache.length
    past = length - n
    if cache.real is None and n == 1 and sliding_window is None:   # the newest position sees the whole cache
        return F.scaled_dot_product_attention(q, cache.key, cache.value)
    allowed = torch.ones(n, length, dtype=torch.bool, device=q.device).tril(diagonal=past)[None]
    if sliding_window is not None:
        rank = (torch.arange(length, device=q.device)[None] if cache.real is None
                else cache.real.long().cumsum(-1) - 1)
        allowed = allowed & (rank[:, past:, None] - rank[:, None, :] < sliding_window)
    if cache.real is None:
        return F.scaled_dot_product_attention(q, cache.key, cache.value, attn_mask=allowed[:, None])
    own = torch.zeros(n, length, dtype=torch.bool, device=q.device)
    own[:, past:] = torch.eye(n, dtype=torch.bool, device=q.device)
    allowed = (allowed & cache.real[:, None, :]) | own
    out = F.scaled_dot_product_attention(q, cache.key, cache.value, attn_mask=allowed[:, None])
    return out * cache.real[:, None, past:, None].to(out.dtype)


def attend_key_values(q: torch.Tensor, memory: KeyValueCache) -> torch.Tensor:
    """Non-causal softmax attention (eq. 1) of queries q (B, H, n, Dk) to every real position of
    `memory` (cross-attention to an encoder's projected keys and values). A row whose memory has no
    real position gets 0, as eq. 14's empty sums give, instead of the NaN of a softmax over nothing."""
    if memory.real is None:
        return F.scaled_dot_product_attention(q, memory.key, memory.value)
    has_keys = memory.real.any(-1)
    allowed = memory.real | ~has_keys[:, None]
    out = F.scaled_dot_product_attention(q, memory.key, memory.value, attn_mask=allowed[:, None, None, :])
    return out * has_keys[:, None, None, None].to(out.dtype)

"""Copy-task batches `w 0 w 0 …` (Momentum Transformer, Section 4.1).

Layout of one row (length `max_length`, symbols 1..n_symbols, 0 = separator and padding):
    x = w_1 … w_n 0 w_1 … w_n 0 0 …,   y_t = x_{t+1} (next-token targets),
with n drawn uniformly from [max_length // 4, (max_length - 1) // 2), as in the linear
transformer's copy task that Section 4.1 follows. The first copy of w is random, so only the
second copy is predictable: the loss mask marks the positions whose target is w's second copy.
"""
from typing import NamedTuple

import torch


class CopyBatch(NamedTuple):
    tokens: torch.Tensor     # (B, T) long
    targets: torch.Tensor    # (B, T) long, tokens shifted left by one
    loss_mask: torch.Tensor  # (B, T) bool, True where the target is in the second copy of w


def word_length_range(max_length: int) -> tuple:
    """[low, high) of the word length n; needs room for w 0 w inside max_length."""
    low, high = max_length // 4, (max_length - 1) // 2
    if low < 1 or high <= low:
        raise ValueError(f"max_length must be at least 8, got {max_length}")
    return low, high


def copy_batch(batch_size: int, max_length: int, n_symbols: int,
               generator: torch.Generator) -> CopyBatch:
    low, high = word_length_range(max_length)
    lengths = torch.randint(low, high, (batch_size,), generator=generator)
    words = torch.randint(1, n_symbols + 1, (batch_size, max_length), generator=generator)
    pos = torch.arange(max_length)
    n = lengths[:, None]
    first = pos < n
    second = (pos > n) & (pos <= 2 * n)
    # position t of the second copy holds w_{t-n-1}
    shifted = words.gather(1, (pos - n - 1).clamp(min=0))
    tokens = torch.where(first, words, torch.where(second, shifted, torch.zeros_like(words)))
    targets = torch.cat([tokens[:, 1:], torch.zeros_like(tokens[:, :1])], dim=1)
    loss_mask = (pos >= n) & (pos < 2 * n)
    return CopyBatch(tokens, targets, loss_mask)

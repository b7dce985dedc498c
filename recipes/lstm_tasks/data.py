"""Copying and adding task batches (MomentumRNN, Appendix A.4).

Copying: alphabet symbols 1..N, <blank> = 0, <start> = N + 1. Input: K symbols, L blanks,
<start>, K − 1 blanks (length L + 2K); target: K + L blanks, then the K symbols.
Adding: two length-T channels, values ~ U[0, 1) and markers (0 everywhere except one 1 in
[0, T/2) and one in [T/2, T)); the target is the sum of the two marked values.
"""
import math
from typing import NamedTuple

import torch

BLANK = 0


class CopyingBatch(NamedTuple):
    inputs: torch.Tensor   # (B, L + 2K) long, values 0..N+1
    targets: torch.Tensor  # (B, L + 2K) long, values 0..N


class AddingBatch(NamedTuple):
    inputs: torch.Tensor   # (B, T, 2) float: value, marker
    targets: torch.Tensor  # (B,) float


def start_symbol(n_symbols: int) -> int:
    return n_symbols + 1


def copying_batch(batch_size: int, *, symbols: int, delay: int, n_symbols: int,
                  generator: torch.Generator) -> CopyingBatch:
    """K = `symbols` characters to remember across a gap of L = `delay` blanks."""
    K, L = symbols, delay
    word = torch.randint(1, n_symbols + 1, (batch_size, K), generator=generator)
    inputs = torch.full((batch_size, L + 2 * K), BLANK, dtype=torch.long)
    targets = torch.full_like(inputs, BLANK)
    inputs[:, :K] = word
    inputs[:, K + L] = start_symbol(n_symbols)
    targets[:, K + L:] = word
    return CopyingBatch(inputs, targets)


def adding_batch(batch_size: int, *, length: int, generator: torch.Generator) -> AddingBatch:
    if length < 2:
        raise ValueError(f"length must be at least 2, got {length}")
    half = length // 2
    values = torch.rand(batch_size, length, generator=generator)
    first = torch.randint(0, half, (batch_size,), generator=generator)
    second = torch.randint(half, length, (batch_size,), generator=generator)
    markers = torch.zeros(batch_size, length)
    rows = torch.arange(batch_size)
    markers[rows, first] = 1.0
    markers[rows, second] = 1.0
    targets = values[rows, first] + values[rows, second]
    return AddingBatch(torch.stack([values, markers], dim=-1), targets)


def copying_baseline_loss(symbols: int, delay: int, n_symbols: int) -> float:
    """Cross-entropy per step of the memoryless strategy (blanks, then uniform guesses):
    K log N / (L + 2K), the level a model must beat to show it remembers anything."""
    return symbols * math.log(n_symbols) / (delay + 2 * symbols)


ADDING_BASELINE_MSE = 1.0 / 6.0  # always predicting 1: the variance of a sum of two U[0, 1)

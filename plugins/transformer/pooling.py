"""Pooling a sequence's final hidden states into one vector: the mean over its real tokens (the
Momentum Transformer's LRA classifiers, §4.3, and the HF sequence-classification head's default),
or its first real token (BERT's [CLS], RoBERTa's <s>)."""
from typing import Optional

import torch


def masked_mean(hidden: torch.Tensor, real: Optional[torch.Tensor]) -> torch.Tensor:
    """Mean of hidden (B, N, d) over the real positions of each row: real (B, N), bool or 0/1
    (an attention_mask); None: all positions. A row without a real token pools to 0, not NaN."""
    if real is None:
        return hidden.mean(dim=1)
    weights = real.to(hidden.dtype).unsqueeze(-1)
    return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)


def first_real(hidden: torch.Tensor, real: Optional[torch.Tensor]) -> torch.Tensor:
    """The hidden state (B, d) at each row's first real position (left padding skipped): real (B, N),
    bool or 0/1; None: position 0. A row without a real token gives its position 0."""
    if real is None:
        return hidden[:, 0]
    first = real.to(torch.int32).argmax(dim=1)          # argmax returns the first of equal maxima
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), first]


POOLINGS = {"mean": masked_mean, "first": first_real}

"""Mean pooling of a sequence's final hidden states over its real tokens, the pooling of the
Momentum Transformer's LRA classifiers (§4.3) and of the HF sequence-classification head."""
from typing import Optional

import torch


def masked_mean(hidden: torch.Tensor, real: Optional[torch.Tensor]) -> torch.Tensor:
    """Mean of hidden (B, N, d) over the real positions of each row: real (B, N), bool or 0/1
    (an attention_mask); None: all positions. A row without a real token pools to 0, not NaN."""
    if real is None:
        return hidden.mean(dim=1)
    weights = real.to(hidden.dtype).unsqueeze(-1)
    return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)

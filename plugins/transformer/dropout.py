"""Dropout applied only where it changes something. In eval mode or at p = 0 nn.Dropout returns
its input, yet each call is a module call and an op dispatch: 13 per step of a 4-layer model, on
the host's time of every eager decoding step (docs/benchmarks.md, session 13)."""
import torch
from torch import nn


def apply_dropout(module: nn.Dropout, x: torch.Tensor) -> torch.Tensor:
    """module(x) while it trains with p > 0; x itself otherwise (what nn.Dropout would return)."""
    return module(x) if module.training and module.p > 0 else x

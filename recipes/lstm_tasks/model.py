"""One MomentumLSTM-family layer plus a linear read-out (MomentumRNN, Appendix A.4: one cell)."""
import torch
from torch import nn
from torch.nn import functional as F

from .variants import CellSpec


class CopyingModel(nn.Module):
    """One-hot symbols → cell → logits over {blank} ∪ alphabet at every step."""

    def __init__(self, spec: CellSpec, n_symbols: int, hidden_size: int):
        super().__init__()
        self.vocabulary = n_symbols + 2
        self.rnn = spec.build(self.vocabulary, hidden_size)
        self.head = nn.Linear(hidden_size, n_symbols + 1)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(F.one_hot(inputs, self.vocabulary).float())
        return self.head(out)


class AddingModel(nn.Module):
    """(value, marker) pairs → cell → one regression output from the last step."""

    def __init__(self, spec: CellSpec, hidden_size: int):
        super().__init__()
        self.rnn = spec.build(2, hidden_size)
        self.head = nn.Linear(hidden_size, 1)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(inputs)
        return self.head(out[:, -1]).squeeze(-1)

"""One MomentumLSTM-family cell over the pixel sequence, a linear classifier on the last
hidden state (MomentumRNN, Appendix A.1)."""
import torch
from torch import nn

from recipes.lstm_tasks.variants import CellSpec


class PixelClassifier(nn.Module):
    def __init__(self, spec: CellSpec, hidden_size: int, classes: int = 10):
        super().__init__()
        self.rnn = spec.build(1, hidden_size)
        self.head = nn.Linear(hidden_size, classes)

    def forward(self, pixels: torch.Tensor, return_states: bool = False):
        """pixels (B, T, 1) → logits (B, classes); with return_states also h_1..h_T (B, T, H)."""
        states, _ = self.rnn(pixels)
        logits = self.head(states[:, -1])
        return (logits, states) if return_states else logits

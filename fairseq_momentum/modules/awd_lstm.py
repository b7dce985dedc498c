"""AWD-LSTM regularisation (Merity et al. 2018, the PTB setup of MomentumRNN,
Appendix A.3) around `plugins.rnn.MomentumLSTM` layers.

- weight drop: DropConnect on each layer's hidden-to-hidden matrix, sampled once per
  forward pass and handed to the layer as its `recurrent_weight`, so the layer still runs
  its fused recurrence;
- locked (variational) dropout: one mask per sequence, shared over time;
- embedding dropout: whole words dropped from the embedding matrix.
"""
from typing import List, Optional

from torch import Tensor, nn
from torch.nn import functional as F

from plugins.rnn import MomentumLSTM, RecurrentState

from .momentum_lstm_step import momentum_lstm_step


def locked_dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """x (T, B, C): one Bernoulli mask per (batch, channel), shared by every time step."""
    if not training or p == 0.0:
        return x
    mask = x.new_empty(1, x.size(1), x.size(2)).bernoulli_(1.0 - p) / (1.0 - p)
    return x * mask


def embedding_dropout(embed: nn.Embedding, tokens: Tensor, p: float, training: bool) -> Tensor:
    """Look up `tokens` with a fraction p of the vocabulary's rows set to zero."""
    weight = embed.weight
    if training and p > 0.0:
        mask = weight.new_empty(weight.size(0), 1).bernoulli_(1.0 - p) / (1.0 - p)
        weight = weight * mask
    return F.embedding(tokens, weight, embed.padding_idx)


class AWDMomentumLSTM(nn.Module):
    """A stack of single-layer MomentumLSTMs with AWD-LSTM regularisation (one module per
    layer: AWD-LSTM's layers differ in width, which one `MomentumLSTM` stack does not allow).

    sizes: [input, hidden_1, ..., hidden_L]; layers may differ in width (AWD-LSTM's last
    layer has the embedding's width so input and output embeddings can be tied).
    forward(x (T, B, sizes[0]), states: one RecurrentState per layer or None)
    -> (output (T, B, sizes[-1]), new states). Locked dropout `dropout_hidden` sits between
    layers; `weight_drop` is DropConnect on every hidden-to-hidden matrix.
    """

    def __init__(self, sizes: List[int], *, weight_drop: float = 0.0, dropout_hidden: float = 0.0,
                 **cell_kwargs):
        super().__init__()
        if len(sizes) < 2:
            raise ValueError(f"sizes must list the input and at least one layer, got {sizes}")
        self.layers = nn.ModuleList(MomentumLSTM(i, o, 1, **cell_kwargs)
                                    for i, o in zip(sizes[:-1], sizes[1:]))
        self.weight_drop, self.dropout_hidden = weight_drop, dropout_hidden

    def forward(self, x: Tensor, states: Optional[List[Optional[RecurrentState]]] = None):
        states = states if states is not None else [None] * len(self.layers)
        new_states = []
        for k, (layer, state) in enumerate(zip(self.layers, states)):
            if k > 0:
                x = locked_dropout(x, self.dropout_hidden, self.training)
            dropping = self.training and self.weight_drop > 0.0
            x, state = layer(x, state, recurrent_weight=self._weight_drop if dropping else None)
            new_states.append(state)
        return x, new_states

    def _weight_drop(self, k: int, weight_hh: Tensor) -> Tensor:
        return F.dropout(weight_hh, self.weight_drop, True)

    def step(self, x: Tensor, states: Optional[List[Optional[RecurrentState]]] = None):
        """One time step in eval mode (no dropout): x (B, sizes[0]) -> (h (B, sizes[-1]),
        new states), the states as `forward` returns them."""
        states = states if states is not None else [None] * len(self.layers)
        new_states = []
        for layer, state in zip(self.layers, states):
            if state is None:
                zeros = x.new_zeros(x.size(0), layer.hidden_size)
                state = RecurrentState(zeros[None], zeros[None], None, None, None)
            x, state = momentum_lstm_step(layer, x, _map_layers(state, lambda t: t[0]))
            new_states.append(_map_layers(state, lambda t: t[None]))
        return x, new_states


def _map_layers(state: RecurrentState, fn) -> RecurrentState:
    """Apply fn to h, c, v, m (those with a layer dimension); step is per sequence."""
    return RecurrentState(*(None if t is None else fn(t) for t in state[:4]), state.step)

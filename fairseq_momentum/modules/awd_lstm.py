"""AWD-LSTM regularisation (Merity et al. 2018, the PTB setup of MomentumRNN,
Appendix A.3) around `plugins.rnn.MomentumLSTM` layers: weight drop, locked dropout between
layers and embedding dropout, as plugins.rnn.awd defines them for both integrations.
"""
import contextlib
from typing import List, Optional

from torch import Tensor, nn

from plugins.rnn import MomentumLSTM, RecurrentState
from plugins.rnn.awd import locked_dropout, weight_drop

from .momentum_lstm_step import momentum_lstm_step


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

    def forward(self, x: Tensor, states: Optional[List[Optional[RecurrentState]]] = None, *,
                dropping: Optional[bool] = None):
        """`dropping` (default: in training) applies weight drop and the locked dropout between
        layers; True in eval mode is fairseq's --retain-dropout."""
        states = states if states is not None else [None] * len(self.layers)
        dropping = self.training if dropping is None else dropping
        new_states = []
        with contextlib.ExitStack() as masks:
            # every layer's weight-drop mask first, then the layers (with the masks between them): the
            # order in which transformers' MomentumLSTMForCausalLM draws them, so a converted model
            # trains as this one under the same seed
            drop = weight_drop(self.weight_drop, dropping)
            for layer in self.layers:
                masks.enter_context(layer.substituted_recurrent_weights(drop))
            for k, (layer, state) in enumerate(zip(self.layers, states)):
                if k > 0:
                    x = locked_dropout(x, self.dropout_hidden, dropping)
                x, state = layer(x, state)
                new_states.append(state)
        return x, new_states

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

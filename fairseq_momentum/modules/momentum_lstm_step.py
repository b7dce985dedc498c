"""One time step of a single-layer `plugins.rnn.MomentumLSTM`, for decoding.

The sequence layer sets up its momentum filter on every call, about 10x the cost of an
LSTMCell step; decoding calls it once per token and layer. `MomentumLSTM.step` runs one
step of every cell of the table in `plugins.rnn.variants` on the layer's own parameters;
this adapts fairseq's per-layer states (no layer dimension) to it.
"""

from torch import Tensor

from plugins.rnn import MomentumLSTM, RecurrentState


def momentum_lstm_step(rnn: MomentumLSTM, x: Tensor, state: RecurrentState) -> tuple[Tensor, RecurrentState]:
    """x (batch, input_size); state fields (batch, ...) without the layer dimension, v, m,
    step None for a fresh momentum state. Returns (h, new state)."""
    layered = RecurrentState(*(None if t is None else t[None] for t in state[:4]), state.step)
    h, new = rnn.step(x, layered)
    return h, RecurrentState(*(None if t is None else t[0] for t in new[:4]), new.step)

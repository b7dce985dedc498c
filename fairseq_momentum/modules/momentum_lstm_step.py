"""One time step of a single-layer `plugins.rnn.MomentumLSTM`, for decoding.

The sequence layer sets up its momentum filter on every call, about 10x the cost of an
LSTMCell step; decoding calls it once per token and layer. This runs the step-wise
equations of `plugins.rnn` (eq. 9, 15 and Section 2.4, the same functions its reference
cells use) on the layer's own parameters instead.
"""
from typing import Tuple

import torch
from torch import Tensor
from torch.nn import functional as F

from plugins.rnn import MomentumLSTM, RecurrentState
from plugins.rnn.cells import lstm_update
from plugins.rnn.filters import adam_step, momentum_step, nag_momentum, restart_index


def momentum_lstm_step(rnn: MomentumLSTM, x: Tensor, state: RecurrentState) -> Tuple[Tensor, RecurrentState]:
    """x (batch, input_size); state fields (batch, ...) without the layer dimension, v, m,
    step None for a fresh momentum state. Returns (h, new state)."""
    w_ih, w_hh, b_ih, b_hh = rnn.layer_parameters(0)
    h, c, v, m, step = state
    g = F.linear(x, w_ih, b_ih)
    step = (torch.zeros(x.size(0), dtype=torch.long, device=x.device) if step is None else step) + 1
    if rnn._has_v and v is None:
        v = torch.zeros_like(g)
    if rnn.cell in ("adam", "rmsprop"):
        m = torch.zeros_like(g) if m is None else m
        momentum = rnn.momentum if rnn.cell == "adam" else 0.0
        pre, v, m = adam_step(v, m, g, momentum, rnn.step_size, rnn.beta, rnn.eps)
    elif rnn.cell == "lstm":
        pre = g
    else:
        momentum = rnn.momentum if rnn.cell == "momentum" else \
            nag_momentum(restart_index(step, rnn.restart).to(x.dtype))[:, None]
        pre = v = momentum_step(v, g, momentum, rnn.step_size)
    h, c = lstm_update(pre + F.linear(h, w_hh, b_hh), c)
    return h, RecurrentState(h, c, v, m, step)

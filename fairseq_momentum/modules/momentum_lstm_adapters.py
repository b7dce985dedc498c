"""`plugins.rnn.MomentumLSTM` in the two slots of fairseq's attentional LSTM translation
model (fairseq/models/lstm.py), so the rest of that model (embeddings, attention, input
feeding, caching, beam search) is used unchanged.

- `MomentumLSTMEncoderRNN` replaces the encoder's `nn.LSTM` by one `MomentumLSTM` stack:
  same call, same outputs (packed output, (h_n, c_n) laid out as nn.LSTM's, bidirectional
  included).
- `MomentumLSTMDecoderCell` replaces each decoder `nn.LSTMCell`. fairseq's decoder carries
  (h, c) per layer between time steps, caches them in `incremental_state` and reorders
  rows for beam search; the momentum state has to follow the same path, so it travels
  inside the cell slot: c_slot = [c | v | m | step] (v for momentum cells, m for
  adam/rmsprop, step = time steps so far, stored as a float). A slot of width
  hidden_size (fairseq's zero or encoder-initialised cell) starts a fresh momentum state.
  One time step is `momentum_lstm_step` (tests check it equals the sequence layer).
"""
import re
from typing import Tuple

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence

from plugins.rnn import MomentumLSTM, RecurrentState

from .momentum_lstm_step import momentum_lstm_step


class MomentumLSTMEncoderRNN(nn.Module):
    """Drop-in for the encoder's nn.LSTM(input_size, hidden_size, num_layers, dropout,
    bidirectional) on packed input: one `MomentumLSTM` stack (bidirectional if it is) with the
    cell given by `cell_kwargs`, its parameters named as nn.LSTM's under `rnn.`."""

    def __init__(self, input_size, hidden_size, num_layers, *, dropout=0.0, bidirectional=False,
                 **cell_kwargs):
        super().__init__()
        self.hidden_size, self.num_layers = hidden_size, num_layers
        self.bidirectional, self.dropout = bidirectional, dropout
        self.rnn = MomentumLSTM(input_size, hidden_size, num_layers, dropout=dropout,
                                bidirectional=bidirectional, **cell_kwargs)
        self._register_load_state_dict_pre_hook(self._rename_per_layer_modules)

    @classmethod
    def like(cls, module: nn.LSTM, **cell_kwargs):
        return cls(module.input_size, module.hidden_size, module.num_layers, dropout=module.dropout,
                   bidirectional=module.bidirectional, **cell_kwargs)

    def forward(self, packed: PackedSequence, hx: Tuple[Tensor, Tensor]):
        out, state = self.rnn(packed, hx)
        return out, (state.h, state.c)

    def _rename_per_layer_modules(self, state_dict, prefix, *args):
        """Checkpoints saved while the encoder held one single-layer MomentumLSTM per layer and
        direction (`layers.{i}.weight_ih_l0`, i = layer * directions + direction) load into the
        stack's names (`rnn.weight_ih_l{layer}`, `_reverse` for the backward direction)."""
        old = re.compile(re.escape(prefix) + r"layers\.(\d+)\.(\w+)_l0$")
        for key in [k for k in state_dict if old.match(k)]:
            i, name = old.match(key).groups()
            state_dict[f"{prefix}rnn.{name}_l{self.rnn.layer_name(int(i))}"] = state_dict.pop(key)


class MomentumLSTMDecoderCell(nn.Module):
    """Drop-in for a decoder nn.LSTMCell: forward(input (B, D), (h, c_slot)) -> (h, c_slot)
    with c_slot = [c | v | m | step] as described in the module docstring."""

    def __init__(self, input_size, hidden_size, **cell_kwargs):
        super().__init__()
        self.rnn = MomentumLSTM(input_size, hidden_size, 1, **cell_kwargs)
        self.input_size, self.hidden_size = input_size, hidden_size
        width = 4 * hidden_size
        variant = self.rnn.variant
        self.widths = [hidden_size, width if variant.has_v else 0, width if variant.has_m else 0, 1]

    @classmethod
    def like(cls, module: nn.LSTMCell, **cell_kwargs):
        return cls(module.input_size, module.hidden_size, **cell_kwargs)

    def unpack(self, slot: Tensor) -> RecurrentState:
        """The cell slot as a RecurrentState (h left empty)."""
        if slot.size(1) == self.hidden_size:
            return RecurrentState(None, slot, None, None, None)
        c, v, m, step = slot.split(self.widths, dim=1)
        return RecurrentState(None, c, v if v.numel() else None, m if m.numel() else None,
                              step[:, 0].round().long())

    def pack(self, state: RecurrentState) -> Tensor:
        parts = [state.c] + [t for t in (state.v, state.m) if t is not None]
        return torch.cat(parts + [state.step[:, None].to(state.c.dtype)], dim=1)

    def forward(self, input: Tensor, hx: Tuple[Tensor, Tensor]) -> Tuple[Tensor, Tensor]:
        h, slot = hx
        _, c, v, m, step = self.unpack(slot)
        h, state = momentum_lstm_step(self.rnn, input, RecurrentState(h, c, v, m, step))
        return h, self.pack(state)

"""Attentional LSTM translation model with MomentumLSTM encoder and decoder
(MomentumRNN, eq. 9, 15 and Section 2.4; docs/equations.md) for `--task translation`.

fairseq's `lstm` model with every argument it has (embeddings, attention, input
feeding, bidirectional encoder, ...) plus the `--lstm-*` cell options; the recurrent
cells are swapped for MomentumLSTM ones (modules/momentum_lstm_adapters.py), so
incremental decoding carries (h, c, v[, m]) and beam search reorders it as fairseq does
for (h, c). `--lstm-cell lstm` is the plain-LSTM baseline with the same code.
"""
from fairseq.models.lstm import LSTMModel, base_architecture, lstm_wiseman_iwslt_de_en
from torch import nn

from ..modules.momentum_lstm_adapters import MomentumLSTMDecoderCell, MomentumLSTMEncoderRNN
from ..options import add_lstm_cell_args, check_lstm_cell_args, lstm_cell_defaults, lstm_cell_kwargs
from ..registry import architecture, model


@model("momentum_lstm")
class MomentumLSTMModel(LSTMModel):
    @staticmethod
    def add_args(parser):
        LSTMModel.add_args(parser)
        add_lstm_cell_args(parser)

    @classmethod
    def build_model(cls, args, task):
        """fairseq's lstm build, then its encoder LSTM and decoder cells become MomentumLSTMs."""
        momentum_lstm_base(args)
        check_lstm_cell_args(args)
        model = super().build_model(args, task)
        cell = lstm_cell_kwargs(args)
        model.encoder.lstm = MomentumLSTMEncoderRNN.like(model.encoder.lstm, **cell)
        model.decoder.layers = nn.ModuleList(MomentumLSTMDecoderCell.like(layer, **cell)
                                             for layer in model.decoder.layers)
        return model


@architecture("momentum_lstm", "momentum_lstm")
def momentum_lstm_base(args):
    lstm_cell_defaults(args)
    base_architecture(args)


@architecture("momentum_lstm", "momentum_lstm_wiseman_iwslt_de_en")
def momentum_lstm_wiseman_iwslt_de_en(args):
    """fairseq's lstm_wiseman_iwslt_de_en sizes with MomentumLSTM cells."""
    lstm_cell_defaults(args)
    lstm_wiseman_iwslt_de_en(args)

"""MomentumRNN family (MomentumRNN; docs/equations.md): step-wise cells and nn.LSTM-style layers."""
from .layers import MomentumLSTM, MomentumRNN
from .lstm_cells import (
    AdamLSTMCell,
    LSTMStepCell,
    MomentumLSTMCell,
    NAGLSTMCell,
    RMSPropLSTMCell,
    SRLSTMCell,
)
from .orthogonal import OrthogonalMomentumRNN, OrthogonalRNNCell
from .sequence import RecurrentState
from .stale_rnn_dispatch import clear_dispatch_after_export_swaps
from .tanh_rnn_cell import MomentumRNNCell
from .variants import VARIANTS, CellVariant, cell_names, get_variant, register_cell

__all__ = [
    "LSTMStepCell", "AdamLSTMCell", "MomentumLSTMCell", "NAGLSTMCell", "RMSPropLSTMCell", "SRLSTMCell",
    "MomentumRNNCell", "MomentumLSTM", "MomentumRNN", "OrthogonalMomentumRNN",
    "OrthogonalRNNCell", "RecurrentState", "VARIANTS", "CellVariant", "cell_names", "get_variant",
    "register_cell",
]

clear_dispatch_after_export_swaps()

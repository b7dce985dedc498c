"""MomentumRNN family (MomentumRNN; docs/equations.md): step-wise cells and nn.LSTM-style layers."""
from .cells import AdamLSTMCell, MomentumLSTMCell, NAGLSTMCell, RMSPropLSTMCell, SRLSTMCell
from .layers import MomentumLSTM, MomentumRNN
from .orthogonal import OrthogonalMomentumRNN, OrthogonalRNNCell
from .rnn_cells import MomentumRNNCell
from .sequence import RecurrentState
from .variants import VARIANTS, CellVariant, cell_names, get_variant

__all__ = [
    "AdamLSTMCell", "MomentumLSTMCell", "NAGLSTMCell", "RMSPropLSTMCell", "SRLSTMCell",
    "MomentumRNNCell", "MomentumLSTM", "MomentumRNN", "OrthogonalMomentumRNN",
    "OrthogonalRNNCell", "RecurrentState", "VARIANTS", "CellVariant", "cell_names", "get_variant",
]

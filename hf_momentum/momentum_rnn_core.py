"""The `plugins.rnn` objects the MomentumLSTM model uses, re-exported for its modeling file.

Same mechanism as `momentum_core`: in the package this re-exports `plugins.rnn`; a saved model
gets the generated, self-contained copy that `bundled_source()` returns.
"""
from plugins.exporting import exported_scan, exports_a_symbolic, is_exporting, onnx_exporting
from plugins.packing import Segments, front_order
from plugins.rnn import MomentumLSTM, RecurrentState
from plugins.rnn.awd import drawn_weight_drop, embedding_dropout, segment_ids, sequence_dropout, weight_drop
from plugins.rnn.sequence import pad_packed
from plugins.rnn.variants import (
    DEFAULT_CELL,
    DEFAULTS,
    check_hyper,
    read_hyperparameters,
    unread_hyperparameters,
)

BUNDLED_MODULES = ("plugins.rnn.layers", "plugins.rnn.variants", "plugins.packing", "plugins.rnn.awd")
EXPORTS = ("MomentumLSTM", "RecurrentState", "DEFAULT_CELL", "DEFAULTS", "check_hyper",
           "read_hyperparameters", "unread_hyperparameters", "Segments", "front_order", "embedding_dropout",
           "segment_ids", "sequence_dropout", "weight_drop", "drawn_weight_drop", "pad_packed",
           "is_exporting", "exports_a_symbolic", "onnx_exporting", "exported_scan")


def bundled_source() -> str:
    """Source of the self-contained file that replaces this one in a saved model."""
    from hf_momentum.flatten import flatten_modules
    return flatten_modules(BUNDLED_MODULES, EXPORTS)

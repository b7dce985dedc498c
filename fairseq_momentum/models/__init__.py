"""Architectures registered with fairseq (importing this package registers them)."""
from . import (  # noqa: F401
    momentum_lstm,
    momentum_lstm_lm,
    momentum_nat,
    momentum_roberta,
    momentum_transformer,
    momentum_transformer_lm,
)

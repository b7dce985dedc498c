"""Architectures registered with fairseq (importing this package registers them)."""
from . import momentum_lstm, momentum_lstm_lm, momentum_nat, momentum_transformer, momentum_transformer_lm  # noqa: F401

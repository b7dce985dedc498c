"""Framework-neutral PyTorch core of momentum-plugins (imports torch only).

- `plugins.attention`: momentum / linear attention (momentum_transformer.md eq. 12–14).
- `plugins.connection`: momentum connection and adaptive momentum (eq. 15, 18).
- `plugins.rnn`: MomentumRNN cells and layers (momentum_rnn.md).
"""
__version__ = "0.1.0"

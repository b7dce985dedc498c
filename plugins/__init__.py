"""Framework-neutral PyTorch core of momentum-plugins (imports torch only).

- `plugins.attention`: momentum / linear attention (Momentum Transformer, eq. 12–14).
- `plugins.connection`: momentum connection and adaptive momentum (eq. 15, 18).
- `plugins.rnn`: MomentumRNN cells and layers (MomentumRNN, eq. 9, 15, Section 2.4).
- `plugins.bptt`: AWD-LSTM's streams and (random-length) chunks for truncated BPTT (Appendix A.3).
- `plugins.nt_asgd`: AWD-LSTM's NT-ASGD, the optimizer of MomentumRNN's PTB runs (Appendix A.3).

Each equation's implementation and tests, and where we depart from the authors' code:
docs/equations.md.
"""
__version__ = "0.1.0"

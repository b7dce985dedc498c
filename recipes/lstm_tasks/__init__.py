"""Copying and adding tasks for LSTM and the MomentumLSTM family (momentum_rnn.md A.4)."""

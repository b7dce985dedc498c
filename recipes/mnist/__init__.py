"""Pixel-by-pixel MNIST and permuted MNIST with the MomentumLSTM family (momentum_rnn.md §3.1)."""

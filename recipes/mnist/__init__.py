"""Pixel-by-pixel MNIST and permuted MNIST with the MomentumLSTM family (MomentumRNN, §3.1)."""

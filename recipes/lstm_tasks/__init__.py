"""Copying and adding tasks for LSTM and the MomentumLSTM family (MomentumRNN, Appendix A.4)."""

"""Former name of adam_recurrence_triton, kept for saved models only.

A model saved by an earlier release bundles its own copy of the Adam recurrence, and that copy
imports the Triton fast path from the installed package under this name (hf_momentum.flatten);
without this module it would silently fall back to the torch loop on CUDA. New code imports
`plugins.rnn.adam_recurrence_triton`.
"""
from .adam_recurrence_triton import TritonAdamLSTMRecurrence

__all__ = ["TritonAdamLSTMRecurrence"]

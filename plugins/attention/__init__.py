"""Momentum attention (Momentum Transformer, Section 3; docs/equations.md): causal eq. 12/13, non-causal
eq. 14, and plain linear attention as the β = 0 case.

Layout after flash-linear-attention: `naive` (literal quadratic / token-by-token references),
`chunk` (the O(N) training path), `recurrent` (the fused decoding step), `noncausal` (eq. 14's
two sums), `nonfinite` (NaN/inf kept causal), `backends` (PyTorch or the Triton kernels of
`plugins.attention.triton`, imported only when used), `attend` (the trusted path:
no checks, no host reads, dispatch), `spec` (the validated hyperparameters), `api` (the public
functions: validation, then `attend`)."""
from .api import attend_summary, linear_attention, momentum_attention, momentum_attention_step, summarize_keys
from .attend import attend, attend_step
from .feature_maps import FEATURE_MAPS, elu_plus_one
from .naive import (
    naive_causal_momentum_attention,
    naive_noncausal_momentum_attention,
    naive_recurrent_momentum_attention,
)
from .spec import AttentionSpec
from .state import MomentumAttentionState, NonCausalSummary

__all__ = [
    "attend", "attend_step", "AttentionSpec",
    "momentum_attention", "momentum_attention_step", "linear_attention", "MomentumAttentionState",
    "summarize_keys", "attend_summary", "NonCausalSummary",
    "FEATURE_MAPS", "elu_plus_one", "naive_causal_momentum_attention",
    "naive_noncausal_momentum_attention", "naive_recurrent_momentum_attention",
]

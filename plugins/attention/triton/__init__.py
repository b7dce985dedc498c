"""Triton kernels of momentum attention (Momentum Transformer, eq. 12/13), one module per form
after flash-linear-attention: `chunk` (training / prefill, forward and backward), `fused_recurrent`
(one decoding step), `op` (torch.library registration for torch.compile).

Importing this package never fails: `is_available()` says whether the kernels can run (triton
importable, and CUDA present or TRITON_INTERPRET=1 for CPU tensors through the interpreter)."""
import importlib.util
import os

import torch


def is_available() -> bool:
    if importlib.util.find_spec("triton") is None or not hasattr(torch.library, "triton_op"):
        return False
    return torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"


def chunk_momentum_attention(fq, fk, v, **kwargs):
    """See `plugins.attention.triton.chunk.chunk_momentum_attention`."""
    from .chunk import chunk_momentum_attention as impl
    return impl(fq, fk, v, **kwargs)


def fused_recurrent_step(fq, fk, v, state, **kwargs):
    """See `plugins.attention.triton.fused_recurrent.fused_recurrent_step`."""
    from .fused_recurrent import fused_recurrent_step as impl
    return impl(fq, fk, v, state, **kwargs)


__all__ = ["chunk_momentum_attention", "fused_recurrent_step", "is_available"]

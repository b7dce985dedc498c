"""Triton kernels of momentum attention (Momentum Transformer, eq. 12/13), one module per form
after flash-linear-attention: `chunk_kernels` and its launchers `chunk` (training / prefill,
forward and backward), `fused_recurrent` (one decoding step and its launcher), `feature_marks` (a
layer's feature map with its NaN marks, one kernel for q, k and v), `layer_call` (a layer's eager
training call through both in one autograd node), `op` (the launchers
registered as torch.library custom ops, so torch.compile keeps one graph) and `entry_points` (the
public functions over the ops). Imports go one way, in that order from `entry_points` down.

Importing this package never fails: `is_available()` says whether the kernels can run (triton
importable, and CUDA present or TRITON_INTERPRET=1 for CPU tensors through the interpreter); the
kernels' modules are imported on first use."""
import importlib.util
import os

import torch

from ..state import MomentumAttentionState

# looked up once: a module search on every call would also be traced by torch.compile
HAS_TRITON = importlib.util.find_spec("triton") is not None


def is_available() -> bool:
    if not HAS_TRITON:
        return False
    return torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"


def chunk_momentum_attention(fq: torch.Tensor, fk: torch.Tensor, v: torch.Tensor, *, momentum: float,
                             step_size: float, eps: float, chunk_size: int,
                             initial_state: MomentumAttentionState | None = None,
                             lengths: torch.Tensor | None = None, return_state: bool = False,
                             cu_seqlens: torch.Tensor | None = None,
                             ) -> tuple[torch.Tensor, MomentumAttentionState | None]:
    """Eq. 13 on feature-mapped inputs, packed sequences with `cu_seqlens`; see
    `entry_points.chunk_momentum_attention`."""
    _check_device(fq)
    from .entry_points import chunk_momentum_attention as impl
    return impl(fq, fk, v, momentum=momentum, step_size=step_size, eps=eps, chunk_size=chunk_size,
                initial_state=initial_state, lengths=lengths, return_state=return_state,
                cu_seqlens=cu_seqlens)


def fused_recurrent_step(fq: torch.Tensor, fk: torch.Tensor, v: torch.Tensor,
                         state: MomentumAttentionState, *,
                         momentum: float, step_size: float, eps: float, real: torch.Tensor | None = None,
                         ) -> tuple[torch.Tensor, MomentumAttentionState]:
    """One step of eq. 12; see `entry_points.fused_recurrent_step`."""
    _check_device(fq)
    from .entry_points import fused_recurrent_step as impl
    return impl(fq, fk, v, state, momentum=momentum, step_size=step_size, eps=eps, real=real)


def marked_recurrent_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: MomentumAttentionState,
                          **kw) -> tuple[torch.Tensor, MomentumAttentionState]:
    """One step of eq. 12 on raw inputs with their non-finite marks; see
    `entry_points.marked_recurrent_step`."""
    _check_device(q)
    from .entry_points import marked_recurrent_step as impl
    return impl(q, k, v, state, **kw)


def finite_features(phi, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    lengths: torch.Tensor | None = None, segments: torch.Tensor | None = None,
                    count: int = 0) -> tuple | None:
    """φ and the non-finite marks of raw q, k, v in one kernel for the three; see
    `entry_points.finite_features`."""
    _check_device(q)
    from .entry_points import finite_features as impl
    return impl(phi, q, k, v, lengths, segments, count)


def marked_chunk_attention(phi, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           **kw) -> torch.Tensor | None:
    """A layer's eager call (φ and its marks, eq. 13 from a zero state) in one autograd node; see
    `entry_points.marked_chunk_attention`."""
    _check_device(q)
    from .entry_points import marked_chunk_attention as impl
    return impl(phi, q, k, v, **kw)


def _check_device(t: torch.Tensor) -> None:
    if not HAS_TRITON:
        raise RuntimeError("the Triton kernels need triton (pip install triton)")
    if not t.is_cuda:
        if os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError(f"the Triton kernels run on CUDA tensors, got {t.device}; CPU tensors run "
                             "through Triton's interpreter only with TRITON_INTERPRET=1 set before triton is "
                             "imported")
        from ...triton_launch import check_interpreter
        check_interpreter("backend='torch'")


__all__ = ["chunk_momentum_attention", "fused_recurrent_step", "is_available"]

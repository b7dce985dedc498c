"""Recurrent state of causal momentum attention (eq. 12): S, z and the momentum m."""
from dataclasses import dataclass

import torch

from ..validation import check_tensors


@dataclass
class MomentumAttentionState:
    """State after a prefix of the sequence, for each (batch, head).

    s: (B, H, Dk, Dv) the attention state S_i of eq. 12.
    z: (B, H, Dk)     the key sum z_i (denominator; carries no momentum, eq. 12).
    m: (B, H, Dk, Dv) the momentum m_i of eq. 12, with the paper's sign
                      (m_i = β m_{i-1} − φ(k_i) v_iᵀ).
    All three are float32, or float64 for float64 inputs, whatever the model's dtype.
    Construction checks that they are floating-point tensors of one dtype and device with these
    shapes (ValueError naming the part); the entry points check the sizes against their inputs.
    """

    s: torch.Tensor
    z: torch.Tensor
    m: torch.Tensor

    def __post_init__(self):
        check_tensors({"s": self.s, "z": self.z, "m": self.m}, "state")
        s, z, m = (tuple(t.shape) for t in (self.s, self.z, self.m))
        if len(s) != 4 or m != s or z != s[:3]:
            raise ValueError("state must have s (B, H, Dk, Dv), z (B, H, Dk) and m (B, H, Dk, Dv), "
                             f"got s {s}, z {z}, m {m}")

    @classmethod
    def trusted(cls, s: torch.Tensor, z: torch.Tensor, m: torch.Tensor) -> "MomentumAttentionState":
        """A state of parts that need no check: a kernel's outputs, or a cache's copy of a state
        that was checked when made. A decoding step builds two per layer and token, each check
        a few dozen Python calls of host time (eq. 12's state, trusted inside the boundary)."""
        state = object.__new__(cls)
        state.s, state.z, state.m = s, z, m
        return state

    @classmethod
    def zeros(cls, batch: int, heads: int, dk: int, dv: int, *, dtype: torch.dtype,
              device: torch.device) -> "MomentumAttentionState":
        return cls(
            s=torch.zeros(batch, heads, dk, dv, dtype=dtype, device=device),
            z=torch.zeros(batch, heads, dk, dtype=dtype, device=device),
            m=torch.zeros(batch, heads, dk, dv, dtype=dtype, device=device),
        )

    def reorder(self, index: torch.Tensor) -> "MomentumAttentionState":
        """Select batch rows, e.g. the surviving beams in beam search."""
        index = index.to(self.s.device)
        return MomentumAttentionState(self.s.index_select(0, index), self.z.index_select(0, index),
                                      self.m.index_select(0, index))

    def detach(self) -> "MomentumAttentionState":
        """Cut the graph, for truncated back-propagation through time."""
        return MomentumAttentionState(self.s.detach(), self.z.detach(), self.m.detach())

    def to(self, *args, **kwargs) -> "MomentumAttentionState":
        """As Tensor.to: this state itself where no part changes (a decoding step asks once per
        layer and token, and a new state would be checked again)."""
        moved = (self.s.to(*args, **kwargs), self.z.to(*args, **kwargs), self.m.to(*args, **kwargs))
        if all(new is old for new, old in zip(moved, (self.s, self.z, self.m))):
            return self
        return MomentumAttentionState(*moved)

    def check(self, batch: int, heads: int, dk: int, dv: int) -> None:
        if self.s.shape == self.m.shape == (batch, heads, dk, dv) and self.z.shape == (batch, heads, dk):
            return                                   # once per layer and token while decoding
        expected = {"s": (batch, heads, dk, dv), "z": (batch, heads, dk), "m": (batch, heads, dk, dv)}
        for name, shape in expected.items():
            got = tuple(getattr(self, name).shape)
            if got != shape:
                raise ValueError(f"state.{name} must have shape {shape} for these inputs, got {got}")


@dataclass
class NonCausalSummary:
    """Keys and values of eq. 14 reduced to two sums, for reuse by many queries (cross-attention
    during decoding): kv = γ Σ_j (1−β^(N−j+1))/(1−β) φ(k_j)v_jᵀ (B, H, Dk, Dv), z = Σ_j φ(k_j)
    (B, H, Dk)."""

    kv: torch.Tensor
    z: torch.Tensor

    def __post_init__(self):
        check_tensors({"kv": self.kv, "z": self.z}, "summary")
        kv, z = tuple(self.kv.shape), tuple(self.z.shape)
        if len(kv) != 4 or z != kv[:3]:
            raise ValueError(f"summary must have kv (B, H, Dk, Dv) and z (B, H, Dk), got kv {kv}, z {z}")

    def reorder(self, index: torch.Tensor) -> "NonCausalSummary":
        index = index.to(self.kv.device)
        return NonCausalSummary(self.kv.index_select(0, index), self.z.index_select(0, index))

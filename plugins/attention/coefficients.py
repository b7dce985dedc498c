"""Coefficients of the chunked forms of eq. 12/13, computed in float64 directly as geometric sums
(`rule.MomentumRule`), then cast: nothing is ever obtained by subtracting two large
momentum-weighted states, which would lose precision for β close to 1."""
from dataclasses import dataclass

import torch

from .rule import MomentumRule


@dataclass
class ChunkCoefficients:
    """The weights of a rule (`rule.MomentumRule`) for one chunk of C positions (local index a,
    key index j; Momentum Transformer, eq. 13 for eq. 12's rule):
    intra[a, j]  input_on_s(a − j) for j ≤ a, else 0 — token j's weight on s_a inside the chunk;
    carry[a]     m_on_s(a + 1) — weight of the m' entering the chunk on s_a;
    to_end_m[j]  input_on_m(C − 1 − j) — weight of φ(k_j)v_jᵀ on m' at the chunk's end;
    to_end_s[j]  input_on_s(C − 1 − j) — its weight on s at the chunk's end;
    causal[a, j] True for j ≤ a (bool: later keys are removed with `where`, not weight 0);
    decay        m_on_m(C) — decay of m' over a whole chunk.
    """

    intra: torch.Tensor
    causal: torch.Tensor
    carry: torch.Tensor
    to_end_m: torch.Tensor
    to_end_s: torch.Tensor
    decay: float

    @classmethod
    def build(cls, rule: MomentumRule, chunk: int, dtype: torch.dtype,
              device: torch.device) -> "ChunkCoefficients":
        a = torch.arange(chunk, dtype=torch.float64)
        distance = a[:, None] - a[None, :]
        intra = torch.where(distance >= 0, rule.input_on_s(distance.clamp(min=0)),
                            torch.zeros((), dtype=torch.float64))
        to_end = chunk - 1 - a
        cast = dict(dtype=dtype, device=device)
        return cls(
            intra=intra.to(**cast),
            causal=(distance >= 0).to(device=device),
            carry=rule.m_on_s(a + 1).to(**cast),
            to_end_m=rule.input_on_m(to_end).to(**cast),
            to_end_s=rule.input_on_s(to_end).to(**cast),
            decay=rule.decay ** chunk,               # m_on_m(C) = r^C, a Python float: no tensor is read back
        )

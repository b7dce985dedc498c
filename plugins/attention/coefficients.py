"""β-power coefficients of the chunked and closed forms of eq. 12/13, computed in float64
directly as geometric sums, then cast: nothing is ever obtained by subtracting two large
momentum-weighted states, which would lose precision for β close to 1."""
from dataclasses import dataclass

import torch


def geometric(beta: float, n: torch.Tensor) -> torch.Tensor:
    """(1 − β^n) / (1 − β) = Σ_{t<n} β^t, float64, for integer n ≥ 0 (β = 0 gives 1 for n ≥ 1)."""
    n = n.to(torch.float64)
    if beta == 0.0:
        return (n > 0).to(torch.float64)
    return -torch.expm1(n * torch.log(torch.tensor(beta, dtype=torch.float64))) / (1.0 - beta)


@dataclass
class ChunkCoefficients:
    """For one chunk of C positions (local index a, key index j):
    intra[a, j]  γ(1 − β^(a−j+1))/(1 − β) for j ≤ a, else 0 — eq. 13's weight inside the chunk;
    carry[a]     γβ(1 − β^(a+1))/(1 − β) — weight of the momentum m' entering the chunk on s_a;
    to_end_m[j]  β^(C−1−j) — weight of φ(k_j)v_jᵀ on m' at the chunk's end;
    to_end_s[j]  intra[C−1, j] — its weight on s at the chunk's end;
    causal[a, j] True for j ≤ a (bool: later keys are removed with `where`, not weight 0);
    decay        β^C — decay of m' over a whole chunk.
    """

    intra: torch.Tensor
    causal: torch.Tensor
    carry: torch.Tensor
    to_end_m: torch.Tensor
    to_end_s: torch.Tensor
    decay: float

    @classmethod
    def build(cls, beta: float, gamma: float, chunk: int, dtype: torch.dtype,
              device: torch.device) -> "ChunkCoefficients":
        a = torch.arange(chunk, dtype=torch.float64)
        distance = a[:, None] - a[None, :]
        intra = torch.where(distance >= 0, gamma * geometric(beta, distance.clamp(min=0) + 1),
                            torch.zeros((), dtype=torch.float64))
        carry = gamma * beta * geometric(beta, a + 1)
        to_end_m = torch.tensor(beta, dtype=torch.float64) ** (chunk - 1 - a)
        return cls(
            intra=intra.to(dtype=dtype, device=device),
            causal=(distance >= 0).to(device=device),
            carry=carry.to(dtype=dtype, device=device),
            to_end_m=to_end_m.to(dtype=dtype, device=device),
            to_end_s=intra[-1].to(dtype=dtype, device=device),
            decay=float(beta ** chunk),
        )

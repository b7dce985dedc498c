"""Non-causal momentum attention (eq. 14) in O(N): one weighted key-value sum per sequence."""
import torch

from .coefficients import geometric


def noncausal_momentum_attention(fq: torch.Tensor, fk: torch.Tensor, v: torch.Tensor, *,
                                 momentum: float, step_size: float, eps: float,
                                 key_mask: torch.Tensor = None) -> torch.Tensor:
    """Eq. 14: v̂_i = γφ(q_i)ᵀ Σ_j (1−β^(N−j+1))/(1−β) φ(k_j)v_jᵀ / (φ(q_i)ᵀ Σ_j φ(k_j) + eps).

    fq (B, H, Nq, Dk), fk (B, H, Nk, Dk), v (B, H, Nk, Dv): feature-mapped, padded keys zeroed.
    N and j count each row's real keys (key_mask (B, Nk), True = real; any pattern), so a
    padded row equals the same sequence alone."""
    B, Nk = fk.shape[0], fk.shape[2]
    if key_mask is None:
        after = torch.arange(Nk - 1, -1, -1, device=fk.device).expand(B, Nk)
    else:
        after = key_mask.flip(-1).cumsum(-1).flip(-1) - 1      # real keys after j: N − j
    weight = step_size * geometric(momentum, after.clamp(min=0) + 1)
    if key_mask is not None:
        weight = weight * key_mask
    weight = weight.to(fk.dtype)
    kv = torch.einsum("bhnd,bn,bhne->bhde", fk, weight, v)    # Σ_j w_j φ(k_j) v_jᵀ
    z = fk.sum(2)                                              # Σ_j φ(k_j)
    denominator = (fq * z[:, :, None, :]).sum(-1, keepdim=True) + eps
    return (fq @ kv) / denominator

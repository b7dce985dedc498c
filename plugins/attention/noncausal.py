"""Non-causal momentum attention (eq. 14) in O(N): one weighted key-value sum per sequence.

Split in two so that cross-attention during decoding can summarise the encoder's keys and
values once and apply the summary to every new query."""
from typing import Optional, Tuple

import torch

from ..exported_eps import plus_eps
from .rule import MomentumRule


def noncausal_summary(fk: torch.Tensor, v: torch.Tensor, *, rule: MomentumRule,
                      key_mask: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """The sums of eq. 14: kv = γ Σ_j (1−β^(N−j+1))/(1−β) φ(k_j)v_jᵀ (B, H, Dk, Dv) and
    z = Σ_j φ(k_j) (B, H, Dk). fk (B, H, Nk, Dk), v (B, H, Nk, Dv): feature-mapped, padded keys
    zeroed; N and j count each row's real keys (key_mask (B, Nk), True = real; any pattern),
    so a padded row equals the same sequence alone. The weight is `rule.input_on_s` of the real
    keys after j (eq. 12's s after the whole sequence)."""
    after = real_after(key_mask, fk.shape[0], fk.shape[2], fk.device)
    weight = rule.input_on_s(after.clamp(min=0))
    if key_mask is not None:
        weight = weight * key_mask
    kv = torch.einsum("bhnd,bn,bhne->bhde", fk, weight.to(fk.dtype), v)
    return kv, fk.sum(2)


def real_after(mask: Optional[torch.Tensor], batch: int, length: int, device) -> torch.Tensor:
    """(B, N) the real tokens after each position (mask (B, N) True = real, or None: all real);
    −1 at padding after a row's last real token."""
    if mask is None:
        return torch.arange(length - 1, -1, -1, device=device).expand(batch, length)
    return mask.flip(-1).cumsum(-1).flip(-1) - 1


def apply_noncausal_summary(fq: torch.Tensor, kv: torch.Tensor, z: torch.Tensor, *,
                            eps: float) -> torch.Tensor:
    """Eq. 14's output for feature-mapped queries fq (B, H, Nq, Dk): φ(q_i)ᵀkv / (φ(q_i)ᵀz + eps)."""
    denominator = plus_eps((fq * z[:, :, None, :]).sum(-1, keepdim=True), eps)
    return (fq @ kv) / denominator

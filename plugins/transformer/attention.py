"""Multi-head self-attention of the shared block: q, k, v and output projections around
softmax attention, linear attention (Momentum Transformer, eq. 7) or momentum attention
(eq. 13 causal, eq. 14 non-causal, recurrent eq. 12 for generation) from `plugins.attention`."""
from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from ..attention.api import momentum_attention, momentum_attention_step
from ..attention.state import MomentumAttentionState
from .config import BlockConfig
from .kv_cache import KeyValueCache, cached_softmax_attention, extend_key_value_cache


def softmax_self_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
                           padding_mask: Optional[torch.Tensor]) -> torch.Tensor:
    """softmax(q kᵀ / √D) v over the real keys (padding_mask (B, N), True = real). Causal outputs
    at padded positions are 0, as momentum attention's are."""
    if padding_mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    real = padding_mask.to(torch.bool)
    allowed = real[:, None, None, :]
    if causal:
        n = q.shape[2]
        own = torch.eye(n, dtype=torch.bool, device=q.device)
        allowed = (allowed & torch.ones_like(own).tril()) | own
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
    return out * real[:, None, :, None].to(out.dtype) if causal else out


class MultiHeadAttention(nn.Module):
    """(B, N, d_model) → (B, N, d_model): A(x) = Dropout(o_proj(attend(q_proj x, k_proj x, v_proj x)))
    with `config.heads` heads. `process_group` (momentum/linear only): context parallelism, see
    `plugins.attention.momentum_attention`."""

    def __init__(self, config: BlockConfig):
        super().__init__()
        self.config = config
        d = config.d_model
        self.q_proj = nn.Linear(d, d)
        self.k_proj = nn.Linear(d, d)
        self.v_proj = nn.Linear(d, d)
        self.o_proj = nn.Linear(d, d)
        self.dropout = nn.Dropout(config.attention_dropout)
        self.process_group = None

    def forward(self, x: torch.Tensor, *, padding_mask: Optional[torch.Tensor] = None,
                state: Union[MomentumAttentionState, KeyValueCache, None] = None, recurrent: bool = False,
                packed=None) -> Tuple[torch.Tensor, Union[MomentumAttentionState, KeyValueCache, None]]:
        """padding_mask (B, N), True = real token. recurrent=True (causal blocks): continue `state`
        (None: fresh) by eq. 12 (momentum/linear) or as a KeyValueCache (softmax) and return the
        new state. `packed`: documents laid out as one row, an object with pack / unpack of
        (B, H, N, D) and `cu_seqlens` (hf_momentum.packing). Returns (output, new state or None)."""
        batch, length, _ = x.shape
        q, k, v = (self._heads(proj(x)) for proj in (self.q_proj, self.k_proj, self.v_proj))
        out, state = self.attend(q, k, v, padding_mask=padding_mask, state=state, recurrent=recurrent,
                                 packed=packed)
        out = out.transpose(1, 2).reshape(batch, length, self.config.d_model)
        return self.dropout(self.o_proj(out)), state

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        """(B, N, d_model) → (B, H, N, D)."""
        batch, length, _ = x.shape
        return x.view(batch, length, self.config.heads, self.config.head_dim).transpose(1, 2)

    def attend(self, q, k, v, *, padding_mask=None, state=None, recurrent=False, packed=None):
        """The attention of `config.attention` on (B, H, N, D) heads; returns (out, state). The
        state is a `MomentumAttentionState` (eq. 12) or, for softmax, a `KeyValueCache`."""
        config = self.config
        if state is not None and not recurrent:
            raise ValueError("state is continued only with recurrent=True")
        if recurrent and not config.causal:
            raise ValueError("recurrent=True needs a causal block (causal=False is eq. 14, which has "
                             "no recurrence)")
        if config.attention == "softmax":
            return self._attend_softmax(q, k, v, padding_mask=padding_mask, state=state,
                                        recurrent=recurrent, packed=packed)
        kwargs = dict(momentum=config.momentum or 0.0, step_size=config.step_size or 1.0,
                      feature_map=config.feature_map, padding_mask=padding_mask, chunk_size=config.chunk_size)
        if packed is not None:
            if recurrent:
                raise ValueError("packed documents run without a recurrent state")
            kwargs["padding_mask"] = None
            return packed.unpack(momentum_attention(packed.pack(q), packed.pack(k), packed.pack(v),
                                                    causal=config.causal, cu_seqlens=packed.cu_seqlens,
                                                    **kwargs)), None
        if recurrent:
            return momentum_attention_step(q, k, v, state, **kwargs)
        return momentum_attention(q, k, v, causal=config.causal, process_group=self.process_group,
                                  **kwargs), None

    def _attend_softmax(self, q, k, v, *, padding_mask, state, recurrent, packed):
        """Eq. 1; recurrent=True appends k, v to the `KeyValueCache` `state` (None: fresh) and
        attends to all of it, so generation does not re-read the prefix."""
        if packed is not None or self.process_group is not None:
            raise ValueError("attention='softmax' has no packed path or context parallelism: use "
                             "attention='linear' or 'momentum'")
        if not recurrent:
            return softmax_self_attention(q, k, v, causal=self.config.causal, padding_mask=padding_mask), None
        state = extend_key_value_cache(state, k, v, padding_mask)
        return cached_softmax_attention(q, state), state

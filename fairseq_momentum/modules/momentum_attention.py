"""fairseq-facing multi-head momentum attention: the projections of fairseq's
MultiheadAttention around `plugins.attention` (Momentum Transformer, eq. 12-14; docs/equations.md).

fairseq passes time-first tensors (T, B, C) and `key_padding_mask` with True = PAD; the
plugin takes (B, H, N, D) and True = real token. The equations live in the plugin only.
"""
import math
from typing import Dict, Optional

import torch
from fairseq.incremental_decoding_utils import with_incremental_state
from torch import Tensor, nn

from plugins.attention import (
    MomentumAttentionState,
    NonCausalSummary,
    attend_summary,
    momentum_attention,
    momentum_attention_step,
    summarize_keys,
)

_STATE_KEYS = ("s", "z", "m")


@with_incremental_state
class MomentumMultiheadAttention(nn.Module):
    """Drop-in for fairseq's `MultiheadAttention` (same call signature and projection names).

    causal=True: decoder self-attention, eq. 13 for a whole sequence and the recurrence
    eq. 12 during incremental decoding, whose state (S, z, m) lives in `incremental_state`
    and follows beam search through `reorder_incremental_state`.
    causal=False: eq. 14 with N = each sequence's number of real keys, for encoder or
    non-autoregressive self-attention and for cross-attention (query and key lengths may
    differ; during decoding the projected encoder keys and values are cached).
    momentum=0, step_size=1 is linear attention (eq. 5 / 7). No attention matrix exists,
    so no attention weights are returned and there is no attention dropout.
    """

    def __init__(self, embed_dim: int, num_heads: int, *, causal: bool, momentum: float,
                 step_size: float, feature_map: str = "elu", chunk_size: int = 64,
                 kdim: Optional[int] = None, vdim: Optional[int] = None, bias: bool = True,
                 self_attention: bool = True):
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim {embed_dim} is not divisible by the number of heads {num_heads}")
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.head_dim = embed_dim // num_heads
        self.causal, self.momentum, self.step_size = causal, momentum, step_size
        self.feature_map, self.chunk_size = feature_map, chunk_size
        self.self_attention = self_attention
        self.encoder_decoder_attention = not self_attention
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.k_proj = nn.Linear(kdim or embed_dim, embed_dim, bias=bias)
        self.v_proj = nn.Linear(vdim or embed_dim, embed_dim, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.reset_parameters()

    def reset_parameters(self):
        """fairseq MultiheadAttention's initialisation."""
        gain = 1 / math.sqrt(2) if self.self_attention else 1.0
        for proj in (self.q_proj, self.k_proj, self.v_proj):
            nn.init.xavier_uniform_(proj.weight, gain=gain)
        nn.init.xavier_uniform_(self.out_proj.weight)
        for proj in (self.q_proj, self.k_proj, self.v_proj, self.out_proj):
            if proj.bias is not None:
                nn.init.constant_(proj.bias, 0.0)

    def extra_repr(self):
        return (f"heads={self.num_heads}, causal={self.causal}, momentum={self.momentum}, "
                f"step_size={self.step_size}, feature_map={self.feature_map!r}")

    def _heads(self, x: Tensor) -> Tensor:
        """(T, B, C) -> (B, H, T, D)."""
        T, B, _ = x.shape
        return x.reshape(T, B, self.num_heads, self.head_dim).permute(1, 2, 0, 3)

    def forward(self, query: Tensor, key: Optional[Tensor], value: Optional[Tensor],
                key_padding_mask: Optional[Tensor] = None,
                incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
                need_weights: bool = False, static_kv: bool = False,
                attn_mask: Optional[Tensor] = None, before_softmax: bool = False,
                need_head_weights: bool = False):
        """query (Tq, B, C), key/value (Tk, B, C); key_padding_mask (B, Tk), True = PAD.
        `attn_mask` (fairseq's future mask) is implied by `causal` and ignored.
        Returns (output (Tq, B, C), None)."""
        tgt_len, bsz, _ = query.shape
        q = self._heads(self.q_proj(query))
        real = None if key_padding_mask is None else ~key_padding_mask.to(torch.bool)
        if self.causal:
            k, v = self._heads(self.k_proj(key)), self._heads(self.v_proj(value))
            out = self._causal(q, k, v, real, incremental_state)
        else:
            summary = self._key_summary(key, value, real, incremental_state, static_kv)
            out = attend_summary(q, summary, feature_map=self.feature_map)
        out = out.permute(2, 0, 1, 3).reshape(tgt_len, bsz, self.embed_dim)
        return self.out_proj(out), None

    def _causal(self, q, k, v, real, incremental_state):
        kwargs = dict(momentum=self.momentum, step_size=self.step_size,
                      feature_map=self.feature_map, padding_mask=real)
        if incremental_state is None:
            return momentum_attention(q, k, v, causal=True, chunk_size=self.chunk_size, **kwargs)
        saved = self._get_input_buffer(incremental_state)
        state = MomentumAttentionState(*(saved[n] for n in _STATE_KEYS)) if "s" in saved else None
        out, state = momentum_attention_step(q, k, v, state, chunk_size=self.chunk_size, **kwargs)
        self._set_input_buffer(incremental_state, {"s": state.s, "z": state.z, "m": state.m})
        return out

    def _key_summary(self, key, value, real, incremental_state, static_kv):
        """Eq. 14's key/value sums; during decoding the encoder's are computed once and cached,
        so each decoding step costs O(1) in the source length."""
        saved = self._get_input_buffer(incremental_state) if static_kv else {}
        if "kv" in saved:
            return NonCausalSummary(saved["kv"], saved["z"])
        k, v = self._heads(self.k_proj(key)), self._heads(self.v_proj(value))
        summary = summarize_keys(k, v, momentum=self.momentum, step_size=self.step_size,
                                 feature_map=self.feature_map, padding_mask=real)
        if incremental_state is not None and static_kv:
            self._set_input_buffer(incremental_state, {"kv": summary.kv, "z": summary.z})
        return summary

    def reorder_incremental_state(self, incremental_state: Dict[str, Dict[str, Optional[Tensor]]],
                                  new_order: Tensor):
        """Select the surviving beams' states (rows of every buffered tensor)."""
        buffer = self._get_input_buffer(incremental_state)
        if buffer:
            reordered = {name: t.index_select(0, new_order.to(t.device))
                         for name, t in buffer.items() if t is not None}
            incremental_state = self._set_input_buffer(incremental_state, reordered)
        return incremental_state

    def _get_input_buffer(self, incremental_state) -> Dict[str, Optional[Tensor]]:
        result = self.get_incremental_state(incremental_state, "attn_state")
        return {} if result is None else result

    def _set_input_buffer(self, incremental_state, buffer: Dict[str, Optional[Tensor]]):
        return self.set_incremental_state(incremental_state, "attn_state", buffer)

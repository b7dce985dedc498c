"""fairseq's face of the shared multi-head attention `plugins.transformer.MultiHeadAttention`
(Momentum Transformer, eq. 12-14; docs/equations.md).

Only the glue lives here: fairseq passes time-first tensors (T, B, C) and `key_padding_mask` with
True = PAD, keeps decoding state in `incremental_state` and reorders it for beam search, and
initialises attention its own way. Projections, equations and their checks are the shared module's.
"""
import math
from typing import Dict, Optional

import torch
from fairseq.incremental_decoding_utils import with_incremental_state
from torch import Tensor, nn

from plugins.attention import MomentumAttentionState, NonCausalSummary
from plugins.transformer import BlockConfig, MultiHeadAttention

from ..options import BLOCK_DEFAULTS

_STATE_KEYS = ("s", "z", "m")
_SUMMARY_KEYS = ("kv", "z")


@with_incremental_state
class MomentumMultiheadAttention(MultiHeadAttention):
    """Drop-in for fairseq's `MultiheadAttention` (its call signature).

    causal=True: decoder self-attention, eq. 13 for a whole sequence and the recurrence
    eq. 12 during incremental decoding, whose state (S, z, m) lives in `incremental_state`
    and follows beam search through `reorder_incremental_state`.
    causal=False: eq. 14 with N = each sequence's number of real keys, for encoder or
    non-autoregressive self-attention, and for cross-attention (self_attention=False; query
    and key lengths may differ; during decoding the encoder's key summary is cached).
    momentum=0, step_size=1 is linear attention (eq. 5 / 7). No attention matrix exists,
    so no attention weights are returned and there is no attention dropout.
    """

    def __init__(self, embed_dim: int, num_heads: int, *, causal: bool, momentum: float,
                 step_size: float, feature_map: str = BLOCK_DEFAULTS["feature_map"],
                 chunk_size: int = BLOCK_DEFAULTS["chunk_size"], kdim: Optional[int] = None,
                 vdim: Optional[int] = None, self_attention: bool = True):
        if not self_attention and causal:
            raise ValueError("cross-attention (self_attention=False) is eq. 14: it needs causal=False")
        config = BlockConfig(embed_dim, num_heads, attention="momentum", momentum=momentum,
                             step_size=step_size, feature_map=feature_map, causal=causal,
                             chunk_size=chunk_size)
        super().__init__(config, kdim=kdim, vdim=vdim)
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, config.head_dim
        self.self_attention = self_attention
        self.encoder_decoder_attention = not self_attention
        self.reset_parameters()

    causal = property(lambda self: self.config.causal)
    momentum = property(lambda self: self.config.momentum)
    step_size = property(lambda self: self.config.step_size)
    feature_map = property(lambda self: self.config.feature_map)
    # fairseq's MultiheadAttention name for the output projection, for code that reads it; the
    # parameters live (and are saved) under o_proj only.
    out_proj = property(lambda self: self.o_proj)

    def reset_parameters(self):
        """fairseq MultiheadAttention's initialisation."""
        gain = 1 / math.sqrt(2) if self.self_attention else 1.0
        for proj in (self.q_proj, self.k_proj, self.v_proj):
            nn.init.xavier_uniform_(proj.weight, gain=gain)
        nn.init.xavier_uniform_(self.o_proj.weight)
        for proj in (self.q_proj, self.k_proj, self.v_proj, self.o_proj):
            nn.init.constant_(proj.bias, 0.0)

    def extra_repr(self):
        return (f"heads={self.num_heads}, causal={self.causal}, momentum={self.momentum}, "
                f"step_size={self.step_size}, feature_map={self.feature_map!r}")

    def forward(self, query: Tensor, key: Optional[Tensor], value: Optional[Tensor],
                key_padding_mask: Optional[Tensor] = None,
                incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
                need_weights: bool = False, static_kv: bool = False,
                attn_mask: Optional[Tensor] = None, before_softmax: bool = False,
                need_head_weights: bool = False):
        """query (Tq, B, C), key/value (Tk, B, C); key_padding_mask (B, Tk), True = PAD.
        Self-attention reads query only (fairseq passes key = value = query); `attn_mask`
        (fairseq's future mask) is implied by `causal` and ignored. Returns (output (Tq, B, C), None)."""
        x = query.transpose(0, 1)
        real = None if key_padding_mask is None else ~key_padding_mask.to(torch.bool)
        if self.encoder_decoder_attention:
            out = self._cross(x, key, value, real, incremental_state if static_kv else None)
        elif self.causal and incremental_state is not None:
            out = self._step(x, real, incremental_state)
        else:
            out, _ = super().forward(x, padding_mask=real)
        return out.transpose(0, 1).contiguous(), None

    def _step(self, x, real, incremental_state):
        """Eq. 12 from the state the previous decoding step stored."""
        saved = self._get_input_buffer(incremental_state)
        state = MomentumAttentionState(*(saved[n] for n in _STATE_KEYS)) if "s" in saved else None
        out, state = super().forward(x, padding_mask=real, state=state, recurrent=True)
        self._set_input_buffer(incremental_state, {n: getattr(state, n) for n in _STATE_KEYS})
        return out

    def _cross(self, x, key, value, real, incremental_state):
        """Eq. 14 over the encoder's output; while decoding, its key summary is computed at the
        first step and reused, so each step costs O(1) in the source length."""
        saved = {} if incremental_state is None else self._get_input_buffer(incremental_state)
        if "kv" in saved:
            return self.cross_attention(x, summary=NonCausalSummary(saved["kv"], saved["z"]))[0]
        if key is None:
            raise ValueError("cross-attention needs key (the encoder output) at the first decoding step")
        out, summary = self.cross_attention(x, key.transpose(0, 1),
                                            None if value is None else value.transpose(0, 1),
                                            padding_mask=real)
        if incremental_state is not None:
            self._set_input_buffer(incremental_state, {n: getattr(summary, n) for n in _SUMMARY_KEYS})
        return out

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

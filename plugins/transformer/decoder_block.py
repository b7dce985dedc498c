"""The decoder block of an encoder-decoder momentum transformer (Momentum Transformer, Section 3:
the machine-translation setup): the shared block's self-attention and residual (causal eq. 13,
recurrent eq. 12 when generating; the connection eq. 15 / 18), then cross-attention to the
encoder's output, then the feed-forward network:

pre-LN:  h = conn(x, A(LN(x))),  c = h + C(LN(h), memory),  out = c + FFN(LN(c));
post-LN: h = LN(conn(x, A(x))),  c = LN(h + C(h, memory)),  out = LN(c + FFN(c)),

with C eq. 14 (momentum or linear attention) or softmax attention over the memory's real
positions. Only the self-attention residual is the connection, as in fairseq's momentum decoder
layers. The memory is what `summarize_memory` keeps of the encoder's output: eq. 14's key/value
sums, or the projected keys and values, computed once per source and reused at every step."""
from dataclasses import replace
from typing import Optional, Union

import torch
from torch import nn

from ..attention.state import NonCausalSummary
from ..validation import check_choice
from .attention import MultiHeadAttention
from .block import BlockOutput, TransformerBlock
from .config import ATTENTION_KINDS, BlockConfig
from .kv_cache import KeyValueCache

Memory = Union[NonCausalSummary, KeyValueCache]


def cross_attention_config(base: BlockConfig, kind: str) -> BlockConfig:
    """The cross-attention's config: base's, with attention `kind`, never causal and no window.
    "momentum" keeps base's β, γ when base is momentum attention (one β, γ for the decoder, as
    fairseq's --attention-momentum), else the defaults; "linear" is β = 0, γ = 1 (eq. 7)."""
    check_choice(kind, "cross_attention", ATTENTION_KINDS)
    coefficients = dict(momentum=None, step_size=None)
    if kind == "momentum" and base.attention == "momentum":
        coefficients = dict(momentum=base.momentum, step_size=base.step_size)
    return replace(base, attention=kind, causal=False, sliding_window=None, **coefficients)


class DecoderBlock(TransformerBlock):
    """`TransformerBlock` with cross-attention (module docstring). config: the self-attention
    block's (causal); cross: the cross-attention's (`cross_attention_config`); memory_dim: the
    encoder's feature size (None: config.d_model)."""

    def __init__(self, config: BlockConfig, cross: BlockConfig, *, memory_dim: Optional[int] = None):
        super().__init__(config)
        if not isinstance(cross, BlockConfig) or cross.causal or cross.d_model != config.d_model:
            raise ValueError("cross must be a non-causal BlockConfig of the block's d_model "
                             "(cross_attention_config)")
        self.cross_attention = MultiHeadAttention(cross, kdim=memory_dim, vdim=memory_dim)
        self.cross_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)

    def summarize_memory(self, encoder_hidden: torch.Tensor,
                         padding_mask: Optional[torch.Tensor] = None) -> Memory:
        """What cross-attention keeps of the encoder's output (B, M, memory_dim); padding_mask
        (B, M), True = real source token."""
        return self.cross_attention.summarize(encoder_hidden, padding_mask=padding_mask)

    def forward(self, x: torch.Tensor, connection_state=None, *, memory: Memory, **attention) -> BlockOutput:
        """x (B, N, d_model); memory from `summarize_memory` (batch B); `attention` as in
        `TransformerBlock.forward`."""
        h, connection_state, attention_state = self.attention_sublayer(x, connection_state, **attention)
        c = h + self.cross_attention.cross_attention(self.cross_norm(h) if self.pre_norm else h,
                                                     summary=memory)[0]
        if not self.pre_norm:
            c = self.cross_norm(c)
        return BlockOutput(self.feed_forward_sublayer(c), connection_state, attention_state)

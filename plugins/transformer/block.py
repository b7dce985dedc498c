"""One transformer block (Momentum Transformer, Section 3): multi-head softmax / linear /
momentum attention, the residual around it plain or the momentum connection (eq. 15, adaptive
eq. 18, `plugins.connection`), a feed-forward network, pre- or post-layer norm.

pre-LN:  h = conn(x, A(LN(x))),  out = h + FFN(LN(h));
post-LN: h = LN(conn(x, A(x))),  out = LN(h + FFN(h)),
with conn(x, A) = x + A for connection="none"."""
from typing import NamedTuple, Optional

import torch
from torch import nn

from ..attention.state import MomentumAttentionState
from ..connection import ConnectionState, build_connection
from ..packing import Segments
from .attention import MultiHeadAttention
from .config import BlockConfig
from .dropout import apply_dropout
from .softmax_mask import SoftmaxMasks

ACTIVATION_MODULES = {"relu": nn.ReLU, "gelu": nn.GELU}


class BlockOutput(NamedTuple):
    """A block's output, the connection state for the next block (None without a connection)
    and the attention state after this call (None unless recurrent)."""

    hidden: torch.Tensor
    connection_state: Optional[ConnectionState]
    attention_state: Optional[MomentumAttentionState]


class FeedForward(nn.Module):
    """FFN(h) = Dropout(fc_out(Dropout(act(fc_in h))))."""

    def __init__(self, config: BlockConfig):
        super().__init__()
        self.fc_in = nn.Linear(config.d_model, config.ffn_dim)
        self.fc_out = nn.Linear(config.ffn_dim, config.d_model)
        act = config.activation
        self.act = ACTIVATION_MODULES[act]() if isinstance(act, str) else act
        self.activation_dropout = nn.Dropout(config.activation_dropout)
        self.dropout = nn.Dropout(config.hidden_dropout)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        hidden = apply_dropout(self.activation_dropout, self.act(self.fc_in(h)))
        return apply_dropout(self.dropout, self.fc_out(hidden))


class TransformerBlock(nn.Module):
    """The block of the module docstring for a `BlockConfig`. The connection state is passed
    from block to block within one forward pass (start with None)."""

    def __init__(self, config: BlockConfig):
        super().__init__()
        if not isinstance(config, BlockConfig):
            raise ValueError(f"config must be a BlockConfig, got {type(config).__name__}")
        self.config = config
        self.pre_norm = config.norm == "pre"
        self.attn_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.attention = MultiHeadAttention(config)
        self.mlp_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.mlp = FeedForward(config)
        self.connection = build_connection(config.connection, momentum=config.connection_momentum,
                                           step_size=config.connection_step_size,
                                           delta=config.connection_delta)

    def forward(self, x: torch.Tensor, connection_state: Optional[ConnectionState] = None, *,
                segments: Optional[Segments] = None,
                attention_state: Optional[MomentumAttentionState] = None, recurrent: bool = False,
                padding_mask: Optional[torch.Tensor] = None,
                softmax_masks: Optional[SoftmaxMasks] = None) -> BlockOutput:
        """x (B, N, d_model); segments, attention_state, recurrent, padding_mask and softmax_masks
        as in `MultiHeadAttention.forward`."""
        h, connection_state, attention_state = self.attention_sublayer(
            x, connection_state, segments=segments, attention_state=attention_state, recurrent=recurrent,
            padding_mask=padding_mask, softmax_masks=softmax_masks)
        return BlockOutput(self.feed_forward_sublayer(h), connection_state, attention_state)

    def attention_sublayer(self, x: torch.Tensor, connection_state: Optional[ConnectionState], **attention):
        """h = conn(x, A(LN(x))) (pre-LN) or LN(conn(x, A(x))) (post-LN); returns (h, connection
        state, attention state). `attention`: the keyword arguments of `MultiHeadAttention.forward`
        (attention_state as `state`)."""
        attention["state"] = attention.pop("attention_state", None)
        update, attention_state = self.attention(self.attn_norm(x) if self.pre_norm else x, **attention)
        h, connection_state = self.residual(x, update, connection_state)
        return (h if self.pre_norm else self.attn_norm(h)), connection_state, attention_state

    def feed_forward_sublayer(self, h: torch.Tensor) -> torch.Tensor:
        """h + FFN(LN(h)) (pre-LN) or LN(h + FFN(h)) (post-LN)."""
        if self.pre_norm:
            return h + self.mlp(self.mlp_norm(h))
        return self.mlp_norm(h + self.mlp(h))

    def residual(self, x: torch.Tensor, update: torch.Tensor, state: Optional[ConnectionState]):
        """x + A, or eq. 15 / eq. 18 carrying `state` (Momentum Transformer, Section 3.2)."""
        if self.connection is None:
            if state is not None:
                raise ValueError("connection_state is carried only with a momentum or adaptive connection")
            return x + update, None
        return self.connection(x, update, state)

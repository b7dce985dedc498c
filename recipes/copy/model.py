"""Small causal decoder-only transformer for the copy task, in the five variants of
Momentum Transformer, Figure 1 / Table 1.

The attention equations come from `plugins.attention` (linear eq. 7, momentum eq. 13) and
`torch.nn.functional.scaled_dot_product_attention` (softmax); the residual around attention
is either the plain one or `plugins.connection` (eq. 15, adaptive eq. 18). Blocks are post-LN,
as in the linear transformer's copy-task model that Section 4.1 follows; the connection sits
where `plugins.connection` documents for post-LN.
"""
import math
from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn
from torch.nn import functional as F

from plugins.attention import linear_attention, momentum_attention
from plugins.connection import AdaptiveMomentumConnection, MomentumConnection


@dataclass(frozen=True)
class Variant:
    """One model of Figure 1: its attention and its attention residual (Table 1 constants)."""

    attention: str                      # "softmax" | "linear" | "momentum"
    momentum: float = 0.0               # β of eq. 13
    step_size: float = 1.0              # γ of eq. 13
    connection: Optional[str] = None    # None (x + A) | "momentum" (eq. 15) | "adaptive" (eq. 18)
    connection_momentum: float = 0.0    # μ_r
    connection_step_size: float = 1.0   # γ_r


# Table 1, "Copy Task" rows.
VARIANTS = {
    "softmax": Variant("softmax"),
    "linear": Variant("linear"),
    "momentum": Variant("momentum", momentum=0.1, step_size=0.6),
    "momentum+connection": Variant("momentum", momentum=0.1, step_size=0.6,
                                   connection="momentum", connection_momentum=0.99,
                                   connection_step_size=0.99),
    "adaptive": Variant("momentum", momentum=0.1, step_size=0.6, connection="adaptive",
                        connection_step_size=0.99),
}


def softmax_attention(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def attention_function(variant: Variant):
    """(q, k, v) (B, H, N, D) → (B, H, N, D), causal."""
    if variant.attention == "softmax":
        return softmax_attention
    if variant.attention == "linear":
        return lambda q, k, v: linear_attention(q, k, v, causal=True)
    if variant.attention == "momentum":
        return lambda q, k, v: momentum_attention(q, k, v, momentum=variant.momentum,
                                                  step_size=variant.step_size, causal=True)
    raise ValueError(f"unknown attention {variant.attention!r}")


def residual_connection(variant: Variant) -> Optional[nn.Module]:
    if variant.connection is None:
        return None
    if variant.connection == "momentum":
        return MomentumConnection(variant.connection_momentum, variant.connection_step_size)
    if variant.connection == "adaptive":
        return AdaptiveMomentumConnection(step_size=variant.connection_step_size)
    raise ValueError(f"unknown connection {variant.connection!r}")


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, heads: int, attend, dropout: float):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.attend = attend
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        B, N, D = x.shape
        q, k, v = self.qkv(x).view(B, N, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
        y = self.attend(q, k, v).transpose(1, 2).reshape(B, N, D)
        return self.dropout(self.out(y))


class Block(nn.Module):
    """Post-LN block: h = LN(residual(x, A(x))); x' = LN(h + FFN(h))."""

    def __init__(self, d_model: int, heads: int, variant: Variant, dropout: float):
        super().__init__()
        self.attention = CausalSelfAttention(d_model, heads, attention_function(variant), dropout)
        self.connection = residual_connection(variant)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.ffn = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.ReLU(), nn.Dropout(dropout),
                                 nn.Linear(4 * d_model, d_model), nn.Dropout(dropout))

    def forward(self, x, state=None):
        update = self.attention(x)
        if self.connection is None:
            h = x + update
        else:
            h, state = self.connection(x, update, state)
        h = self.norm1(h)
        return self.norm2(h + self.ffn(h)), state


def sinusoidal_positions(length: int, dim: int) -> torch.Tensor:
    position = torch.arange(length, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    table = torch.zeros(length, dim)
    table[:, 0::2] = torch.sin(position * freq)
    table[:, 1::2] = torch.cos(position * freq[: dim // 2])
    return table


class CopyTransformer(nn.Module):
    """Token embedding (half the width) concatenated with sinusoidal positions (other half),
    `layers` blocks, a linear next-token head over 0..n_symbols."""

    def __init__(self, variant: Variant, *, n_symbols: int, max_length: int, layers: int,
                 heads: int, head_dim: int, dropout: float = 0.0):
        super().__init__()
        d_model = heads * head_dim
        if d_model % 2:
            raise ValueError(f"heads * head_dim must be even, got {d_model}")
        self.embed = nn.Embedding(n_symbols + 1, d_model // 2)
        self.register_buffer("positions", sinusoidal_positions(max_length, d_model // 2),
                             persistent=False)
        self.blocks = nn.ModuleList(Block(d_model, heads, variant, dropout) for _ in range(layers))
        self.head = nn.Linear(d_model, n_symbols + 1)

    def forward(self, tokens):
        B, N = tokens.shape
        x = torch.cat([self.embed(tokens), self.positions[:N].expand(B, N, -1)], dim=-1)
        state = None
        for block in self.blocks:
            x, state = block(x, state)
        return self.head(x)

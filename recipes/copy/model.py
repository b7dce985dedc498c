"""Small causal decoder-only transformer for the copy task, in the five variants of
Momentum Transformer, Figure 1 / Table 1.

The blocks are the shared `plugins.transformer.TransformerBlock`: softmax attention, linear
eq. 7 or momentum eq. 13, the residual around attention plain or `plugins.connection` (eq. 15,
adaptive eq. 18). Blocks are post-LN, as in the linear transformer's copy-task model that
Section 4.1 follows; the connection sits where `plugins.connection` documents for post-LN.
"""
import math
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
from torch import nn

from plugins.transformer import BlockConfig, TransformerBlock, TransformerStack
from plugins.transformer.config import stack_configs


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


def block_config(variant: Variant, d_model: int, heads: int, dropout: float) -> BlockConfig:
    """Post-LN, ReLU FFN of width 4 · d_model, `dropout` after attention and in the FFN."""
    momentum = variant.attention == "momentum"
    return BlockConfig(d_model, heads, attention=variant.attention,
                       momentum=variant.momentum if momentum else None,
                       step_size=variant.step_size if momentum else None, causal=True, norm="post",
                       activation="relu", attention_dropout=dropout, activation_dropout=dropout,
                       hidden_dropout=dropout, connection=variant.connection or "none",
                       connection_momentum=variant.connection_momentum,
                       connection_step_size=variant.connection_step_size)


def layer_block_configs(variant: Variant, d_model: int, heads: int, dropout: float, layers: int,
                        layer_types: Optional[Sequence[str]] = None):
    """One block config per layer: the variant's block, with softmax attention in the
    "full_attention" layers of `layer_types` (transformers' vocabulary; None: none)."""
    return stack_configs(block_config(variant, d_model, heads, dropout), layers, layer_types)


def copy_block(config: BlockConfig) -> TransformerBlock:
    """A shared block initialised as the recipe's former block drew its weights (nn.Linear
    defaults: a fused (3·d, d) q/k/v projection, the output projection, the FFN), so a seeded
    run gives the same model as before."""
    with torch.random.fork_rng(devices=[]):
        block = TransformerBlock(config)
    d = config.d_model
    qkv, out = nn.Linear(d, 3 * d), nn.Linear(d, d)
    fc_in, fc_out = nn.Linear(d, config.ffn_dim), nn.Linear(config.ffn_dim, d)
    attention = block.attention
    with torch.no_grad():
        for name in ("weight", "bias"):
            for proj, part in zip((attention.q_proj, attention.k_proj, attention.v_proj),
                                  getattr(qkv, name).chunk(3, 0)):
                getattr(proj, name).copy_(part)
            pairs = ((attention.o_proj, out), (block.mlp.fc_in, fc_in), (block.mlp.fc_out, fc_out))
            for target, source in pairs:
                getattr(target, name).copy_(getattr(source, name))
    return block


def sinusoidal_positions(length: int, dim: int) -> torch.Tensor:
    position = torch.arange(length, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    table = torch.zeros(length, dim)
    table[:, 0::2] = torch.sin(position * freq)
    table[:, 1::2] = torch.cos(position * freq[: dim // 2])
    return table


class CopyTransformer(nn.Module):
    """Token embedding (half the width) concatenated with sinusoidal positions (other half),
    `layers` blocks, a linear next-token head over 0..n_symbols. layer_types: transformers'
    vocabulary per layer, "full_attention" for a softmax layer (None: the variant's attention in
    every layer); each block draws its weights alike whatever its attention."""

    def __init__(self, variant: Variant, *, n_symbols: int, max_length: int, layers: int,
                 heads: int, head_dim: int, dropout: float = 0.0,
                 layer_types: Optional[Sequence[str]] = None):
        super().__init__()
        d_model = heads * head_dim
        if d_model % 2:
            raise ValueError(f"heads * head_dim must be even, got {d_model}")
        self.embed = nn.Embedding(n_symbols + 1, d_model // 2)
        self.register_buffer("positions", sinusoidal_positions(max_length, d_model // 2),
                             persistent=False)
        configs = layer_block_configs(variant, d_model, heads, dropout, layers, layer_types)
        self.blocks = TransformerStack(copy_block(config) for config in configs)
        self.head = nn.Linear(d_model, n_symbols + 1)

    def forward(self, tokens):
        B, N = tokens.shape
        x = torch.cat([self.embed(tokens), self.positions[:N].expand(B, N, -1)], dim=-1)
        return self.head(self.blocks(x).hidden)

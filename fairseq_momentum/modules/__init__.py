"""Building blocks: fairseq-shaped wrappers around `plugins`."""
from .momentum_attention import MomentumMultiheadAttention
from .momentum_transformer_layer import (
    MomentumDecoderMixin,
    MomentumEncoderMixin,
    MomentumTransformerDecoderLayer,
    MomentumTransformerEncoderLayer,
)

__all__ = ["MomentumMultiheadAttention", "MomentumEncoderMixin", "MomentumDecoderMixin",
           "MomentumTransformerEncoderLayer", "MomentumTransformerDecoderLayer"]

"""The `plugins` objects the native models use, re-exported for the modeling files.

The modeling files import them with `from .momentum_core import ...`, so a saved model's
remote code needs this one flat sibling. In the package it re-exports `plugins`; at save
time `bundled_source()` writes a generated, self-contained copy of the needed `plugins`
modules under this file's name next to the saved modeling file (see `hf_momentum.flatten`).
"""
from plugins.attention import (
    FEATURE_MAPS,
    AttentionSpec,
    MomentumAttentionState,
    NonCausalSummary,
    attend,
    momentum_attention,
    momentum_attention_step,
)
from plugins.connection import (
    CONNECTION_READS,
    DEFAULT_ADAPTIVE_DELTA,
    DEFAULT_CONNECTION_MOMENTUM,
    DEFAULT_CONNECTION_STEP_SIZE,
    AdaptiveMomentumConnection,
    ConnectionState,
    MomentumConnection,
    build_connection,
    unread_connection_fields,
)
from plugins.packing import Segments
from plugins.transformer.attention import MultiHeadAttention
from plugins.transformer.block import TransformerBlock
from plugins.transformer.config import (
    DEFAULT_ATTENTION_MOMENTUM,
    DEFAULT_ATTENTION_STEP_SIZE,
    NORM_PLACEMENTS,
    BlockConfig,
    block_feature_maps,
    layer_configs,
)
from plugins.transformer.decoder_block import DecoderBlock, cross_attention_config
from plugins.transformer.dropout import apply_dropout
from plugins.transformer.kv_cache import KeyValueCache
from plugins.transformer.pooling import POOLINGS
from plugins.transformer.stack import TransformerStack

BUNDLED_MODULES = ("plugins.attention.api", "plugins.connection", "plugins.transformer.block",
                   "plugins.transformer.decoder_block",
                   "plugins.transformer.pooling", "plugins.transformer.stack", "plugins.packing")
EXPORTS = ("FEATURE_MAPS", "AttentionSpec", "attend", "MomentumAttentionState", "momentum_attention",
           "momentum_attention_step",
           "AdaptiveMomentumConnection", "ConnectionState", "MomentumConnection", "build_connection",
           "DEFAULT_CONNECTION_MOMENTUM", "DEFAULT_CONNECTION_STEP_SIZE", "DEFAULT_ADAPTIVE_DELTA",
           "CONNECTION_READS", "unread_connection_fields", "BlockConfig", "block_feature_maps",
           "DEFAULT_ATTENTION_MOMENTUM", "DEFAULT_ATTENTION_STEP_SIZE", "NORM_PLACEMENTS",
           "MultiHeadAttention", "TransformerBlock", "TransformerStack", "Segments", "POOLINGS",
           "layer_configs", "KeyValueCache", "apply_dropout", "NonCausalSummary", "DecoderBlock",
           "cross_attention_config")


def bundled_source() -> str:
    """Source of the self-contained file that replaces this one in a saved model."""
    from hf_momentum.flatten import flatten_modules
    return flatten_modules(BUNDLED_MODULES, EXPORTS)

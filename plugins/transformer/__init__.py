"""The transformer block shared by the HF native model and the recipes (docs/equations.md)."""
from .attention import MultiHeadAttention, softmax_self_attention
from .block import BlockOutput, FeedForward, TransformerBlock
from .config import ATTENTION_KINDS, BlockConfig, layer_configs
from .decoder_block import DecoderBlock, cross_attention_config
from .kv_cache import KeyValueCache, cached_softmax_attention, extend_key_value_cache
from .pooling import POOLINGS, first_real, masked_mean
from .softmax_mask import SoftmaxMasks, softmax_mask
from .stack import StackOutput, TransformerStack

__all__ = ["ATTENTION_KINDS", "BlockConfig", "BlockOutput", "DecoderBlock", "FeedForward", "KeyValueCache",
           "MultiHeadAttention", "SoftmaxMasks", "TransformerBlock", "cached_softmax_attention",
           "cross_attention_config", "extend_key_value_cache", "layer_configs", "StackOutput",
           "TransformerStack", "masked_mean", "first_real", "POOLINGS", "softmax_mask",
           "softmax_self_attention"]

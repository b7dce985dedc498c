"""The transformer block shared by the HF native model and the recipes (docs/equations.md)."""
from .attention import MultiHeadAttention, softmax_self_attention
from .block import BlockOutput, FeedForward, TransformerBlock
from .config import ATTENTION_KINDS, BlockConfig

__all__ = ["ATTENTION_KINDS", "BlockConfig", "BlockOutput", "FeedForward", "MultiHeadAttention",
           "TransformerBlock", "softmax_self_attention"]

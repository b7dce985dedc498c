"""A tiny native MomentumTransformer config, and the model written out with plugins' quadratic
references (eq. 13/14) and connections, to test the HF model against."""
import torch
from transformers import AutoConfig

import hf_momentum  # noqa: F401  (registers momentum_transformer with AutoConfig)
from plugins.attention import naive_causal_momentum_attention, naive_noncausal_momentum_attention
from plugins.connection import AdaptiveMomentumConnection, MomentumConnection

PAD = 0


def tiny(**kwargs):
    base = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=64, max_position_embeddings=64, hidden_dropout=0.0, pad_token_id=PAD,
                bos_token_id=1, eos_token_id=2, attention_momentum=0.5, attention_step_size=0.8)
    base.update(kwargs)
    return AutoConfig.for_model("momentum_transformer", **base)


def reference_forward(model, ids, mask=None, after_attention=None):
    """The model written out with plugins' quadratic references (eq. 13/14) and connections.
    after_attention(layer, h): applied after each attention sublayer (a decoder's cross-attention)."""
    config = model.config
    causal = config.is_causal
    pos = torch.arange(ids.shape[1])[None] if mask is None else (mask.cumsum(-1) - 1).clamp(min=0)
    x = model.embed_norm(model.embed_tokens(ids) + model.embed_positions(pos))
    heads, dim = config.num_attention_heads, config.hidden_size // config.num_attention_heads
    padding = None if mask is None else mask.bool()
    conn = {"momentum": MomentumConnection(config.connection_momentum, config.connection_step_size),
            "adaptive": AdaptiveMomentumConnection(config.connection_step_size, config.adaptive_delta)
            }.get(config.connection)
    state = None
    for layer in model.layers:
        att = layer.attention
        inp = layer.attn_norm(x) if config.layer_norm == "pre" else x
        q, k, v = (p(inp).view(*ids.shape, heads, dim).transpose(1, 2)
                   for p in (att.q_proj, att.k_proj, att.v_proj))
        naive = naive_causal_momentum_attention if causal else naive_noncausal_momentum_attention
        a = naive(q, k, v, momentum=config.attention_momentum, step_size=config.attention_step_size,
                  padding_mask=padding)
        a = att.o_proj(a.transpose(1, 2).reshape(*ids.shape, -1))
        h = x + a if conn is None else None
        if conn is not None:
            h, state = conn(x, a, state)
        if config.layer_norm == "post":
            h = layer.attn_norm(h)
        if after_attention is not None:
            h = after_attention(layer, h)
        if config.layer_norm == "post":
            x = layer.mlp_norm(h + layer.mlp(h))
        else:
            x = h + layer.mlp(layer.mlp_norm(h))
    return model.norm(x)

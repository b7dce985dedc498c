"""The models the tests of the native families' task heads (token classification, question
answering) run on: causal and bidirectional momentum transformers, a bidirectional hybrid, and
LSTMs with a momentum and an Adam cell, all without dropout."""
from transformers import AutoConfig

import hf_momentum  # noqa: F401  (registers the model types with the Auto classes)

VOCAB = 40
PAD = VOCAB - 1
TRANSFORMER = dict(num_attention_heads=2, intermediate_size=32, max_position_embeddings=64,
                   hidden_dropout=0.0, attention_momentum=0.5, attention_step_size=0.8, connection="adaptive")
MODELS = {
    "transformer-causal": ("momentum_transformer", TRANSFORMER),
    "transformer-bidirectional": ("momentum_transformer", dict(TRANSFORMER, is_causal=False)),
    "hybrid-bidirectional": ("momentum_transformer", dict(
        TRANSFORMER, is_causal=False, layer_types=["linear_attention", "full_attention"])),
    "lstm-momentum": ("momentum_lstm", dict(cell="momentum", initializer_range=0.5)),
    "lstm-adam": ("momentum_lstm", dict(cell="adam", initializer_range=0.5)),
}


def head_config(name, **overrides):
    """The config of MODELS[name] (two layers of 16, vocabulary VOCAB with pad id PAD)."""
    model_type, kwargs = MODELS[name]
    sizes = dict(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, pad_token_id=PAD)
    return AutoConfig.for_model(model_type, **{**sizes, **kwargs, **overrides})

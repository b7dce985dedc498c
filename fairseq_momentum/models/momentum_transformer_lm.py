"""Decoder-only momentum transformer for `--task language_modeling`
(causal momentum attention, Momentum Transformer eq. 12/13; docs/equations.md).

`--arch momentum_transformer_lm` (and the `_big`, `_wiki103`, `_gpt`, `_gpt2_small`
presets) takes every argument of fairseq's transformer_lm plus the momentum ones;
`linear_transformer_lm` is the same code with momentum 0 and step size 1 (eq. 7).
"""
from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.models.transformer import TransformerConfig
from fairseq.models.transformer_lm import (
    TransformerLanguageModel,
    TransformerLanguageModelConfig,
    base_lm_architecture,
    transformer_lm_baevski_wiki103,
    transformer_lm_big,
    transformer_lm_gpt,
    transformer_lm_gpt2_small,
)

from ..configs import as_namespace
from ..options import add_momentum_attention_args, momentum_attention_defaults
from ..registry import model, momentum_preset
from .momentum_transformer import MomentumTransformerDecoder


@model("momentum_transformer_lm")
class MomentumTransformerLanguageModel(TransformerLanguageModel):
    @classmethod
    def hub_models(cls):
        return {}

    @staticmethod
    def add_args(parser):
        gen_parser_from_dataclass(parser, TransformerLanguageModelConfig(), delete_default=True)
        add_momentum_attention_args(parser, cross_attention=False)

    @classmethod
    def build_model(cls, args, task):
        """fairseq's transformer_lm build (embeddings, adaptive input, ...), then its decoder
        is rebuilt with momentum layers around the same embedding."""
        args = as_namespace(args)
        momentum_attention_defaults(args)
        embed_tokens = super().build_model(args, task).decoder.embed_tokens
        return cls(MomentumTransformerDecoder(TransformerConfig.from_namespace(args),
                                              task.target_dictionary, embed_tokens,
                                              no_encoder_attn=True))


MODEL = "momentum_transformer_lm"
momentum_transformer_lm = momentum_preset(MODEL, "momentum_transformer_lm", base_lm_architecture)
momentum_transformer_lm_big = momentum_preset(MODEL, "momentum_transformer_lm_big", transformer_lm_big)
momentum_transformer_lm_wiki103 = momentum_preset(MODEL, "momentum_transformer_lm_wiki103",
                                                  transformer_lm_baevski_wiki103)
momentum_transformer_lm_gpt = momentum_preset(MODEL, "momentum_transformer_lm_gpt", transformer_lm_gpt)
momentum_transformer_lm_gpt2_small = momentum_preset(MODEL, "momentum_transformer_lm_gpt2_small",
                                                     transformer_lm_gpt2_small)
linear_transformer_lm = momentum_preset(MODEL, "linear_transformer_lm", base_lm_architecture,
                                        momentum=0.0, step_size=1.0)

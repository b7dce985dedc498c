"""Encoder-decoder momentum transformer for `--task translation`
(Momentum Transformer, Section 3; docs/equations.md).

Encoder self-attention: non-causal momentum attention (eq. 14, padding-aware); decoder
self-attention: causal (eq. 13, recurrent eq. 12 in incremental decoding); decoder
cross-attention: `--cross-attention softmax | linear | momentum`. Every argument of
fairseq's `transformer` applies. `linear_transformer*` presets are the same code with
momentum 0, step size 1 and linear cross-attention (the paper's linear baseline).
"""
from fairseq.models.transformer import (
    TransformerConfig,
    TransformerDecoderBase,
    TransformerEncoderBase,
    TransformerModel,
)
from fairseq.models.transformer.transformer_legacy import base_architecture, transformer_iwslt_de_en

from ..configs import as_namespace
from ..modules.momentum_transformer_layer import MomentumDecoderMixin, MomentumEncoderMixin
from ..options import add_momentum_attention_args, momentum_attention_defaults
from ..registry import model, momentum_preset


class MomentumTransformerEncoder(MomentumEncoderMixin, TransformerEncoderBase):
    """fairseq's TransformerEncoderBase with momentum layers."""


class MomentumTransformerDecoder(MomentumDecoderMixin, TransformerDecoderBase):
    """fairseq's TransformerDecoderBase with momentum layers (incremental decoding included)."""


@model("momentum_transformer")
class MomentumTransformerModel(TransformerModel):
    @classmethod
    def hub_models(cls):
        return {}

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        add_momentum_attention_args(parser)

    @classmethod
    def build_model(cls, args, task):
        args = as_namespace(args)
        momentum_attention_defaults(args)
        return super().build_model(args, task)

    @classmethod
    def build_encoder(cls, cfg, src_dict, embed_tokens):
        return MomentumTransformerEncoder(TransformerConfig.from_namespace(cfg), src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, cfg, tgt_dict, embed_tokens):
        cfg = TransformerConfig.from_namespace(cfg)
        return MomentumTransformerDecoder(cfg, tgt_dict, embed_tokens,
                                          no_encoder_attn=cfg.no_cross_attention)


MODEL = "momentum_transformer"
LINEAR = dict(momentum=0.0, step_size=1.0, cross_attention="linear")
momentum_transformer = momentum_preset(MODEL, "momentum_transformer", base_architecture)
momentum_transformer_iwslt_de_en = momentum_preset(MODEL, "momentum_transformer_iwslt_de_en",
                                                   transformer_iwslt_de_en)
linear_transformer = momentum_preset(MODEL, "linear_transformer", base_architecture, **LINEAR)
linear_transformer_iwslt_de_en = momentum_preset(MODEL, "linear_transformer_iwslt_de_en",
                                                 transformer_iwslt_de_en, **LINEAR)

"""Bidirectional momentum encoder in RoBERTa's frame, for `--task masked_lm` (pretraining) and
`--task sentence_prediction` (fine-tuning with a classification head): every self-attention layer
is non-causal momentum attention (Momentum Transformer, eq. 14, padding-aware), or softmax where
`--layer-types` says full_attention, with the momentum connection (eq. 15, eq. 18) as its residual.

`--arch momentum_roberta` (and `_base`, `_large`, `_prenorm`) takes every argument of fairseq's
roberta (its LM head tied to the embedding, classification heads, checkpoint upgrades) plus the
momentum ones; `linear_roberta` is the same code with momentum 0 and step size 1 (eq. 7).
"""
from fairseq.models.roberta.model import (
    RobertaEncoder,
    RobertaModel,
    base_architecture,
    roberta_large_architecture,
    roberta_prenorm_architecture,
)
from fairseq.models.transformer import TransformerConfig
from fairseq.modules.transformer_sentence_encoder import init_bert_params
from fairseq.utils import safe_hasattr

from ..configs import as_namespace
from ..options import add_momentum_attention_args, momentum_attention_defaults
from ..registry import model, momentum_preset
from .momentum_transformer import MomentumTransformerEncoder


class MomentumRobertaEncoder(RobertaEncoder):
    """fairseq's RobertaEncoder whose sentence encoder has momentum layers."""

    def build_encoder(self, args, dictionary, embed_tokens):
        encoder = MomentumTransformerEncoder(TransformerConfig.from_namespace(args), dictionary, embed_tokens)
        encoder.apply(init_bert_params)
        return encoder


@model("momentum_roberta")
class MomentumRobertaModel(RobertaModel):
    @classmethod
    def hub_models(cls):
        return {}

    @staticmethod
    def add_args(parser):
        RobertaModel.add_args(parser)
        add_momentum_attention_args(parser, cross_attention=False)

    @classmethod
    def build_model(cls, args, task):
        """fairseq's roberta build (its defaults, max_positions from --tokens-per-sample), with
        momentum layers in the sentence encoder."""
        args = as_namespace(args)
        momentum_attention_defaults(args)
        base_architecture(args)
        if not safe_hasattr(args, "max_positions"):
            if not safe_hasattr(args, "tokens_per_sample"):
                args.tokens_per_sample = task.max_positions()
            args.max_positions = args.tokens_per_sample
        return cls(args, MomentumRobertaEncoder(args, task.source_dictionary))


MODEL = "momentum_roberta"
momentum_roberta = momentum_preset(MODEL, "momentum_roberta", base_architecture)
momentum_roberta_base = momentum_preset(MODEL, "momentum_roberta_base", base_architecture)
momentum_roberta_large = momentum_preset(MODEL, "momentum_roberta_large", roberta_large_architecture)
momentum_roberta_prenorm = momentum_preset(MODEL, "momentum_roberta_prenorm", roberta_prenorm_architecture)
linear_roberta = momentum_preset(MODEL, "linear_roberta", base_architecture, momentum=0.0, step_size=1.0)

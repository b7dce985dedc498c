"""Momentum variant of fairseq's iterative-refinement non-autoregressive transformer
(Lee et al. 2018; `--task translation_lev`), the setting of Momentum Transformer,
Section 4.4 / Table 5 (docs/equations.md, D10).

Every attention is replaced: encoder and decoder self-attention by non-causal momentum
attention (eq. 14; the decoder refines all positions at once, so nothing is causal), and
cross-attention per `--cross-attention`. Length prediction, refinement steps and the
denoising objective are fairseq's `iterative_nonautoregressive_transformer`.
"""
from fairseq.models.nat.fairseq_nat_model import FairseqNATEncoder
from fairseq.models.nat.iterative_nonautoregressive_transformer import (
    IterNATransformerModel,
    inat_base_architecture,
)
from fairseq.models.nat.nonautoregressive_transformer import NATransformerDecoder
from fairseq.modules.transformer_sentence_encoder import init_bert_params

from ..configs import as_namespace
from ..modules.momentum_transformer_layer import MomentumDecoderMixin, MomentumEncoderMixin
from ..options import add_momentum_attention_args, fill_unset, momentum_attention_defaults
from ..registry import model, momentum_preset


class MomentumNATEncoder(MomentumEncoderMixin, FairseqNATEncoder):
    """fairseq's NAT encoder with momentum layers."""


class MomentumNATDecoder(MomentumDecoderMixin, NATransformerDecoder):
    """fairseq's NAT decoder with non-causal momentum self-attention."""

    causal_self_attention = False


@model("momentum_iterative_nat")
class MomentumIterNATModel(IterNATransformerModel):
    @staticmethod
    def add_args(parser):
        IterNATransformerModel.add_args(parser)
        add_momentum_attention_args(parser)

    @classmethod
    def build_model(cls, args, task):
        args = as_namespace(args)
        momentum_attention_defaults(args, step_size=0.6)
        return super().build_model(args, task)

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        encoder = MomentumNATEncoder(args, src_dict, embed_tokens)
        if getattr(args, "apply_bert_init", False):
            encoder.apply(init_bert_params)
        return encoder

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        decoder = MomentumNATDecoder(args, tgt_dict, embed_tokens)
        if getattr(args, "apply_bert_init", False):
            decoder.apply(init_bert_params)
        return decoder


def _iwslt16_sizes(args):
    """The small model of Lee et al. (2018) used in Section 4.4: d_model 278, d_hidden 507,
    5 layers, 2 heads, dropout 0.1."""
    fill_unset(args, encoder_embed_dim=278, encoder_ffn_embed_dim=507, encoder_layers=5,
               encoder_attention_heads=2, decoder_embed_dim=278, decoder_ffn_embed_dim=507,
               decoder_layers=5, decoder_attention_heads=2, dropout=0.1)
    inat_base_architecture(args)


MODEL = "momentum_iterative_nat"
TABLE_1 = dict(momentum=0.6, step_size=0.6)
LINEAR = dict(momentum=0.0, step_size=1.0, cross_attention="linear")
momentum_iterative_nat = momentum_preset(MODEL, "momentum_iterative_nat", inat_base_architecture, **TABLE_1)
momentum_iterative_nat_iwslt16 = momentum_preset(MODEL, "momentum_iterative_nat_iwslt16", _iwslt16_sizes,
                                                 **TABLE_1)
linear_iterative_nat_iwslt16 = momentum_preset(MODEL, "linear_iterative_nat_iwslt16", _iwslt16_sizes,
                                               **LINEAR)

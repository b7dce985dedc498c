"""Configuration of the encoder-decoder momentum transformer (model_type "momentum_seq2seq")."""
from .configuration_momentum_transformer import MomentumTransformerConfig
from .validation import check_bool, check_choice, check_int

CROSS_ATTENTION_KINDS = ("momentum", "linear", "softmax")
# MomentumTransformerConfig fields the encoder does not take from this config: it is bidirectional,
# has its own depth and layer types, and no cache.
DECODER_ONLY_FIELDS = ("num_hidden_layers", "is_causal", "layer_types", "sliding_window", "use_cache")
ENCODER_LAYER_TYPES = ("linear_attention", "full_attention")


class MomentumSeq2SeqConfig(MomentumTransformerConfig):
    r"""Encoder-decoder momentum transformer (Momentum Transformer, Section 3: the translation setup;
    fairseq's `--arch momentum_transformer`).

    The encoder has `encoder_layers` (None: `num_hidden_layers`) bidirectional momentum layers
    (eq. 14), or per `encoder_layer_types` some bidirectional softmax ones ("full_attention"); the
    decoder has `num_hidden_layers` causal ones (eq. 13, recurrent eq. 12 when
    generating; `layer_types` makes some of them softmax, as in `MomentumTransformerConfig`), each
    with cross-attention to the encoder's output after its self-attention: `cross_attention`
    "momentum" (eq. 14 with the decoder's β, γ), "linear" (eq. 14 with β = 0, γ = 1) or "softmax".
    Every other field is `MomentumTransformerConfig`'s and applies to both stacks (one width,
    head count, feature map, connection, norm placement, dropouts and position table size).

    Vocabularies and embeddings: the source has `vocab_size` tokens, the target
    `decoder_vocab_size` (None: the same vocabulary). With `tie_word_embeddings` the LM head is the
    decoder's token embedding, and with `share_encoder_decoder_embeddings` (one vocabulary only)
    the encoder's is that matrix too: fairseq's --share-all-embeddings is both,
    --share-decoder-input-output-embed the first alone. Without `tie_word_embeddings` the three
    matrices are apart. `decoder_start_token_id`
    starts every generated target (fairseq starts with `</s>`); `is_causal` is the decoder's and
    must stay True.
    """

    model_type = "momentum_seq2seq"

    encoder_layers: int | None = None
    encoder_layer_types: list[str] | None = None
    decoder_vocab_size: int | None = None
    share_encoder_decoder_embeddings: bool = True
    cross_attention: str = "momentum"
    decoder_start_token_id: int | None = None
    is_encoder_decoder: bool = True

    def __post_init__(self, **kwargs):
        if self.encoder_layers is None and isinstance(self.num_hidden_layers, int):
            self.encoder_layers = self.num_hidden_layers
        if self.decoder_vocab_size is None:
            self.decoder_vocab_size = self.vocab_size
        super().__post_init__(**kwargs)

    def check_model_fields(self, block_class):
        block = super().check_model_fields(block_class)
        check_int(self.encoder_layers, "encoder_layers", low=1)
        check_choice(self.cross_attention, "cross_attention", CROSS_ATTENTION_KINDS)
        if self.is_causal is not True:
            raise ValueError("is_causal=False: is_causal is the decoder's, which generates left to right "
                             "(eq. 13); the encoder is bidirectional (eq. 14) already")
        if self.is_encoder_decoder is not True:
            raise ValueError("is_encoder_decoder must be True for a momentum_seq2seq config")
        kinds = self.encoder_kinds()
        if len(kinds) != self.encoder_layers or any(kind not in ENCODER_LAYER_TYPES for kind in kinds):
            raise ValueError(f"encoder_layer_types={self.encoder_layer_types!r} must hold one of "
                             f"{ENCODER_LAYER_TYPES} per encoder layer ({self.encoder_layers})")
        check_int(self.decoder_vocab_size, "decoder_vocab_size", low=1)
        check_bool(self.share_encoder_decoder_embeddings, "share_encoder_decoder_embeddings")
        if self.share_encoder_decoder_embeddings and self.decoder_vocab_size != self.vocab_size:
            raise ValueError(f"share_encoder_decoder_embeddings=True needs one vocabulary, but vocab_size is "
                             f"{self.vocab_size} and decoder_vocab_size {self.decoder_vocab_size}: set "
                             "share_encoder_decoder_embeddings=False")
        if self.decoder_start_token_id is not None:
            check_int(self.decoder_start_token_id, "decoder_start_token_id", low=0,
                      high=self.decoder_vocab_size - 1)
        return block

    def tied_embeddings(self) -> dict:
        """The weights that are one matrix (`_tied_weights_keys` under `prefix` "model."): the LM
        head and the decoder's embedding with `tie_word_embeddings`, the encoder's as well with
        `share_encoder_decoder_embeddings`."""
        if not self.share_encoder_decoder_embeddings:
            return {"lm_head.weight": "model.decoder.embed_tokens.weight"}
        return {"lm_head.weight": "model.encoder.embed_tokens.weight",
                "model.decoder.embed_tokens.weight": "model.encoder.embed_tokens.weight"}

    def encoder_kinds(self) -> list:
        """`encoder_layer_types`, or all "linear_attention" (momentum attention) when None."""
        if self.encoder_layer_types is None:
            return ["linear_attention"] * self.encoder_layers
        return list(self.encoder_layer_types)

    def encoder_config(self) -> MomentumTransformerConfig:
        """The encoder's config: this one's fields, bidirectional, `encoder_layers` deep with
        `encoder_layer_types`, without a cache."""
        fields = {name: getattr(self, name) for name in MomentumTransformerConfig.__annotations__
                  if name not in DECODER_ONLY_FIELDS}
        return MomentumTransformerConfig(**fields, num_hidden_layers=self.encoder_layers, is_causal=False,
                                         layer_types=self.encoder_kinds(), use_cache=False)

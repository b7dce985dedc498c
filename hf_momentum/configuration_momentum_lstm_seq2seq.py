"""Configuration of the attentional MomentumLSTM encoder-decoder (model_type "momentum_lstm_seq2seq")."""
from transformers import PreTrainedConfig

from .configuration_momentum_lstm import check_cell_fields
from .momentum_rnn_core import DEFAULT_CELL, DEFAULTS
from .validation import check_bool, check_bool_fields, check_int, check_positive, check_probability

DROPOUTS = ("encoder_dropout_in", "encoder_dropout_out", "decoder_dropout_in", "decoder_dropout_out")


class MomentumLSTMSeq2SeqConfig(PreTrainedConfig):
    r"""fairseq's attentional LSTM translation model (`--arch momentum_lstm`, Luong et al.'s global
    attention with input feeding) with MomentumLSTM cells (MomentumRNN, eq. 9, 15 and Section 2.4).

    Encoder: an embedding of `encoder_embedding_size`, then a MomentumLSTM stack of
    `num_hidden_layers` layers of `encoder_hidden_size` units (both directions with
    `encoder_bidirectional`, its outputs and final states then the two directions' side by side).
    Decoder: an embedding of `decoder_embedding_size`, then a stack of `num_hidden_layers` layers
    of `hidden_size` units whose first layer reads the token's embedding and the previous step's
    output (input feeding); its initial h and c are the encoder's final ones (through a linear map
    when the widths differ), its momentum and second moment start at zero. With `attention`, each
    step's last-layer output attends to the encoder's outputs (dot-product scores against a
    projection of it, then tanh of a projection of [context; output]). A projection to
    `decoder_output_size` (default `hidden_size`) follows when the widths differ, then the
    vocabulary projection `lm_head` (with a bias unless tied).

    `cell` and its hyperparameters (μ `momentum` ∈ [0, 1), s `step_size` > 0, `beta` ∈ [0, 1),
    `eps` > 0, `restart` ≥ 1 where the cell takes one) are both stacks', as fairseq's --lstm-*
    options are. Dropouts in [0, 1), in training: `encoder_dropout_in` on the source embeddings,
    `encoder_dropout_out` between the encoder's layers and on its outputs, `decoder_dropout_in` on
    the target embeddings, `decoder_dropout_out` between the decoder's layers, on each step's
    output and after the output projection. `initializer_range`: embeddings and linear maps start
    uniform in ±`initializer_range` (fairseq's LSTM model: 0.1), the LSTM stacks as Appendix F says.

    Vocabularies and embeddings as in `MomentumSeq2SeqConfig`: the source has `vocab_size` tokens,
    the target `decoder_vocab_size` (None: the same); `tie_word_embeddings` makes the LM head the
    decoder's embedding (needs `decoder_embedding_size` == `decoder_output_size`) and
    `share_encoder_decoder_embeddings` the encoder's too (one vocabulary and width: fairseq's
    --share-all-embeddings). `decoder_start_token_id` starts every target (fairseq: `</s>`).
    """

    model_type = "momentum_lstm_seq2seq"
    keys_to_ignore_at_inference = ["cache", "past_key_values"]

    vocab_size: int = 10000
    decoder_vocab_size: int | None = None
    encoder_embedding_size: int = 256
    encoder_hidden_size: int = 256
    encoder_bidirectional: bool = False
    decoder_embedding_size: int = 256
    hidden_size: int = 256
    decoder_output_size: int | None = None
    num_hidden_layers: int = 1
    attention: bool = True
    # the cell table's defaults (plugins.rnn.variants.DEFAULTS)
    cell: str = DEFAULT_CELL
    momentum: float = DEFAULTS.momentum
    step_size: float = DEFAULTS.step_size
    beta: float = DEFAULTS.beta
    eps: float = DEFAULTS.eps
    restart: int | None = DEFAULTS.restart
    encoder_dropout_in: float = 0.1
    encoder_dropout_out: float = 0.1
    decoder_dropout_in: float = 0.1
    decoder_dropout_out: float = 0.1
    initializer_range: float = 0.1
    use_cache: bool = True
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    decoder_start_token_id: int | None = None
    tie_word_embeddings: bool = False
    share_encoder_decoder_embeddings: bool = False
    is_encoder_decoder: bool = True

    def __post_init__(self, **kwargs):
        if self.decoder_vocab_size is None:
            self.decoder_vocab_size = self.vocab_size
        if self.decoder_output_size is None:
            self.decoder_output_size = self.hidden_size
        self.check_momentum_fields()
        super().__post_init__(**kwargs)

    def validate(self):
        """transformers' checks, then this family's (run by save_pretrained and by the models)."""
        super().validate()
        self.check_momentum_fields()

    @property
    def encoder_output_size(self) -> int:
        """The width of the encoder's outputs and final states (both directions side by side)."""
        return self.encoder_hidden_size * (2 if self.encoder_bidirectional else 1)

    def check_momentum_fields(self) -> None:
        """ValueError naming the first field out of its range (bools and non-finite numbers refused)."""
        for name in ("vocab_size", "decoder_vocab_size", "encoder_embedding_size", "encoder_hidden_size",
                     "decoder_embedding_size", "hidden_size", "decoder_output_size", "num_hidden_layers"):
            check_int(getattr(self, name), name, low=1)
        check_cell_fields(self)
        for name in DROPOUTS:
            check_probability(getattr(self, name), name)
        check_positive(self.initializer_range, "initializer_range")
        for name in ("encoder_bidirectional", "attention", "use_cache", "tie_word_embeddings",
                     "share_encoder_decoder_embeddings"):
            check_bool(getattr(self, name), name)
        check_bool_fields(self)
        check_bool(getattr(self, "output_attentions", False), "output_attentions")
        if self.is_encoder_decoder is not True:
            raise ValueError("is_encoder_decoder must be True for a momentum_lstm_seq2seq config")
        if self.tie_word_embeddings and self.decoder_embedding_size != self.decoder_output_size:
            raise ValueError("tie_word_embeddings needs decoder_embedding_size "
                             f"({self.decoder_embedding_size}) == decoder_output_size "
                             f"({self.decoder_output_size})")
        if self.share_encoder_decoder_embeddings:
            if not self.tie_word_embeddings:
                raise ValueError("share_encoder_decoder_embeddings=True makes the encoder's embedding the "
                                 "decoder's and the LM head's: it needs tie_word_embeddings=True")
            if (self.vocab_size, self.encoder_embedding_size) != \
                    (self.decoder_vocab_size, self.decoder_embedding_size):
                raise ValueError("share_encoder_decoder_embeddings=True needs one vocabulary and width, but "
                                 f"the source has {self.vocab_size} tokens of {self.encoder_embedding_size} "
                                 f"and the target {self.decoder_vocab_size} of {self.decoder_embedding_size}")
        if self.decoder_start_token_id is not None:
            check_int(self.decoder_start_token_id, "decoder_start_token_id", low=0,
                      high=self.decoder_vocab_size - 1)

    def tied_embeddings(self) -> dict:
        """The weights that are one matrix (`_tied_weights_keys` of the model with the LM head)."""
        if not self.tie_word_embeddings:
            return {}
        if not self.share_encoder_decoder_embeddings:
            return {"lm_head.weight": "model.decoder.embed_tokens.weight"}
        return {"lm_head.weight": "model.encoder.embed_tokens.weight",
                "model.decoder.embed_tokens.weight": "model.encoder.embed_tokens.weight"}

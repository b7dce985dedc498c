"""Configuration of the MomentumLSTM language model (model_type "momentum_lstm")."""
from transformers import PreTrainedConfig

from .momentum_rnn_core import DEFAULT_CELL, DEFAULTS, check_hyper, unread_hyperparameters
from .validation import check_bool, check_bool_fields, check_int, check_positive, check_probability


class MomentumLSTMConfig(PreTrainedConfig):
    r"""Embedding → `plugins.rnn.MomentumLSTM` stack → linear head (MomentumRNN).

    `cell`: "lstm" (plain) or a momentum cell of the table `plugins.rnn.variants` (docs/cells.md),
    read when the config is checked: μ = `momentum` ∈ [0, 1) and s = `step_size` > 0 (eq. 9),
    `beta` ∈ [0, 1) and `eps` > 0 (eq. 15), `restart` an integer ≥ 1 for the cells that take one
    (required by "sr", Section 2.4). Dropouts, in [0, 1): `dropout` between LSTM layers,
    `embedding_dropout` on the embeddings, `output_dropout` on the last layer's output (default
    `embedding_dropout`), `classifier_dropout` on the outputs a classification head reads. AWD-LSTM's
    regularisers (Merity et al.; MomentumRNN's PTB model, Appendix A.3): `locked_dropout` makes the
    first three draw one mask per sequence, shared by its steps; `weight_drop` is DropConnect on every
    hidden-to-hidden matrix; `word_dropout` drops whole words from the embedding matrix.
    `last_hidden_size` is the last layer's width (default `hidden_size`): AWD-LSTM
    (Merity et al.; MomentumRNN's PTB model) gives its last layer the embedding's width so that the
    embeddings can be tied. Tied embeddings need `embedding_size` == `last_hidden_size` (default:
    both equal `hidden_size`). `lm_head_bias`: the causal LM's output projection has a bias (fairseq's
    LSTM LMs have one). Every value is checked when the config is
    built and again when a model is built from it (`validate()`), so keyword overrides of
    `from_pretrained` are checked too.
    """

    model_type = "momentum_lstm"
    keys_to_ignore_at_inference = ["cache", "past_key_values"]

    vocab_size: int = 10000
    embedding_size: int | None = None
    hidden_size: int = 256
    num_hidden_layers: int = 2
    last_hidden_size: int | None = None
    lm_head_bias: bool = False
    # the cell table's defaults (plugins.rnn.variants.DEFAULTS)
    cell: str = DEFAULT_CELL
    momentum: float = DEFAULTS.momentum
    step_size: float = DEFAULTS.step_size
    beta: float = DEFAULTS.beta
    eps: float = DEFAULTS.eps
    restart: int | None = DEFAULTS.restart
    dropout: float = 0.0
    embedding_dropout: float = 0.0
    output_dropout: float | None = None
    classifier_dropout: float = 0.0
    locked_dropout: bool = False
    weight_drop: float = 0.0
    word_dropout: float = 0.0
    initializer_range: float = 0.02
    use_cache: bool = True
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    tie_word_embeddings: bool = True

    def __post_init__(self, **kwargs):
        if self.embedding_size is None:
            self.embedding_size = self.hidden_size
        if self.last_hidden_size is None:
            self.last_hidden_size = self.hidden_size
        if self.output_dropout is None:
            self.output_dropout = self.embedding_dropout
        self.check_momentum_fields()
        super().__post_init__(**kwargs)

    def validate(self):
        """transformers' checks, then this family's (run by save_pretrained and by the models)."""
        super().validate()
        self.check_momentum_fields()

    def check_momentum_fields(self) -> None:
        """ValueError naming the first field out of its range (bools and non-finite numbers refused)."""
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "embedding_size", "last_hidden_size"):
            check_int(getattr(self, name), name, low=1)
        if self.num_hidden_layers == 1 and self.last_hidden_size != self.hidden_size:
            raise ValueError(f"last_hidden_size ({self.last_hidden_size}) differs from hidden_size "
                             f"({self.hidden_size}) in a model of one layer: set hidden_size to its width")
        check_cell_fields(self)
        check_probability(self.dropout, "dropout")
        for name in ("embedding_dropout", "output_dropout", "classifier_dropout", "weight_drop",
                     "word_dropout"):
            check_probability(getattr(self, name), name)
        check_bool(self.locked_dropout, "locked_dropout")
        check_positive(self.initializer_range, "initializer_range")
        check_bool(self.use_cache, "use_cache")
        check_bool(self.tie_word_embeddings, "tie_word_embeddings")
        check_bool(self.lm_head_bias, "lm_head_bias")
        check_bool_fields(self)         # transformers' own bool fields too (return_dict, ...)
        check_bool(getattr(self, "output_attentions", False), "output_attentions")  # set after __post_init__
        if self.tie_word_embeddings and self.embedding_size != self.last_hidden_size:
            raise ValueError(f"tie_word_embeddings needs embedding_size ({self.embedding_size}) == "
                             f"last_hidden_size ({self.last_hidden_size}, the last layer's width)")

    def layer_sizes(self) -> list[int]:
        """Each LSTM layer's width, first to last."""
        return [self.hidden_size] * (self.num_hidden_layers - 1) + [self.last_hidden_size]


def check_cell_fields(config) -> None:
    """ValueError naming the first of the cell's fields (`cell`, `momentum`, `step_size`, `beta`,
    `eps`, `restart`) out of its range, or set off its default where the cell never reads it."""
    check_hyper(config.cell, "lstm", config.momentum, config.step_size, config.beta, config.eps,
                config.restart)
    for name in unread_hyperparameters(config.cell):
        default = getattr(type(config), name)
        if getattr(config, name) != default:
            raise ValueError(f"{name}={getattr(config, name)!r} is not read by cell={config.cell!r} and "
                             f"would be ignored; leave {name} at its default {default!r} or choose "
                             "a cell that uses it (docs/cells.md)")

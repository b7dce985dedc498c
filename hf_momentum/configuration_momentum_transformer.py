"""Configuration of the native momentum transformer family (model_type "momentum_transformer")."""
from transformers import PreTrainedConfig
from transformers.activations import ACT2FN

from .momentum_core import (
    CONNECTION_READS,
    DEFAULT_ATTENTION_MOMENTUM,
    DEFAULT_ATTENTION_STEP_SIZE,
    POOLINGS,
    BlockConfig,
    block_feature_maps,
    layer_configs,
    unread_connection_fields,
)
from .validation import (
    check_bool,
    check_bool_fields,
    check_choice,
    check_int,
    check_momentum,
    check_positive,
    check_probability,
)

# The names this config gives the block's fields, for the block's errors.
BLOCK_LABELS = {"d_model": "hidden_size", "heads": "num_attention_heads", "ffn_dim": "intermediate_size",
                "momentum": "attention_momentum", "step_size": "attention_step_size",
                "feature_map": "attention_feature_map", "causal": "is_causal", "norm": "layer_norm",
                "connection_delta": "adaptive_delta"}
# transformers' layer_types this family builds, and the core attention kind of each.
LAYER_KINDS = {"linear_attention": "momentum", "full_attention": "softmax", "sliding_attention": "softmax"}


class NamedBlockConfig(BlockConfig):
    """The block's hyperparameters, its errors naming the fields of this config."""

    labels = BLOCK_LABELS


def check_attention_hyperparameters(momentum, step_size, feature_map):
    """β ∈ [0, 1), γ > 0, φ a non-negative named feature map (Momentum Transformer, eq. 12–14).
    "identity" is not offered: q and k are raw linear projections, so φ(q)ᵀΣφ(k) can be negative or
    near zero and the normalisation divides by it (a probe found half of the denominators negative);
    the block's maps are non-negative, so every denominator is at least the kernel's eps > 0."""
    if feature_map == "identity":
        raise ValueError("attention_feature_map 'identity' is refused: the q, k projections of a "
                         "transformers model can be negative, which makes the attention's denominator "
                         "negative; use 'elu' (elu+1, the paper's) or 'relu'")
    return (check_momentum(momentum, "attention_momentum"),
            check_positive(step_size, "attention_step_size"),
            check_choice(feature_map, "attention_feature_map", block_feature_maps()))


class MomentumTransformerConfig(PreTrainedConfig):
    r"""Momentum transformer (Momentum Transformer, Section 3).

    Attention: causal momentum attention eq. 13 (recurrent form eq. 12 for generation) or, with
    `is_causal=False`, eq. 14; `attention_momentum` β ∈ [0, 1), `attention_step_size` γ > 0,
    `attention_feature_map` φ in {"elu" (elu+1, the paper's), "relu"}. β = 0, γ = 1 is the
    linear transformer.

    Residual around attention: `connection` "none" (x + A(x)), "momentum" (eq. 15 with
    `connection_momentum` μ_r ∈ [0, 1), `connection_step_size` γ_r > 0) or "adaptive" (eq. 15
    with μ_r from eq. 18 per token, clamped to [0, 1 − `adaptive_delta`], δ ∈ (0, 1]); defaults
    μ_r = 0.3, γ_r = 0.9 (Table 1), δ = 1e-3, shared with fairseq (`plugins.connection`).

    Hybrid models: `layer_types`, one per layer in transformers' vocabulary (default: all
    "linear_attention"): "linear_attention" is the momentum attention above, "full_attention"
    softmax attention (causal unless `is_causal=False`), "sliding_attention" causal softmax
    attention over the last `sliding_window` real tokens (which it requires, and only it reads).

    `layer_norm` "pre" or "post"; dropouts `embedding_dropout`, `attention_dropout` (on the
    attention block output), `hidden_dropout` (feed-forward), `activation_dropout` (inside the
    feed-forward, after `hidden_act`), `classifier_dropout` (on the final hidden states a
    classification head reads) in [0, 1); the sequence classifier pools by `classifier_pooling`
    "mean" (over real tokens, the LRA setup) or "first" (the first real token, BERT's [CLS] or
    RoBERTa's <s>; bidirectional models only), then, with `classifier_hidden_act` (e.g. "tanh"),
    a dense layer and that activation (BERT's pooler, RoBERTa's classification head) before the
    classifier; learned absolute positions up to
    `max_position_embeddings`; `scale_embedding` multiplies the token embeddings by
    √hidden_size (fairseq's default, and BART's flag); `embedding_layer_norm` normalises token plus
    position embeddings before the first layer (fairseq's --layernorm-embedding, on in RoBERTa).
    `sparse_prediction` (MomentumTransformerForMaskedLM, default False): when labels are given, the
    prediction head and the loss run on the labelled tokens only (labels != -100; about 15 % of the
    tokens under BERT's masking), as ModernBERT's option of that name does, and `logits` holds
    those tokens' rows only (num_labelled, vocab_size), in the batch's row-major token order. This
    costs one wait for the device per forward, to count the labelled tokens.
    `use_cache` applies to causal models only: an encoder (`is_causal=False`) runs without a cache
    unless one is asked for, which raises.

    Every value is checked when the config is built and again when a model is built from it
    (`validate()`), so keyword overrides of `from_pretrained` are checked too.
    """

    model_type = "momentum_transformer"
    keys_to_ignore_at_inference = ["cache", "past_key_values"]

    vocab_size: int = 32000
    hidden_size: int = 256
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    intermediate_size: int | None = None
    hidden_act: str = BlockConfig.activation
    attention_momentum: float = DEFAULT_ATTENTION_MOMENTUM
    attention_step_size: float = DEFAULT_ATTENTION_STEP_SIZE
    attention_feature_map: str = BlockConfig.feature_map
    connection: str = BlockConfig.connection
    connection_momentum: float = BlockConfig.connection_momentum
    connection_step_size: float = BlockConfig.connection_step_size
    adaptive_delta: float = BlockConfig.connection_delta
    max_position_embeddings: int = 2048
    embedding_dropout: float = 0.0
    attention_dropout: float = BlockConfig.attention_dropout
    hidden_dropout: float = 0.1
    activation_dropout: float = BlockConfig.activation_dropout
    classifier_dropout: float = 0.0
    classifier_pooling: str = "mean"
    classifier_hidden_act: str | None = None
    layer_norm: str = BlockConfig.norm
    layer_norm_eps: float = BlockConfig.layer_norm_eps
    is_causal: bool = BlockConfig.causal
    initializer_range: float = 0.02
    use_cache: bool = True
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    tie_word_embeddings: bool = True
    scale_embedding: bool = False
    embedding_layer_norm: bool = False
    layer_types: list[str] | None = None
    sliding_window: int | None = None
    sparse_prediction: bool = False

    def __post_init__(self, **kwargs):
        if self.intermediate_size is None:
            self.intermediate_size = 4 * self.hidden_size
        if self.layer_types is None and isinstance(self.num_hidden_layers, int):
            self.layer_types = ["linear_attention"] * self.num_hidden_layers
        self.check_momentum_fields()
        super().__post_init__(**kwargs)
        self.check_layer_types()

    def validate(self):
        """transformers' checks, then this family's (run by save_pretrained and by the models)."""
        super().validate()
        self.check_momentum_fields()

    def validated_block(self, block_class):
        """`validate()` for a model being built: the one `block_class` (a BlockConfig with
        `BLOCK_LABELS`) that checked the block's fields, for all the model's layers to share."""
        super().validate()
        return self.check_model_fields(block_class)

    def check_connection_fields(self) -> None:
        """A connection_* value that the chosen connection never reads (e.g. connection="none"
        with connection_momentum=0.5) would be silently ignored: refused unless at its default."""
        fields = {"momentum": "connection_momentum", "step_size": "connection_step_size",
                  "delta": "adaptive_delta"}
        for name in unread_connection_fields(self.connection):
            field, default = fields[name], getattr(type(self), fields[name])
            if getattr(self, field) != default:
                users = " or ".join(repr(kind) for kind, reads in CONNECTION_READS.items() if name in reads)
                raise ValueError(f"{field}={getattr(self, field)!r} is not read by connection="
                                 f"{self.connection!r} and would be ignored; leave {field} at its default "
                                 f"{default!r} or use connection={users}")

    def block_fields(self) -> dict:
        """The shared block's hyperparameters (`plugins.transformer.BlockConfig`'s fields) read from
        this config. A dict, not a BlockConfig: remote code may load this file and the modeling
        file's `momentum_core` as two modules, each with its own BlockConfig class."""
        return dict(
            d_model=self.hidden_size, heads=self.num_attention_heads, ffn_dim=self.intermediate_size,
            attention="momentum", momentum=self.attention_momentum, step_size=self.attention_step_size,
            feature_map=self.attention_feature_map, causal=self.is_causal, norm=self.layer_norm,
            layer_norm_eps=self.layer_norm_eps,
            activation=ACT2FN[check_choice(self.hidden_act, "hidden_act", ACT2FN)],
            attention_dropout=self.attention_dropout, hidden_dropout=self.hidden_dropout,
            activation_dropout=self.activation_dropout,
            connection=self.connection, connection_momentum=self.connection_momentum,
            connection_step_size=self.connection_step_size, connection_delta=self.adaptive_delta)

    def check_momentum_fields(self) -> None:
        """ValueError naming the first field out of its range (bools and non-finite numbers refused);
        the block's fields by `plugins.transformer.BlockConfig`'s checks."""
        self.check_model_fields(NamedBlockConfig)

    def check_layer_types(self) -> None:
        """`layer_types` by transformers' own validator (known names, one per layer), then: only the
        kinds this family builds, and `sliding_window` given exactly when a layer reads it."""
        self.validate_layer_type()
        layer_types = self.layer_kinds()
        unknown = sorted({kind for kind in layer_types if kind not in LAYER_KINDS})
        if unknown:
            raise ValueError(f"layer_types={layer_types!r}: momentum_transformer builds {list(LAYER_KINDS)} "
                             f"layers, not {unknown}")
        sliding = [i for i, kind in enumerate(layer_types) if kind == "sliding_attention"]
        if sliding and self.sliding_window is None:
            raise ValueError(f"layer_types has 'sliding_attention' at layers {sliding} but sliding_window is "
                             "None: set sliding_window (an int >= 1) or use 'full_attention'")
        if self.sliding_window is not None:
            check_int(self.sliding_window, "sliding_window", low=1)
            if not sliding:
                raise ValueError(f"sliding_window={self.sliding_window!r} is read by 'sliding_attention' "
                                 "layers only and layer_types has none: leave sliding_window None or add one")
            if not self.is_causal:
                raise ValueError("layer_types 'sliding_attention' needs is_causal=True (a causal window)")

    def layer_kinds(self) -> list:
        """`layer_types`, or all "linear_attention" where it was set to None after construction."""
        if self.layer_types is None:
            return ["linear_attention"] * self.num_hidden_layers
        return list(self.layer_types)

    def softmax_layers(self) -> list:
        """The indices of the softmax layers ("full_attention", "sliding_attention")."""
        return [i for i, kind in enumerate(self.layer_kinds()) if kind != "linear_attention"]

    def layer_blocks(self, block) -> tuple:
        """Each layer's block config from the model's one checked `block` (momentum attention):
        `plugins.transformer.layer_configs`, so each other kind is checked once and shared by its
        layers (`check_layer_types` has refused what it would refuse, naming this config's fields)."""
        kinds = self.layer_kinds()
        windows = [self.sliding_window if kind == "sliding_attention" else None for kind in kinds]
        return layer_configs(block, [LAYER_KINDS[kind] for kind in kinds], windows)

    def check_model_fields(self, block_class):
        """`check_momentum_fields` with the block's fields checked by building `block_class` (a
        BlockConfig with `BLOCK_LABELS`), which is returned: a model builds its one block spec
        here and shares it with all its layers."""
        for name in ("vocab_size", "num_hidden_layers", "max_position_embeddings"):
            check_int(getattr(self, name), name, low=1)
        self.check_layer_types()
        if self.attention_feature_map == "identity":
            check_attention_hyperparameters(self.attention_momentum, self.attention_step_size,
                                            self.attention_feature_map)
        block = block_class(**self.block_fields())
        self.check_connection_fields()
        check_probability(self.embedding_dropout, "embedding_dropout")
        check_probability(self.classifier_dropout, "classifier_dropout")
        check_choice(self.classifier_pooling, "classifier_pooling", POOLINGS)
        if self.classifier_pooling == "first" and self.is_causal is True:
            raise ValueError("classifier_pooling='first' needs is_causal=False: under causal attention the "
                             "first token sees only itself; use 'mean' or set is_causal=False")
        if self.classifier_hidden_act is not None:
            check_choice(self.classifier_hidden_act, "classifier_hidden_act", ACT2FN)
        check_positive(self.initializer_range, "initializer_range")
        check_bool(self.is_causal, "is_causal")
        check_bool(self.use_cache, "use_cache")
        check_bool(self.tie_word_embeddings, "tie_word_embeddings")
        check_bool(self.scale_embedding, "scale_embedding")
        check_bool(self.embedding_layer_norm, "embedding_layer_norm")
        check_bool(self.sparse_prediction, "sparse_prediction")
        check_bool_fields(self)         # transformers' own bool fields too (return_dict, ...)
        check_bool(getattr(self, "output_attentions", False), "output_attentions")  # set after __post_init__
        return block

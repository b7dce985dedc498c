"""Configuration of the native momentum transformer family (model_type "momentum_transformer")."""
from transformers import PreTrainedConfig

from .momentum_core import DEFAULT_ADAPTIVE_DELTA, DEFAULT_CONNECTION_MOMENTUM, DEFAULT_CONNECTION_STEP_SIZE

FEATURE_MAP_NAMES = ("elu", "identity", "relu")
CONNECTIONS = ("none", "momentum", "adaptive")
LAYER_NORMS = ("pre", "post")


def check_unit_interval(value, name: str, *, closed_right: bool = False) -> float:
    """`value` in [0, 1) (or [0, 1] with closed_right), else ValueError naming `name`."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = ok and (0.0 <= value <= 1.0 if closed_right else 0.0 <= value < 1.0)
    if not ok:
        raise ValueError(f"{name} must be a number in [0, {'1]' if closed_right else '1)'}, got {value!r}")
    return float(value)


def check_positive_number(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0.0:
        raise ValueError(f"{name} must be a number > 0, got {value!r}")
    return float(value)


def check_positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return value


def check_choice(value, name: str, choices) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")
    return value


def check_attention_hyperparameters(momentum, step_size, feature_map):
    """β ∈ [0, 1), γ > 0, φ a named feature map (eq. 12–14)."""
    return (check_unit_interval(momentum, "attention_momentum"),
            check_positive_number(step_size, "attention_step_size"),
            check_choice(feature_map, "attention_feature_map", FEATURE_MAP_NAMES))


class MomentumTransformerConfig(PreTrainedConfig):
    r"""Momentum transformer (momentum_transformer.md, Section 3).

    Attention: causal momentum attention eq. 13 (recurrent form eq. 12 for generation) or, with
    `is_causal=False`, eq. 14; `attention_momentum` β ∈ [0, 1), `attention_step_size` γ > 0,
    `attention_feature_map` φ in {"elu" (elu+1, the paper's), "relu", "identity"}. β = 0, γ = 1
    is the linear transformer.

    Residual around attention: `connection` "none" (x + A(x)), "momentum" (eq. 15 with
    `connection_momentum` μ_r ∈ [0, 1), `connection_step_size` γ_r > 0) or "adaptive" (eq. 15
    with μ_r from eq. 18 per token, clamped to [0, 1 − `adaptive_delta`], δ ∈ (0, 1]); defaults
    μ_r = 0.3, γ_r = 0.9 (Table 1), δ = 1e-3, shared with fairseq (`plugins.connection`).

    `layer_norm` "pre" or "post"; dropouts `embedding_dropout`, `attention_dropout` (on the
    attention block output), `hidden_dropout` (feed-forward) in [0, 1); learned absolute
    positions up to `max_position_embeddings`.
    """

    model_type = "momentum_transformer"
    keys_to_ignore_at_inference = ["past_key_values"]

    vocab_size: int = 32000
    hidden_size: int = 256
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    intermediate_size: int | None = None
    hidden_act: str = "gelu"
    attention_momentum: float = 0.6
    attention_step_size: float = 1.0
    attention_feature_map: str = "elu"
    connection: str = "none"
    connection_momentum: float = DEFAULT_CONNECTION_MOMENTUM
    connection_step_size: float = DEFAULT_CONNECTION_STEP_SIZE
    adaptive_delta: float = DEFAULT_ADAPTIVE_DELTA
    max_position_embeddings: int = 2048
    embedding_dropout: float = 0.0
    attention_dropout: float = 0.0
    hidden_dropout: float = 0.1
    layer_norm: str = "pre"
    layer_norm_eps: float = 1e-5
    is_causal: bool = True
    initializer_range: float = 0.02
    use_cache: bool = True
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    tie_word_embeddings: bool = True

    def __post_init__(self, **kwargs):
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "max_position_embeddings"):
            check_positive_int(getattr(self, name), name)
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be divisible by "
                             f"num_attention_heads ({self.num_attention_heads})")
        if self.intermediate_size is None:
            self.intermediate_size = 4 * self.hidden_size
        check_positive_int(self.intermediate_size, "intermediate_size")
        check_attention_hyperparameters(self.attention_momentum, self.attention_step_size,
                                        self.attention_feature_map)
        check_choice(self.connection, "connection", CONNECTIONS)
        check_unit_interval(self.connection_momentum, "connection_momentum")
        check_positive_number(self.connection_step_size, "connection_step_size")
        if check_positive_number(self.adaptive_delta, "adaptive_delta") > 1.0:
            raise ValueError(f"adaptive_delta must be a number in (0, 1], got {self.adaptive_delta!r}")
        for name in ("embedding_dropout", "attention_dropout", "hidden_dropout"):
            check_unit_interval(getattr(self, name), name)
        check_choice(self.layer_norm, "layer_norm", LAYER_NORMS)
        check_positive_number(self.layer_norm_eps, "layer_norm_eps")
        check_positive_number(self.initializer_range, "initializer_range")
        if not isinstance(self.is_causal, bool):
            raise ValueError(f"is_causal must be True or False, got {self.is_causal!r}")
        super().__post_init__(**kwargs)

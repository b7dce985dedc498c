"""The hyperparameters of one transformer block (`plugins.transformer.block`), their defaults
and their checks, written once for the HF model and the copy recipe."""
from dataclasses import dataclass, replace
from typing import Callable, ClassVar, Mapping, Optional, Sequence, Tuple, Union

from ..attention.feature_maps import FEATURE_MAPS
from ..attention.spec import AttentionSpec
from ..connection import (
    CONNECTIONS,
    DEFAULT_ADAPTIVE_DELTA,
    DEFAULT_CONNECTION_MOMENTUM,
    DEFAULT_CONNECTION_STEP_SIZE,
    check_delta,
)
from ..validation import (
    check_bool,
    check_choice,
    check_int,
    check_momentum,
    check_positive,
    check_probability,
)

ATTENTION_KINDS = ("softmax", "linear", "momentum")
NORM_PLACEMENTS = ("pre", "post")
ACTIVATION_NAMES = ("relu", "gelu")
# transformers' layer_types the recipes build: "linear_attention" keeps the model's own attention
# (linear or momentum, or softmax for a softmax model), "full_attention" is softmax attention.
LAYER_TYPES = ("linear_attention", "full_attention")
# β and γ of Momentum Transformer, eq. 12/13 when attention="momentum" and they are not given.
DEFAULT_ATTENTION_MOMENTUM = 0.6
DEFAULT_ATTENTION_STEP_SIZE = 1.0


def block_feature_maps() -> Tuple[str, ...]:
    """The feature maps a block's q, k projections may use: every name in
    `plugins.attention.FEATURE_MAPS` (read at each call, so a map added there is offered by the
    HF config and fairseq's --feature-map too) except "identity", which is for inputs already
    mapped."""
    return tuple(name for name in FEATURE_MAPS if name != "identity")


@dataclass(frozen=True)
class BlockConfig:
    """One block: `heads`-head attention over `d_model` features, then a feed-forward network
    of width `ffn_dim` (None: 4 · d_model).

    attention: "softmax" (scaled dot product), "linear" (eq. 7) or "momentum" (eq. 13, eq. 14
    with causal=False); momentum β ∈ [0, 1) and step_size γ > 0 are read by "momentum" only (None:
    0.6 and 1.0). feature_map φ ∈ {"elu", "relu"} for "linear" and "momentum". sliding_window
    (causal softmax only; None: no window): each position reads itself and the W − 1 real
    positions before it.
    norm: "pre" or "post" layer norm; activation: "relu", "gelu" or a callable.
    connection: the residual around attention, "none", "momentum" (eq. 15) or "adaptive"
    (eq. 18), with `plugins.connection.build_connection`'s defaults and checks.

    Errors name the fields as `labels` maps them: a subclass for a configuration that calls
    them otherwise (the HF config's hidden_size for d_model, ...) sets it."""

    labels: ClassVar[Mapping[str, str]] = {}

    d_model: int
    heads: int
    ffn_dim: Optional[int] = None
    attention: str = "momentum"
    momentum: Optional[float] = None
    step_size: Optional[float] = None
    feature_map: str = "elu"
    causal: bool = True
    chunk_size: int = 64
    norm: str = "pre"
    layer_norm_eps: float = 1e-5
    activation: Union[str, Callable] = "gelu"
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    hidden_dropout: float = 0.0
    connection: str = "none"
    connection_momentum: float = DEFAULT_CONNECTION_MOMENTUM
    connection_step_size: float = DEFAULT_CONNECTION_STEP_SIZE
    connection_delta: float = DEFAULT_ADAPTIVE_DELTA
    sliding_window: Optional[int] = None

    def __post_init__(self):
        name = lambda field: self.labels.get(field, field)
        check_int(self.d_model, name("d_model"), low=1)
        check_int(self.heads, name("heads"), low=1)
        if self.d_model % self.heads:
            raise ValueError(f"{name('d_model')} ({self.d_model}) must be divisible by {name('heads')} "
                             f"({self.heads})")
        if self.ffn_dim is None:
            object.__setattr__(self, "ffn_dim", 4 * self.d_model)
        check_int(self.ffn_dim, name("ffn_dim"), low=1)
        check_choice(self.attention, name("attention"), ATTENTION_KINDS)
        self._resolve_attention_coefficients(name)
        check_choice(self.feature_map, name("feature_map"), block_feature_maps())
        check_bool(self.causal, name("causal"))
        check_int(self.chunk_size, name("chunk_size"), low=1)
        self._check_sliding_window(name)
        check_choice(self.norm, name("norm"), NORM_PLACEMENTS)
        check_positive(self.layer_norm_eps, name("layer_norm_eps"))
        if not callable(self.activation):
            check_choice(self.activation, name("activation"), ACTIVATION_NAMES)
        for field in ("attention_dropout", "activation_dropout", "hidden_dropout"):
            check_probability(getattr(self, field), name(field))
        # build_connection's checks, with this configuration's names
        check_choice(self.connection, name("connection"), CONNECTIONS)
        check_momentum(self.connection_momentum, name("connection_momentum"))
        check_positive(self.connection_step_size, name("connection_step_size"))
        check_delta(self.connection_delta, name("connection_delta"))
        object.__setattr__(self, "attention_spec", self._attention_spec())

    def _attention_spec(self) -> Optional[AttentionSpec]:
        """The one AttentionSpec of every momentum / linear attention call of this block (None for
        softmax): β and γ of eq. 12-14, β = 0 and γ = 1 for "linear" (eq. 7)."""
        if self.attention == "softmax":
            return None
        momentum, step_size = (self.momentum, self.step_size) if self.attention == "momentum" else (0.0, 1.0)
        return AttentionSpec(momentum, step_size, causal=self.causal, feature_map=self.feature_map,
                             chunk_size=self.chunk_size)

    def _resolve_attention_coefficients(self, name) -> None:
        """β, γ of eq. 13: defaults for "momentum"; refused for the kinds that never read them."""
        if self.attention != "momentum":
            for field in ("momentum", "step_size"):
                if getattr(self, field) is not None:
                    raise ValueError(f"{name(field)}={getattr(self, field)!r} is not read by "
                                     f"{name('attention')}={self.attention!r}: leave it None or use "
                                     f"{name('attention')}='momentum'")
            return
        momentum = DEFAULT_ATTENTION_MOMENTUM if self.momentum is None else self.momentum
        step_size = DEFAULT_ATTENTION_STEP_SIZE if self.step_size is None else self.step_size
        object.__setattr__(self, "momentum", check_momentum(momentum, name("momentum")))
        object.__setattr__(self, "step_size", check_positive(step_size, name("step_size")))

    def _check_sliding_window(self, name) -> None:
        """A window is read by causal softmax attention only; elsewhere it would be ignored."""
        if self.sliding_window is None:
            return
        check_int(self.sliding_window, name("sliding_window"), low=1)
        if self.attention != "softmax" or not self.causal:
            raise ValueError(f"{name('sliding_window')}={self.sliding_window!r} is read by causal softmax "
                             f"attention only, not by {name('attention')}={self.attention!r} with "
                             f"{name('causal')}={self.causal!r}: leave it None")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads


def layer_configs(base: BlockConfig, kinds: Sequence[str],
                  sliding_windows: Optional[Sequence[Optional[int]]] = None) -> Tuple[BlockConfig, ...]:
    """One BlockConfig per layer of a stack whose layers differ in attention only: layer i has
    attention kinds[i] (ATTENTION_KINDS) and sliding_windows[i] (None: no window), every other field
    base's. A layer like base is base itself; each other distinct (kind, window) is one config,
    checked once and shared by its layers. β, γ of a derived "momentum" layer are base's when base
    is momentum attention, else the defaults."""
    if isinstance(kinds, str) or not isinstance(kinds, Sequence) or not kinds:
        raise ValueError(f"the layers' attention kinds must be a non-empty list of {ATTENTION_KINDS}, "
                         f"got {kinds!r}")
    windows = [None] * len(kinds) if sliding_windows is None else list(sliding_windows)
    if len(windows) != len(kinds):
        raise ValueError(f"sliding_windows has {len(windows)} entries for {len(kinds)} layers")
    for i, kind in enumerate(kinds):
        check_choice(kind, f"attention of layer {i}", ATTENTION_KINDS)
    built = {(base.attention, base.sliding_window): base}
    for kind, window in zip(kinds, windows):
        if (kind, window) not in built:
            coefficients = dict(momentum=None, step_size=None)
            if kind == "momentum" and base.attention == "momentum":
                coefficients = dict(momentum=base.momentum, step_size=base.step_size)
            built[kind, window] = replace(base, attention=kind, sliding_window=window, **coefficients)
    return tuple(built[kind, window] for kind, window in zip(kinds, windows))


def kinds_from_layer_types(layer_types: Sequence[str], linear_kind: str, layers: Optional[int] = None,
                           name: str = "layer_types") -> Tuple[str, ...]:
    """The core attention kind (ATTENTION_KINDS) of each layer named in transformers' vocabulary
    (LAYER_TYPES), for `layer_configs`: "linear_attention" is `linear_kind`, the model's own
    attention, "full_attention" softmax. `layers`: the stack's depth, which the list must match.
    Errors name the list as `name` (a recipe's "--layer-types")."""
    check_choice(linear_kind, "linear_kind", ATTENTION_KINDS)
    allowed = ", ".join(LAYER_TYPES)
    if isinstance(layer_types, str) or not isinstance(layer_types, Sequence) or not layer_types:
        raise ValueError(f"{name} must be a non-empty list of {allowed}, got {layer_types!r}")
    unknown = [kind for kind in layer_types if kind not in LAYER_TYPES]
    if unknown:
        raise ValueError(f"{name}: each entry must be one of {allowed}, got {', '.join(map(repr, unknown))}")
    if layers is not None and len(layer_types) != layers:
        raise ValueError(f"{name} has {len(layer_types)} entries but the model has {layers} layers; give "
                         f"one of {allowed} per layer")
    return tuple(linear_kind if kind == "linear_attention" else "softmax" for kind in layer_types)


def stack_configs(base: BlockConfig, layers: int,
                  layer_types: Optional[Sequence[str]] = None) -> Tuple[BlockConfig, ...]:
    """One block config per layer of a stack of `layers`: base everywhere (layer_types None), else
    base's attention in the "linear_attention" layers and softmax in the "full_attention" ones
    (`kinds_from_layer_types`, `layer_configs`)."""
    if layer_types is None:
        return (base,) * layers
    return layer_configs(base, kinds_from_layer_types(layer_types, base.attention, layers))

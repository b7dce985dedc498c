"""The hyperparameters of one momentum / linear attention call (Momentum Transformer, Section 3.1),
validated once when built and trusted by `attend` and everything it calls."""
from dataclasses import dataclass
from typing import Callable

import torch

from ..validation import check_bool, check_momentum, check_positive
from .checks import check_backend, check_chunk_size
from .feature_maps import FeatureMap, resolve_feature_map
from .rule import MomentumRule, build_rule, check_rule


@dataclass(frozen=True)
class AttentionSpec:
    """momentum β ∈ [0, 1) and step_size γ > 0 (β = 0, γ = 1 is linear attention, eq. 7); causal:
    eq. 13 (≡ eq. 12), else eq. 14; feature_map: "elu", "relu", "identity" or a callable; eps > 0
    guards the denominators; chunk_size ≥ 1; backend "auto", "torch" or "triton"; rule: a name in
    `rule.RULES` ("momentum", eq. 12, unless one is registered), built once here (`momentum_rule`)."""

    momentum: float
    step_size: float = 1.0
    causal: bool = True
    feature_map: FeatureMap = "elu"
    eps: float = 1e-6
    chunk_size: int = 64
    backend: str = "auto"
    rule: str = "momentum"

    def __post_init__(self):
        set_ = object.__setattr__
        set_(self, "momentum", check_momentum(self.momentum))
        set_(self, "step_size", check_positive(self.step_size, "step_size"))
        set_(self, "causal", check_bool(self.causal, "causal"))
        set_(self, "_phi", resolve_feature_map(self.feature_map))     # read per layer and token
        set_(self, "eps", check_positive(self.eps, "eps"))
        set_(self, "chunk_size", check_chunk_size(self.chunk_size))
        set_(self, "backend", check_backend(self.backend))
        set_(self, "_rule", build_rule(check_rule(self.rule), self.momentum, self.step_size))

    @property
    def momentum_rule(self) -> MomentumRule:
        """The update rule every kernel reads (`plugins.attention.rule`)."""
        return self._rule

    @property
    def phi(self) -> Callable[[torch.Tensor], torch.Tensor]:
        return self._phi

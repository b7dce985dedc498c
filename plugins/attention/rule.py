"""The update rule of causal momentum attention as one object, read by every kernel: the chunked
and packed forms (intra-chunk weights, carry, decay), eq. 12's closed form (returned states,
context parallelism), the decoding step, eq. 14's weights and the Triton kernels' coefficients.

The rules are those with a state s and an auxiliary state m' (= −m, the momentum of eq. 12) of the
form
    m'_i = r·m'_{i−1} + φ(k_i)v_iᵀ,    s_i = s_{i−1} + p·m'_{i−1} + q·φ(k_i)v_iᵀ,
with decay r ∈ [0, 1). Momentum attention (Momentum Transformer, eq. 12: s_i = s_{i−1} + γm'_i) is
r = β, p = γβ, q = γ; plain linear attention (eq. 7) is β = 0. With G(n) = Σ_{t<n} r^t, token j's
φ(k_j)v_jᵀ weighs r^n on m' and q + p·G(n) on s after n further tokens (eq. 13's weight
γ(1 − β^(n+1))/(1 − β) for momentum), and a state m'₀ entering a run of L tokens weighs r^L on m'
and p·G(L) on s. Coefficients are float64 sums of non-negative terms: nothing is obtained by
subtracting two large momentum-weighted quantities.

A new rule is a factory (momentum, step_size) → MomentumRule registered with `register_rule`;
`AttentionSpec(rule=name)` and `momentum_attention(rule=name)` then run it on every path. The
Triton kernels compute eq. 12's coefficients from (β, γ) themselves, so they run the rules with
p = q·r (`MomentumRule.is_momentum`); other rules run on the PyTorch kernels."""
import math
from dataclasses import dataclass
from typing import Callable, Dict

import torch

from ..validation import is_finite


@dataclass(frozen=True)
class MomentumRule:
    """decay r ∈ [0, 1), carry p ≥ 0, direct q > 0 of the rule in the module's docstring."""

    decay: float
    carry: float
    direct: float

    def __post_init__(self):
        for name, low in (("decay", 0.0), ("carry", 0.0), ("direct", 0.0)):
            value = getattr(self, name)
            if not isinstance(value, float) or not is_finite(value) or value < low:
                raise ValueError(f"MomentumRule.{name} must be a finite float ≥ {low}, got {value!r}")
        if self.decay >= 1.0:
            raise ValueError(f"MomentumRule.decay must be in [0, 1), got {self.decay}")
        if self.direct == 0.0:
            raise ValueError("MomentumRule.direct must be > 0 (a token must reach s), got 0.0")

    @property
    def carries_momentum(self) -> bool:
        """Whether m' ever reaches s (p > 0); linear attention (β = 0) carries s alone."""
        return self.carry > 0.0

    @property
    def is_momentum(self) -> bool:
        """Whether this is eq. 12 with β = r, γ = q (p = q·r), which the Triton kernels compute."""
        return self.carry == self.direct * self.decay

    def geometric(self, n: torch.Tensor) -> torch.Tensor:
        """G(n) = (1 − r^n)/(1 − r) = Σ_{t<n} r^t, float64, for integer n ≥ 0 (r = 0: 1 for n ≥ 1)."""
        n = n.to(torch.float64)
        if self.decay == 0.0:
            return (n > 0).to(torch.float64)
        return -torch.expm1(n * math.log(self.decay)) / (1.0 - self.decay)

    def power(self, n: torch.Tensor) -> torch.Tensor:
        """r^n, float64 (0^0 = 1); r goes to the kernel as a scalar, not as a tensor built on the
        host (on a GPU, a copy that waits for the device's queue, once per layer)."""
        return torch.pow(self.decay, n.to(torch.float64))

    def input_on_m(self, n: torch.Tensor) -> torch.Tensor:
        """Weight of token j's φ(k_j)v_jᵀ on m' after n ≥ 0 further tokens: r^n."""
        return self.power(n)

    def input_on_s(self, n: torch.Tensor) -> torch.Tensor:
        """Weight of token j's φ(k_j)v_jᵀ on s after n ≥ 0 further tokens: q + p·G(n)
        (Momentum Transformer, eq. 13: γ(1 − β^(n+1))/(1 − β))."""
        return self.direct + self.carry * self.geometric(n)

    def m_on_m(self, n: torch.Tensor) -> torch.Tensor:
        """Weight of the m' entering a run of n tokens on m' at its end: r^n."""
        return self.power(n)

    def m_on_s(self, n: torch.Tensor) -> torch.Tensor:
        """Weight of the m' entering a run of n tokens on s at its end: p·G(n)."""
        return self.carry * self.geometric(n)


def momentum_rule(momentum: float, step_size: float) -> MomentumRule:
    """Momentum Transformer, eq. 12: m'_i = βm'_{i−1} + φ(k_i)v_iᵀ, s_i = s_{i−1} + γm'_i."""
    return MomentumRule(decay=float(momentum), carry=float(step_size * momentum), direct=float(step_size))


RuleFactory = Callable[[float, float], MomentumRule]
RULES: Dict[str, RuleFactory] = {"momentum": momentum_rule}


def register_rule(name: str, factory: RuleFactory) -> None:
    """Make `factory(momentum, step_size)` available as rule=name (the momentum rule stays)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"rule name must be a non-empty string, got {name!r}")
    if name == "momentum":
        raise ValueError("rule 'momentum' (eq. 12) cannot be replaced")
    if not callable(factory):
        raise ValueError(f"rule {name!r}: factory must be callable (momentum, step_size) -> MomentumRule")
    RULES[name] = factory


def check_rule(name: str) -> str:
    if name not in RULES:
        raise ValueError(f"rule must be one of {sorted(RULES)} (register_rule adds one), got {name!r}")
    return name


def build_rule(name: str, momentum: float, step_size: float) -> MomentumRule:
    """The rule `name` for already validated momentum and step_size."""
    rule = RULES[check_rule(name)](momentum, step_size)
    if not isinstance(rule, MomentumRule):
        raise ValueError(f"rule {name!r} must build a MomentumRule, got {type(rule).__name__}")
    return rule

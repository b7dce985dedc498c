"""Momentum connection (Momentum Transformer, eq. 15, Section 3.2) and adaptive momentum (eq. 18).

Parameterisation (the authors' code, which the paper's Table 1 names by both constants): a
velocity v is carried from layer to layer, starting at v_0 = 0,

    v_ℓ = μ_r v_{ℓ−1} − A_ℓ(x_ℓ),        x_{ℓ+1} = x_ℓ − γ_r v_ℓ = x_ℓ + γ_r A_ℓ − γ_r μ_r v_{ℓ−1},

with A_ℓ the attention block's output. μ_r = 0, γ_r = 1 is the plain residual x + A(x).

Where it sits in a block (only the attention residual changes; the feed-forward residual stays):
- pre-LN:  A_ℓ = Attn(LN(x_ℓ)); h = x_ℓ − γ_r v_ℓ; x_{ℓ+1} = h + FFN(LN(h)).
- post-LN: A_ℓ = Attn(x_ℓ);     h = LN(x_ℓ − γ_r v_ℓ); x_{ℓ+1} = LN(h + FFN(h)).

`build_connection` is the one constructor both integrations (fairseq's `--connection*`
arguments, the HF config's `connection*` fields) call, with the defaults below.
"""
from typing import NamedTuple, Optional, Tuple

import torch
from torch import nn

from .exported_eps import plus_eps
from .validation import check_choice, check_momentum, check_number, check_positive

CONNECTIONS = ("none", "momentum", "adaptive")

# Defaults from the Momentum Transformer paper, Table 1, rows "Non-Autoregressive Machine
# Translation" (the one language task with a momentum connection): "Momentum in Momentum
# Connection" μ_r = 0.3 and "Stepsize in Momentum Connection" γ_r = 0.9 (the adaptive row uses
# the same γ_r). δ = 10^-3 is Section 3.2.1's threshold of eq. 17-18.
DEFAULT_CONNECTION_MOMENTUM = 0.3
DEFAULT_CONNECTION_STEP_SIZE = 0.9
DEFAULT_ADAPTIVE_DELTA = 1e-3


class ConnectionState(NamedTuple):
    """Carried across layers: the velocity v_{ℓ−1} and the previous block output A_{ℓ−1}
    (adaptive momentum needs it). Start each forward pass with `None`."""

    velocity: torch.Tensor
    update: torch.Tensor


def momentum_connection(x: torch.Tensor, update: torch.Tensor, velocity: Optional[torch.Tensor], *,
                        momentum, step_size: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """Eq. 15 (authors' form): v = μ_r v_prev − A;  x_next = x − γ_r v.  velocity=None means v_0 = 0.
    `momentum` is a float or a tensor broadcastable to x (per-token adaptive momentum).
    Returns (x_next, v)."""
    v = -update if velocity is None else momentum * velocity - update
    return x - step_size * v, v


def adaptive_momentum(update: torch.Tensor, previous_update: torch.Tensor, *, delta: float = 1e-3,
                      eps: float = 1e-6) -> torch.Tensor:
    """Eq. 18 per token: μ = clamp((1 − sqrt(‖A_ℓ − A_{ℓ−1}‖ / (‖A_{ℓ−1}‖ + eps)))², 0, 1 − δ),
    norms over the last (model) dimension, so each position's momentum depends on that
    position only (causal, and padding cannot reach real tokens). Returns shape (..., 1).

    The eps guard keeps a zero update finite (the authors' code divides by ‖A_{ℓ−1}‖ unguarded).
    μ is an estimate of the optimal heavy-ball constant (Theorem 2), not a model output, so it
    is treated as a constant in back-propagation; this also avoids sqrt's infinite derivative
    at 0 when two consecutive layers give the same update."""
    with torch.no_grad():
        change = torch.linalg.vector_norm(update - previous_update, dim=-1, keepdim=True)
        scale = plus_eps(torch.linalg.vector_norm(previous_update, dim=-1, keepdim=True), eps)
        return ((1.0 - torch.sqrt(change / scale)) ** 2).clamp(0.0, 1.0 - delta)


class MomentumConnection(nn.Module):
    """Eq. 15 with constant μ_r ∈ [0, 1) and γ_r > 0 (see the module docstring for placement)."""

    def __init__(self, momentum: float = DEFAULT_CONNECTION_MOMENTUM,
                 step_size: float = DEFAULT_CONNECTION_STEP_SIZE):
        super().__init__()
        self.momentum = check_momentum(momentum, "momentum")
        self.step_size = check_positive(step_size, "step_size")

    def forward(self, x: torch.Tensor, update: torch.Tensor,
                state: Optional[ConnectionState] = None) -> Tuple[torch.Tensor, ConnectionState]:
        check_connection_inputs(x, update, state)
        velocity = None if state is None else state.velocity
        x_next, v = momentum_connection(x, update, velocity, momentum=self.momentum,
                                        step_size=self.step_size)
        return x_next, ConnectionState(v, update)

    def extra_repr(self) -> str:
        return f"momentum={self.momentum}, step_size={self.step_size}"


class AdaptiveMomentumConnection(nn.Module):
    """Eq. 15 with μ_r from eq. 18, recomputed per token at every layer.

    First layer: there is no A_{ℓ−1}, and v_0 = 0, so μ_r multiplies nothing; we set μ_r = 0
    there explicitly (state=None) instead of testing the inputs for all-zeros as the authors'
    code does — an all-zero update in a later layer then still gets eq. 18."""

    def __init__(self, step_size: float = DEFAULT_CONNECTION_STEP_SIZE,
                 delta: float = DEFAULT_ADAPTIVE_DELTA, eps: float = 1e-6):
        super().__init__()
        self.step_size = check_positive(step_size, "step_size")
        self.delta = check_delta(delta, "delta")
        self.eps = check_positive(eps, "eps")

    def forward(self, x: torch.Tensor, update: torch.Tensor,
                state: Optional[ConnectionState] = None) -> Tuple[torch.Tensor, ConnectionState]:
        check_connection_inputs(x, update, state)
        if state is None:
            x_next, v = momentum_connection(x, update, None, momentum=0.0, step_size=self.step_size)
        else:
            mu = adaptive_momentum(update, state.update, delta=self.delta, eps=self.eps)
            x_next, v = momentum_connection(x, update, state.velocity, momentum=mu,
                                            step_size=self.step_size)
        return x_next, ConnectionState(v, update)

    def extra_repr(self) -> str:
        return f"step_size={self.step_size}, delta={self.delta}"


def check_connection_inputs(x, update, state: Optional[ConnectionState]) -> None:
    """x, the block output A_ℓ and the carried velocity and A_{ℓ−1} all have one shape: a state
    from another batch or length would broadcast into a wrong result, not fail."""
    for name, value in (("x", x), ("update", update)):
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if update.shape != x.shape:
        raise ValueError(f"update must have the shape of x {tuple(x.shape)}, got {tuple(update.shape)}")
    if state is None:
        return
    if not isinstance(state, ConnectionState):
        raise ValueError(f"state must be a ConnectionState or None, got {type(state).__name__}; pass "
                         "the state the previous layer returned, or build "
                         "ConnectionState(velocity=..., update=...)")
    for name in ConnectionState._fields:
        value = getattr(state, name)
        if not isinstance(value, torch.Tensor) or value.shape != x.shape:
            got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise ValueError(f"state.{name} must have the shape of x {tuple(x.shape)} (same batch and "
                             f"length), got {got}")


def check_delta(value, name: str = "delta") -> float:
    """The threshold δ of eq. 17-18: adaptive momentum is clamped to [0, 1 − δ], δ ∈ (0, 1]."""
    return check_number(value, name, low=0.0, high=1.0, low_open=True)


# What each kind of connection reads (eq. 15 with constant μ_r; eq. 15 with eq. 18's μ_r).
CONNECTION_READS = {"none": (), "momentum": ("momentum", "step_size"), "adaptive": ("step_size", "delta")}


def unread_connection_fields(kind: str):
    """The hyperparameters ("momentum", "step_size", "delta") a connection of `kind` never reads:
    a value given for one of them would be silently ignored."""
    kind = check_choice(kind, "connection", CONNECTIONS)
    return tuple(name for name in ("momentum", "step_size", "delta") if name not in CONNECTION_READS[kind])


def build_connection(kind: str, *, momentum=DEFAULT_CONNECTION_MOMENTUM,
                     step_size=DEFAULT_CONNECTION_STEP_SIZE, delta=DEFAULT_ADAPTIVE_DELTA):
    """The residual around attention: None for "none" (the plain x + A(x)), MomentumConnection
    (eq. 15, constant μ_r = `momentum`, γ_r = `step_size`) or AdaptiveMomentumConnection (eq. 15
    with μ_r from eq. 18, clamped to [0, 1 − `delta`]). Every value is checked, also those the
    chosen kind does not use, so a bad one is refused whichever kind is chosen."""
    kind = check_choice(kind, "connection", CONNECTIONS)
    momentum = check_momentum(momentum, "connection_momentum")
    step_size = check_positive(step_size, "connection_step_size")
    delta = check_delta(delta, "connection_delta")
    if kind == "momentum":
        return MomentumConnection(momentum, step_size)
    if kind == "adaptive":
        return AdaptiveMomentumConnection(step_size, delta)
    return None

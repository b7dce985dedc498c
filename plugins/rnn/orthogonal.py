"""Orthogonal RNN (DTRIV) and its momentum variants (MomentumRNN, §4, Appendix A, Tables 6–10).

DTRIV (Casado 2019): h_t = modrelu(B h_{t-1} + W x_t) with B orthogonal, B = B₀ φ(A) for
a skew-symmetric A, φ = matrix exponential or Cayley map, and the base B₀ moved to the
current B every K optimiser steps (dynamic trivialization; K = ∞ keeps B₀ = I, which is
expRNN). We use torch.nn.utils.parametrizations.orthogonal, whose `base` buffer is B₀.
The momentum variants replace W x_t by the filtered input of eq. 9 / eq. 15 / Section 2.4
exactly as for the LSTM (the input kernel has no bias; the bias sits inside modReLU).
"""
import functools
import math

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils.parametrizations import orthogonal

from ..validation import check_choice, check_int
from .checks import check_input_dtype, check_sizes, check_step_counter, check_step_input
from .layers import _MomentumLayers, input_map, recurrence_loop
from .sequence import in_weight_dtype, last_step
from .variants import DEFAULT_CELL, layer_hyper

MAPS = ("matrix_exp", "cayley")
INITS = ("henaff", "cayley")


def modrelu(z, bias):
    """modReLU, DTRIV's nonlinearity for real inputs: sign(z)·relu(|z| + b)."""
    return torch.sign(z) * F.relu(torch.abs(z) + bias)


def block_skew(values, n):
    """Skew-symmetric n×n matrix with A[2j, 2j+1] = −A[2j+1, 2j] = values[j]."""
    a = values.new_zeros(n, n)
    j = torch.arange(values.numel(), device=values.device)
    a[2 * j, 2 * j + 1] = values
    return a - a.t()


def henaff_skew(n, generator=None, dtype=torch.float32):
    """Henaff et al. (2016) initialisation: block angles uniform in (−π, π)."""
    u = torch.rand(n // 2, generator=generator, dtype=torch.float64)
    return block_skew((2 * u - 1) * math.pi, n).to(dtype)


def cayley_skew(n, generator=None, dtype=torch.float32):
    """Helfrich et al. (2018) Cayley initialisation: entries −√((1−cos θ)/(1+cos θ)), θ ~ U(0, π/2)."""
    theta = torch.rand(n // 2, generator=generator, dtype=torch.float64) * (math.pi / 2)
    return block_skew(-torch.sqrt((1 - torch.cos(theta)) / (1 + torch.cos(theta))), n).to(dtype)


def make_orthogonal_(module, name, orthogonal_map, init):
    """Parametrize module.<name> as B = B₀ φ(A), starting from B₀ = I and the given skew A."""
    check_choice(orthogonal_map, "orthogonal_map", MAPS)
    check_choice(init, "init", INITS)
    weight = getattr(module, name)
    skew = (henaff_skew if init == "henaff" else cayley_skew)(weight.size(0), dtype=weight.dtype)
    orthogonal(module, name, orthogonal_map=orthogonal_map, use_trivialization=True)
    with torch.no_grad():
        module.parametrizations[name].original.copy_(skew.tril())
        module.parametrizations[name][0].base.copy_(torch.eye(weight.size(0)))


def check_orthogonal_dtype(weight, owner):
    """ValueError for 16-bit weights: torch's orthogonal parametrization forms B = B₀ φ(A) in the
    parameter's dtype, where the CPU's matrix_exp returns inf/NaN and the Cayley map has no solve,
    and no 16-bit B would stay orthogonal."""
    if weight.dtype in (torch.float16, torch.bfloat16):
        raise ValueError(f"{owner} holds its weights in {weight.dtype}, in which its orthogonal recurrent "
                         "weight B = B0 phi(A) cannot be formed (matrix_exp or the Cayley map): keep the "
                         "layer in float32 or float64 (torch.autocast runs it in float32)")


def rebase_(module, name):
    """Dynamic trivialization step: B₀ ← current B, A ← 0 (B itself is unchanged)."""
    with torch.no_grad():
        setattr(module, name, getattr(module, name))


def check_trivialization_steps(steps):
    if steps is None or steps == math.inf:
        return None
    return check_int(steps, "trivialization_steps", low=1)


class OrthogonalRNNCell(nn.Module):
    """Step-wise DTRIV cell and its momentum variants (the readable reference).

    cell "rnn":      h_t = modrelu(B h_{t-1} + W x_t)                         (DTRIV)
    cell "momentum": v_t = μ v + s W x_t;  h_t = modrelu(B h_{t-1} + v_t)       (eq. 9)
    cell "adam"/"rmsprop": v_t, m_t of eq. 15 on g = W x_t; drive v_t/√(m_t+ε)
    cell "nag"/"sr": eq. 9 with μ_t = (k−1)/(k+2) and restart F (Section 2.4)

    forward(x, h, state=None) -> (h, state) with state = (v, m, step) (None entries where
    the cell has none; step = time steps processed so far).
    """

    def __init__(self, input_size, hidden_size, cell="rnn", momentum=None, step_size=None,
                 beta=None, eps=None, restart=None, orthogonal_map="matrix_exp", init="cayley"):
        super().__init__()
        check_sizes(input_size, hidden_size)
        self.variant, hyper = layer_hyper(cell, "rnn", momentum, step_size, beta, eps, restart)
        self.input_size, self.hidden_size, self.cell = input_size, hidden_size, self.variant.name
        self.momentum, self.step_size, self.beta, self.eps, self.restart = hyper
        self.input_kernel = nn.Linear(input_size, hidden_size, bias=False)
        self.recurrent_kernel = nn.Linear(hidden_size, hidden_size, bias=False)
        self.bias = nn.Parameter(torch.empty(hidden_size))
        nn.init.kaiming_normal_(self.input_kernel.weight, nonlinearity="relu")
        nn.init.uniform_(self.bias, -0.01, 0.01)
        make_orthogonal_(self.recurrent_kernel, "weight", orthogonal_map, init)

    def forward(self, x, h, state=None):
        check_step_input(x, self.input_size)
        check_orthogonal_dtype(self.input_kernel.weight, "OrthogonalRNNCell")
        v, m, step = state if state is not None else (None, None, 0)
        g = self.input_kernel(x)
        v = torch.zeros_like(g) if v is None and self.variant.has_v else v
        m = torch.zeros_like(g) if m is None and self.variant.has_m else m
        step = torch.as_tensor(check_step_counter(step), device=x.device) + 1
        hyper = self.variant.hyper(self.momentum, self.step_size, self.beta, self.eps, self.restart)
        drive, v, m = self.variant.drive(g, v, m, step, hyper)
        h = modrelu(self.recurrent_kernel(h) + drive, self.bias)
        return h, (v, m, step)


def modrelu_step(weight_hh, bias):
    """One DTRIV step h_t = modrelu(p_t + B h_{t-1}) on a precomputed drive p."""
    def step(p, state):
        return (modrelu(torch.addmm(p, state[0], weight_hh.t()), bias),)
    return step


class OrthogonalMomentumRNN(_MomentumLayers):
    """Stack of DTRIV layers and their momentum variants, nn.RNN calling convention.

    cell: "rnn" (DTRIV) or any momentum cell of variants.py (docs/cells.md). Parameters per layer:
    weight_ih_l{k} (kaiming-normal, no input bias), weight_hh_l{k} (orthogonal, through
    torch's parametrization; orthogonal_map "matrix_exp" or "cayley"; init "henaff" or
    "cayley" skew matrices), bias_l{k} (modReLU bias, U(−0.01, 0.01)).
    trivialization_steps K: call `trivialization_step()` after every optimiser step and
    the base moves to the current B every K calls (None / math.inf: never, i.e. expRNN).
    The momentum filters run for the whole sequence first (layers.py); the modReLU
    recurrence, which no fused kernel provides, is a loop over time steps.
    """

    plain = "rnn"
    gate_count = 1
    fused_kind = None

    def __init__(self, input_size, hidden_size, num_layers=1, *, cell=DEFAULT_CELL, momentum=None,
                 step_size=None, beta=None, eps=None, restart=None, batch_first=False,
                 dropout=0.0, orthogonal_map="matrix_exp", init="cayley",
                 trivialization_steps=None):
        self.orthogonal_map, self.init = orthogonal_map, init
        self.trivialization_steps = check_trivialization_steps(trivialization_steps)
        super().__init__(input_size, hidden_size, num_layers, cell=cell, momentum=momentum,
                         step_size=step_size, beta=beta, eps=eps, restart=restart, bias=False,
                         batch_first=batch_first, dropout=dropout)
        self.optimizer_steps = 0

    def _check_input_dtype(self, x):
        check_orthogonal_dtype(self.weight_ih_l0, type(self).__name__.removeprefix("Parametrized"))
        check_input_dtype(x, self.weight_ih_l0)

    def _register_layer(self, k, d):
        h = self.hidden_size
        self.register_parameter(f"weight_ih_l{k}", nn.Parameter(torch.empty(h, d)))
        self.register_parameter(f"weight_hh_l{k}", nn.Parameter(torch.empty(h, h)))
        self.register_parameter(f"bias_l{k}", nn.Parameter(torch.empty(h)))
        make_orthogonal_(self, f"weight_hh_l{k}", self.orthogonal_map, self.init)

    def reset_parameters(self):
        for k in range(self.num_layers):
            nn.init.kaiming_normal_(getattr(self, f"weight_ih_l{k}"), nonlinearity="relu")
            nn.init.uniform_(getattr(self, f"bias_l{k}"), -0.01, 0.01)

    def trivialization_step(self):
        """Count one optimiser step; every K-th moves each base B₀ to the current B."""
        self.optimizer_steps += 1
        if self.trivialization_steps and self.optimizer_steps % self.trivialization_steps == 0:
            for k in range(self.num_layers):
                rebase_(self, f"weight_hh_l{k}")

    def _layer(self, k, x, lengths, decay, h0, c0, v0, m0, carries_v):
        """In the weights' dtype with autocast off: the modReLU recurrence is a Python loop whose
        carried h, and the momentum v it returns, stay in float32 under autocast."""
        (x, h0, v0, m0), precision = in_weight_dtype(getattr(self, f"weight_ih_l{k}"), x, h0, v0, m0)
        with precision:
            return self._full_precision_layer(k, x, lengths, decay, h0, v0, m0, carries_v)

    def _full_precision_layer(self, k, x, lengths, decay, h0, v0, m0, carries_v):
        w_ih, bias = getattr(self, f"weight_ih_l{k}"), getattr(self, f"bias_l{k}")
        w_hh = getattr(self, f"weight_hh_l{k}")
        mapped = functools.partial(input_map, x, decay, self.variant.input_scale(self.hyper), w_ih, None,
                                   v0 if carries_v else None)
        if self.variant.has_m:
            drive, v, m = self._adaptive_drive(x, decay, mapped, w_ih, None, m0, lengths)
        else:
            drive, m = F.linear(*mapped()), None
            v = last_step(drive, lengths) if self.variant.has_v else None
        out, (h,) = recurrence_loop(modrelu_step(w_hh, bias), drive, lengths, (h0,))
        return out, (h, None, v, m)

    def _input_projection(self, k, x):
        return F.linear(x, getattr(self, f"weight_ih_l{k}"))

    def _recurrent_update(self, k, pre, h, c):
        w_hh, bias = getattr(self, f"weight_hh_l{k}"), getattr(self, f"bias_l{k}")
        return modrelu(torch.addmm(pre, h, w_hh.t()), bias), None

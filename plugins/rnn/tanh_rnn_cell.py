"""Step-wise MomentumRNN cell with a tanh recurrence (MomentumRNN, Section 2.2)."""
import torch
from torch import nn

from ..validation import check_choice, check_momentum, check_positive
from .checks import check_sizes, check_step_input
from .filters import momentum_step

PARAMETERIZATIONS = ("eq9", "eq10")


class MomentumRNNCell(nn.Module):
    """MomentumRNN cell.

    parameterization="eq9" (default), eq. 9:
        v_t = μ v_{t-1} + s (W x_t + b_ih);   h_t = tanh(U h_{t-1} + b_hh + v_t)
    parameterization="eq10", eq. 10 (Remark 1, Ŵ = U⁻¹W learned directly):
        v_t = μ v_{t-1} + s (Ŵ x_t + b_ih);   h_t = tanh(U h_{t-1} + b_hh + U v_t)

    forward(x, h, v) -> (h, v); v has shape (batch, hidden_size). Weights start as in
    torch's nn.RNNCell (uniform ±1/√hidden_size).
    """

    def __init__(self, input_size, hidden_size, momentum, step_size, bias=True,
                 parameterization="eq9"):
        super().__init__()
        check_sizes(input_size, hidden_size)
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.momentum = check_momentum(momentum)
        self.step_size = check_positive(step_size, "step_size")
        self.parameterization = check_choice(parameterization, "parameterization", PARAMETERIZATIONS)
        self.x2h = nn.Linear(input_size, hidden_size, bias=bias)
        self.h2h = nn.Linear(hidden_size, hidden_size, bias=bias)
        self.reset_parameters()

    def reset_parameters(self):
        bound = self.hidden_size ** -0.5
        for p in self.parameters():
            nn.init.uniform_(p, -bound, bound)

    def forward(self, x, h, v):
        check_step_input(x, self.input_size)
        v = momentum_step(v, self.x2h(x), self.momentum, self.step_size)
        drive = v if self.parameterization == "eq9" else v @ self.h2h.weight.t()
        h = torch.tanh(self.h2h(h) + drive)
        return h, v

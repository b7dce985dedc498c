"""Step-wise MomentumLSTM cells (MomentumRNN, Section 2.2–2.4 and Appendix F).

These are the readable references: one time step per call, the Appendix-F calling
convention and initialisation. The sequence layers in `plugins.rnn.layers` compute the
same thing on torch's fused kernels.
"""
import torch
from torch import nn

from ..validation import check_momentum, check_positive
from .checks import check_sizes, check_step_counter, check_step_input
from .filters import adam_step, momentum_step, nag_momentum, restart_index
from .variants import check_restart


def lstm_update(gates, c):
    """LSTM state update of eq. 2 with PyTorch's gate order (input, forget, cell, output).

    Like torch's LSTM (and Appendix F) the cell state is forgotten: c_t = f⊙c_{t-1} + i⊙c̃_t.
    """
    i, f, g, o = gates.chunk(4, dim=-1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    h = torch.sigmoid(o) * torch.tanh(c)
    return h, c


def appendix_f_init_(x2h, h2h, hidden_size, forget_bias=1.0):
    """Appendix A/F initialisation: x2h orthogonal, h2h identity-like (eye_ on the 4h×h
    matrix), all biases 0 except the forget gate's, which is 1 in both biases."""
    with torch.no_grad():
        nn.init.orthogonal_(x2h.weight)
        nn.init.eye_(h2h.weight)
        for linear in (x2h, h2h):
            if linear.bias is not None:
                linear.bias.zero_()
                linear.bias[hidden_size:2 * hidden_size].fill_(forget_bias)


class _LSTMCellBase(nn.Module):
    def __init__(self, input_size, hidden_size, bias=True):
        super().__init__()
        check_sizes(input_size, hidden_size)
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.bias = bias
        self.x2h = nn.Linear(input_size, 4 * hidden_size, bias=bias)
        self.h2h = nn.Linear(hidden_size, 4 * hidden_size, bias=bias)
        self.reset_parameters()

    def reset_parameters(self):
        appendix_f_init_(self.x2h, self.h2h, self.hidden_size)


class MomentumLSTMCell(_LSTMCellBase):
    """MomentumLSTM cell: eq. 9 applied to the LSTM pre-activation (Remark 3, Appendix F).

        v_t = μ v_{t-1} + s (W x_t + b_ih);  gates = v_t + U h_{t-1} + b_hh

    forward(x, (h, c), v) -> (h, (h, c), v); v has shape (batch, 4*hidden_size).
    μ = 0 gives the authors' PTB "MomentumLSTM" (an LSTM whose input pre-activation is
    scaled by s).
    """

    def __init__(self, input_size, hidden_size, momentum, step_size, bias=True):
        self.momentum = check_momentum(momentum)
        self.step_size = check_positive(step_size, "step_size")
        super().__init__(input_size, hidden_size, bias)

    def forward(self, x, hidden, v):
        check_step_input(x, self.input_size)
        h, c = hidden
        v = momentum_step(v, self.x2h(x), self.momentum, self.step_size)
        h, c = lstm_update(v + self.h2h(h), c)
        return h, (h, c), v


class AdamLSTMCell(_LSTMCellBase):
    """AdamLSTM cell, eq. 15 as the authors coded it.

        g = W x_t + b_ih;  v_t = μ v + s g;  m_t = β m + (1−β) g⊙g;
        gates = v_t / √(m_t + ε) + U h_{t-1} + b_hh

    ε sits inside the square root and there is no bias correction.
    forward(x, (h, c), v, m) -> (h, (h, c), v, m); v, m have shape (batch, 4*hidden_size).
    """

    def __init__(self, input_size, hidden_size, momentum, step_size, beta, eps=1e-8, bias=True):
        self.momentum = check_momentum(momentum)
        self.step_size = check_positive(step_size, "step_size")
        self.beta = check_momentum(beta, "beta")
        self.eps = check_positive(eps, "eps")
        super().__init__(input_size, hidden_size, bias)

    def forward(self, x, hidden, v, m):
        check_step_input(x, self.input_size)
        h, c = hidden
        pre, v, m = adam_step(v, m, self.x2h(x), self.momentum, self.step_size, self.beta,
                              self.eps)
        h, c = lstm_update(pre + self.h2h(h), c)
        return h, (h, c), v, m


class RMSPropLSTMCell(AdamLSTMCell):
    """RMSPropLSTM cell: AdamLSTM (eq. 15) with μ = 0 (Section 2.4)."""

    def __init__(self, input_size, hidden_size, step_size, beta, eps=1e-8, bias=True):
        super().__init__(input_size, hidden_size, 0.0, step_size, beta, eps, bias)


class NAGLSTMCell(_LSTMCellBase):
    """NAG / scheduled-restart (SR) LSTM cell (Section 2.4).

    Heavy-ball momentum of eq. 9 with μ_t = (k−1)/(k+2), k = ((t−1) mod F) + 1 the
    position of step t in its restart block: v_t = μ_t v_{t-1} + s (W x_t + b_ih). F = None
    is plain NAG. k counts time steps and the coefficient is 0 at k = 1. The authors coded
    SR in two ways (their MNIST code extrapolates the whole pre-activation);
    this follows the paper's Section 2.4, which their PTB code also does.

    forward(x, (h, c), v, step) -> (h, (h, c), v, step + 1), step being the number of time
    steps already processed (int or a (batch,) integer tensor).
    """

    cell = "nag"

    def __init__(self, input_size, hidden_size, step_size, restart=None, bias=True):
        self.restart = check_restart(self.cell, restart)
        self.step_size = check_positive(step_size, "step_size")
        super().__init__(input_size, hidden_size, bias)

    def forward(self, x, hidden, v, step):
        check_step_input(x, self.input_size)
        h, c = hidden
        step = torch.as_tensor(check_step_counter(step), device=x.device) + 1
        mu = nag_momentum(restart_index(step, self.restart).to(x.dtype))
        if mu.dim() == 1:
            mu = mu[:, None]
        v = momentum_step(v, self.x2h(x), mu, self.step_size)
        h, c = lstm_update(v + self.h2h(h), c)
        return h, (h, c), v, step


class SRLSTMCell(NAGLSTMCell):
    """SRLSTM cell: NAGLSTMCell with a finite restart frequency F (Section 2.4)."""

    cell = "sr"

    def __init__(self, input_size, hidden_size, step_size, restart, bias=True):
        super().__init__(input_size, hidden_size, step_size, restart, bias)

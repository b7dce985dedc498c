"""Step-wise MomentumLSTM cells (MomentumRNN, Section 2.2–2.4 and Appendix F).

These are the readable references: one time step per call, the Appendix-F calling
convention and initialisation. `LSTMStepCell` runs any LSTM-family cell of the table in
variants.py (its `drive`, the same function `MomentumLSTM.step` uses); the named classes
below only fix its cell and keep the paper's positional arguments. The sequence layers in
`plugins.rnn.layers` compute the same thing on torch's fused kernels.
"""
import torch
from torch import nn

from .checks import check_sizes, check_step_counter, check_step_input
from .variants import DEFAULT_CELL, Hyper, layer_hyper


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


class LSTMStepCell(nn.Module):
    """One time step of any LSTM-family cell of the table (variants.py), eq. 2 driven by the
    cell's input drive (eq. 9, eq. 15 or Section 2.4):

        pre, v_t, m_t = drive(W x_t + b_ih, v_{t-1}, m_{t-1}, t);   gates = pre + U h_{t-1} + b_hh

    forward(x, (h, c), *states) -> (h, (h, c), *states): the states the cell carries, in the
    order of its `step_states` (v; m for the eq.-15 cells; for the cells with a schedule in t
    the number of time steps already processed, an int or a (batch,) integer tensor, returned
    advanced by one). v and m have shape (batch, 4*hidden_size). Weights as in Appendix F
    (`appendix_f_init_`).
    """

    def __init__(self, input_size, hidden_size, cell=DEFAULT_CELL, *, momentum=None, step_size=None,
                 beta=None, eps=None, restart=None, bias=True):
        super().__init__()
        check_sizes(input_size, hidden_size)
        self.variant, hyper = layer_hyper(cell, "lstm", momentum, step_size, beta, eps, restart)
        self.cell = self.variant.name
        self.momentum, self.step_size, self.beta, self.eps, self.restart = hyper
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.bias = bias
        self.x2h = nn.Linear(input_size, 4 * hidden_size, bias=bias)
        self.h2h = nn.Linear(hidden_size, 4 * hidden_size, bias=bias)
        self.reset_parameters()

    @property
    def hyper(self) -> Hyper:
        """The hyperparameters as the cell's equations use them (rmsprop: μ = 0)."""
        return self.variant.hyper(self.momentum, self.step_size, self.beta, self.eps, self.restart)

    def reset_parameters(self):
        appendix_f_init_(self.x2h, self.h2h, self.hidden_size)

    def forward(self, x, hidden, *states):
        names = self.variant.step_states
        if len(states) != len(names):
            raise TypeError(f"cell {self.cell!r} takes (x, (h, c){''.join(', ' + n for n in names)}), "
                            f"got {len(states)} state(s) after (h, c)")
        check_step_input(x, self.input_size)
        h, c = hidden
        given = dict(zip(names, states))
        step = None
        if self.variant.counts_steps:
            step = torch.as_tensor(check_step_counter(given["step"]), device=x.device) + 1
        pre, v, m = self.variant.drive(self.x2h(x), given.get("v"), given.get("m"), step, self.hyper)
        h, c = lstm_update(pre + self.h2h(h), c)
        new = {"v": v, "m": m, "step": step}
        return (h, (h, c), *(new[n] for n in names))


class MomentumLSTMCell(LSTMStepCell):
    """MomentumLSTM cell: eq. 9 applied to the LSTM pre-activation (Remark 3, Appendix F).

        v_t = μ v_{t-1} + s (W x_t + b_ih);  gates = v_t + U h_{t-1} + b_hh

    forward(x, (h, c), v) -> (h, (h, c), v); v has shape (batch, 4*hidden_size).
    μ = 0 gives the authors' PTB "MomentumLSTM" (an LSTM whose input pre-activation is
    scaled by s).
    """

    def __init__(self, input_size, hidden_size, momentum, step_size, bias=True):
        super().__init__(input_size, hidden_size, "momentum", momentum=momentum, step_size=step_size,
                         bias=bias)


class AdamLSTMCell(LSTMStepCell):
    """AdamLSTM cell, eq. 15 as the authors coded it.

        g = W x_t + b_ih;  v_t = μ v + s g;  m_t = β m + (1−β) g⊙g;
        gates = v_t / √(m_t + ε) + U h_{t-1} + b_hh

    ε sits inside the square root and there is no bias correction.
    forward(x, (h, c), v, m) -> (h, (h, c), v, m); v, m have shape (batch, 4*hidden_size).
    """

    def __init__(self, input_size, hidden_size, momentum, step_size, beta, eps=1e-8, bias=True):
        super().__init__(input_size, hidden_size, "adam", momentum=momentum, step_size=step_size,
                         beta=beta, eps=eps, bias=bias)


class RMSPropLSTMCell(LSTMStepCell):
    """RMSPropLSTM cell: AdamLSTM (eq. 15) with μ = 0 (Section 2.4).
    forward(x, (h, c), v, m) -> (h, (h, c), v, m)."""

    def __init__(self, input_size, hidden_size, step_size, beta, eps=1e-8, bias=True):
        super().__init__(input_size, hidden_size, "rmsprop", step_size=step_size,
                         beta=beta, eps=eps, bias=bias)


class NAGLSTMCell(LSTMStepCell):
    """NAG / scheduled-restart (SR) LSTM cell (Section 2.4).

    Heavy-ball momentum of eq. 9 with μ_t = (k−1)/(k+2), k = ((t−1) mod F) + 1 the
    position of step t in its restart block: v_t = μ_t v_{t-1} + s (W x_t + b_ih). F = None
    is plain NAG. k counts time steps and the coefficient is 0 at k = 1. The authors coded
    SR in two ways (their MNIST code extrapolates the whole pre-activation);
    this follows the paper's Section 2.4, which their PTB code also does.

    forward(x, (h, c), v, step) -> (h, (h, c), v, step + 1), step being the number of time
    steps already processed (int or a (batch,) integer tensor).
    """

    def __init__(self, input_size, hidden_size, step_size, restart=None, bias=True):
        super().__init__(input_size, hidden_size, "nag", step_size=step_size, restart=restart, bias=bias)


class SRLSTMCell(LSTMStepCell):
    """SRLSTM cell: NAGLSTMCell with a finite restart frequency F (Section 2.4).
    forward(x, (h, c), v, step) -> (h, (h, c), v, step + 1)."""

    def __init__(self, input_size, hidden_size, step_size, restart, bias=True):
        super().__init__(input_size, hidden_size, "sr", step_size=step_size, restart=restart, bias=bias)

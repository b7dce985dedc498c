"""Recurrent layers of every family with random float64 weights and states, and each layer
written as a float64 loop over the paper's equations (the cells of rnn_literal)."""
import torch
from rnn_literal import LITERAL_DRIVES, lstm_literal

from plugins.rnn import (
    VARIANTS,
    MomentumLSTM,
    MomentumRNN,
    OrthogonalMomentumRNN,
    RecurrentState,
    cell_names,
)
from plugins.rnn.variants import read_hyperparameters

D, H = 4, 3
HP = dict(mu=0.6, s=0.7, beta=0.8, eps=1e-6, restart=3)
TOL = 1e-10
FAMILIES = {MomentumLSTM: "lstm", MomentumRNN: "rnn", OrthogonalMomentumRNN: "rnn"}
CASES = [(cls, cell) for cls, plain in FAMILIES.items() for cell in cell_names(plain)]


def case_id(case):
    return f"{case[0].__name__}-{case[1]}" if isinstance(case, tuple) else str(case)


def takes_restart(cell):
    return VARIANTS[cell].restart != "refused"


def make(cls, cell, num_layers, gen, **kwargs):
    hyper = read_hyperparameters(cell, momentum=HP["mu"], step_size=HP["s"], beta=HP["beta"], eps=HP["eps"])
    layer = cls(D, H, num_layers, cell=cell, restart=HP["restart"] if takes_restart(cell) else None,
                **hyper, **kwargs).double()
    with torch.no_grad():
        for name, p in layer.named_parameters():
            p.copy_((0.3 if "original" in name else 0.5) * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return layer


def width(layer):
    return (4 if isinstance(layer, MomentumLSTM) else 1) * H


def random_state(layer, gen, batch):
    shape = (layer.num_layers * layer.directions, batch)
    variant = VARIANTS[layer.cell]
    rnd = lambda n: torch.randn(shape + (n,), generator=gen, dtype=torch.float64).requires_grad_()
    return RecurrentState(
        rnd(H), rnd(H) if isinstance(layer, MomentumLSTM) else None,
        rnd(width(layer)) if variant.has_v else None,
        torch.rand(shape + (width(layer),), generator=gen, dtype=torch.float64).requires_grad_()
        if variant.has_m else None,
        torch.randint(0, 8, (batch,), generator=gen))


def literal_modrelu(z, b):
    return torch.sign(z) * torch.clamp(torch.abs(z) + b, min=0.0)


def literal(layer, x, state):
    """The layer as a float64 loop over the paper's equations: x (T, B, D) one row per
    sequence length; returns outputs and the final (h, c, v, m) of every layer (of every layer
    and direction, nn.LSTM's order, when bidirectional: the backward direction reads x flipped,
    its step counter starting from the state's, as the forward one's)."""
    finals = []
    for k in range(layer.num_layers):
        if not layer.bidirectional:
            x, final = literal_direction(layer, str(k), x, state, k)
            finals.append(final)
            continue
        ahead, final = literal_direction(layer, str(k), x, state, 2 * k)
        behind, back_final = literal_direction(layer, f"{k}_reverse", x.flip(0), state, 2 * k + 1)
        x = torch.cat([ahead, behind.flip(0)], -1)
        finals += [final, back_final]
    return x, finals


def literal_direction(layer, name, x, state, row):
    """One layer's direction (parameters `*_l{name}`) from the state's row `row`: (outputs, final)."""
    drive = LITERAL_DRIVES[layer.cell]
    w_ih = getattr(layer, f"weight_ih_l{name}")
    w_hh = getattr(layer, f"weight_hh_l{name}")
    h = state.h[row]
    c = None if state.c is None else state.c[row]
    v = None if state.v is None else state.v[row]
    m = None if state.m is None else state.m[row]
    step = state.step.clone()
    outs = []
    for xt in x:
        step = step + 1
        if isinstance(layer, OrthogonalMomentumRNN):
            pre, v, m = drive(xt @ w_ih.T, v, m, step, HP)
            h = literal_modrelu(pre + h @ w_hh.T, getattr(layer, f"bias_l{name}"))
        else:
            b_ih, b_hh = getattr(layer, f"bias_ih_l{name}"), getattr(layer, f"bias_hh_l{name}")
            pre, v, m = drive(xt @ w_ih.T + b_ih, v, m, step, HP)
            if isinstance(layer, MomentumLSTM):
                h, c = lstm_literal(pre, h, c, w_hh, b_hh)
            else:
                h = torch.tanh(pre + h @ w_hh.T + b_hh)
        outs.append(h)
    return torch.stack(outs), (h, c, v, m)

"""Float64 transcriptions of each cell's input drive, written from the paper, independent of
plugins.rnn: one entry per cell of plugins.rnn.variants (test_rnn_variants checks the keys).

drive(g, v, m, step, hp) -> (drive, v, m); g the input pre-activation W x_t + b, step the
1-based index of this time step ((B,) tensor), hp a dict with mu, s, beta, eps, restart.
"""
import torch


def plain(g, v, m, step, hp):
    return g, v, m


def momentum(g, v, m, step, hp):
    """MomentumRNN, eq. 9."""
    v = hp["mu"] * v + hp["s"] * g
    return v, v, m


def nag(g, v, m, step, hp):
    """Section 2.4: μ_t = (t mod F)/(t mod F + 3) = (k−1)/(k+2), k = ((t−1) mod F) + 1."""
    k = step if hp["restart"] is None else (step - 1) % hp["restart"] + 1
    k = k.to(g.dtype)
    mu = (k - 1) / (k + 2)
    v = mu[:, None] * v + hp["s"] * g
    return v, v, m


def adaptive(mu_of):
    """Eq. 15 as the authors coded it (ε inside the root, no bias correction)."""
    def drive(g, v, m, step, hp):
        v = mu_of(hp) * v + hp["s"] * g
        m = hp["beta"] * m + (1 - hp["beta"]) * g * g
        return v / torch.sqrt(m + hp["eps"]), v, m
    return drive


LITERAL_DRIVES = {
    "lstm": plain,
    "rnn": plain,
    "momentum": momentum,
    "adam": adaptive(lambda hp: hp["mu"]),
    "rmsprop": adaptive(lambda hp: 0.0),
    "nag": nag,
    "sr": nag,
}


def sigmoid(z):
    return 1.0 / (1.0 + torch.exp(-z))


def lstm_literal(pre, h, c, weight_hh, bias_hh):
    """Eq. 2 with torch's gate order (i, f, g, o): c = f⊙c + i⊙tanh(g̃), h = o⊙tanh(c)."""
    z = pre + h @ weight_hh.T + (0.0 if bias_hh is None else bias_hh)
    n = c.size(-1)
    i, f, g, o = (z[:, j * n:(j + 1) * n] for j in range(4))
    c = sigmoid(f) * c + sigmoid(i) * torch.tanh(g)
    return sigmoid(o) * torch.tanh(c), c

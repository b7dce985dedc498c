"""Momentum filters of MomentumRNN (momentum_rnn.md), step-wise and for a whole sequence.

Every momentum cell feeds its recurrence a filtered input that does not depend on the
hidden state. For eq. 9, with g_t = W x_t + b the input pre-activation,

    v_t = μ_t v_{t-1} + s g_t  =  s Σ_{k≤t} (Π_{j=k+1..t} μ_j) g_k + (Π_{j≤t} μ_j) v_0,

so the momenta of all T steps come from one lower-triangular (T+1, T+1) *decay matrix*
M[t, k] = Π_{j=k+1..t} μ_j (column 0 weights the carried-in v_0). Because g is linear in
x, the filter can also run on x itself (ANCHORS, "Useful identities"): v_t = W x̃_t + b c_t
+ M[t, 0] v_0 with x̃_t = s Σ_k M[t, k] x_k and c_t = s Σ_k M[t, k]. The decay matrices
are built from their closed forms, never by dividing by small powers of μ.
"""
import math

import torch


def check_momentum(momentum):
    if not (isinstance(momentum, (int, float)) and 0.0 <= momentum < 1.0):
        raise ValueError(f"momentum must be a number in [0, 1), got {momentum!r}")


def check_step_size(step_size):
    if not (isinstance(step_size, (int, float)) and step_size > 0 and math.isfinite(step_size)):
        raise ValueError(f"step_size must be a finite number > 0, got {step_size!r}")


def check_beta(beta):
    if not (isinstance(beta, (int, float)) and 0.0 <= beta < 1.0):
        raise ValueError(f"beta must be a number in [0, 1), got {beta!r}")


def check_eps(eps):
    if not (isinstance(eps, (int, float)) and eps > 0):
        raise ValueError(f"eps must be a number > 0, got {eps!r}")


def check_restart(restart):
    """restart F is an integer ≥ 1, or None / math.inf for no restart (plain NAG)."""
    if restart is None or restart == math.inf:
        return None
    if isinstance(restart, bool) or not isinstance(restart, int) or restart < 1:
        raise ValueError(f"restart must be an integer >= 1, None or math.inf, got {restart!r}")
    return restart


def restart_index(step, restart):
    """Position k ∈ {1, …, F} of global time step t ≥ 1 within its restart block.

    Section 2.4: μ = (t mod F)/(t mod F + 3) = (k−1)/(k+2) with k = ((t−1) mod F) + 1;
    F = None means no restart (k = t). Step 0 (nothing processed yet) maps to k = 0.
    """
    if restart is None:
        return step
    return torch.where(step > 0, torch.remainder(step - 1, restart) + 1, torch.zeros_like(step))


def nag_momentum(k):
    """NAG-style momentum μ_k = (k − 1)/(k + 2) (Section 2.4); μ_1 = 0 starts a block."""
    return (k - 1) / (k + 2)


def momentum_step(v, g, momentum, step_size):
    """One step of eq. 9's momentum: v_t = μ v_{t-1} + s g_t (μ may be a tensor)."""
    return momentum * v + step_size * g


def adam_step(v, m, g, momentum, step_size, beta, eps):
    """One step of eq. 15: v_t = μ v + s g; m_t = β m + (1−β) g⊙g; returns v/√(m+ε), v, m."""
    v = momentum * v + step_size * g
    m = beta * m + (1.0 - beta) * g * g
    return v / torch.sqrt(m + eps), v, m


def constant_decay(length, momentum, dtype=torch.float64, device=None):
    """Decay matrix of eq. 9 with constant μ: M[t, k] = μ^(t−k) for k ≤ t, shape (1, T+1, T+1)."""
    t = torch.arange(length + 1, dtype=torch.float64, device=device)
    lag = t[:, None] - t[None, :]
    decay = torch.where(lag >= 0, torch.tensor(float(momentum), dtype=torch.float64,
                                               device=device) ** lag.clamp(min=0), 0.0)
    return decay.to(dtype).unsqueeze(0)


def nag_decay(length, start_step, restart, dtype=torch.float64, device=None):
    """Decay matrix of the NAG/SR momentum (Section 2.4), shape (G, T+1, T+1).

    start_step (G,) holds the number of steps each sequence has already processed. Inside
    a restart block k runs a, a+1, …, b and the product telescopes:
    Π_{j=a+1..b} (j−1)/(j+2) = a(a+1)(a+2) / (b(b+1)(b+2)); across a restart it is 0.
    """
    tau = torch.arange(length + 1, device=device)
    k = restart_index(start_step.to(device)[:, None] + tau[None, :], restart).to(torch.float64)
    cube = k * (k + 1) * (k + 2)
    same_block = (k[:, :, None] - k[:, None, :]) == (tau[:, None] - tau[None, :]).to(k)
    causal = tau[:, None] >= tau[None, :]
    ratio = cube[:, None, :] / cube[:, :, None].clamp(min=1.0)
    decay = torch.where(same_block & causal, ratio, 0.0)
    decay[:, tau, tau] = 1.0
    return decay.to(dtype)


def filter_sequence(seq, decay, step_size, chunk=128):
    """Parallel form of eq. 9's filter without the carried state: s Σ_{k≤t} M[t, k] seq_k.

    seq (T, B, D), decay (G, T+1, T+1) with G ∈ {1, B}; returns (T, B, D). Runs in chunks
    of `chunk` steps (cost T·chunk·B·D instead of T²·B·D): inside a chunk starting after
    step a the sum is dense, and the part before it enters through M[t, a] x̃_a, since the
    products of μ factor as M[t, k] = M[t, a] M[a, k] for k ≤ a ≤ t.
    """
    steps = seq.size(0)
    weights = step_size * decay.to(seq.dtype)
    outs, prev = [], None
    for a in range(0, steps, chunk):
        b = min(a + chunk, steps)
        block = weights[:, a + 1:b + 1, a + 1:b + 1]
        part = seq[a:b]
        if block.size(0) == 1:
            y = torch.matmul(block[0], part.reshape(b - a, -1)).view_as(part)
        else:
            y = torch.einsum("btk,kbd->tbd", block, part)
        if prev is not None:
            carry = decay[:, a + 1:b + 1, a].to(seq.dtype).transpose(0, 1).unsqueeze(-1)
            y = y + carry * prev
        prev = y[-1]
        outs.append(y)
    return torch.cat(outs)


def carried_weight(decay, batch):
    """Weight M[t, 0] of the carried-in v_0 in v_t, as a (T, B) tensor."""
    return decay[:, 1:, 0].transpose(0, 1).expand(-1, batch)


def bias_channel(decay, step_size, batch):
    """c_t = s Σ_{1≤k≤t} M[t, k]: how much of the input bias b the momentum v_t holds, (T, B)."""
    return step_size * decay[:, 1:, 1:].sum(-1).transpose(0, 1).expand(-1, batch)


def second_moment(g_squared, m0, beta):
    """m_t = β m_{t-1} + (1−β) g_t⊙g_t over a sequence (eq. 15); g_squared (T, B, N).

    A loop over T cheap (B, N) steps: a dense (T, T) form would cost T²·B·N here, since
    g⊙g is not linear in the input.
    """
    scaled = ((1.0 - beta) * g_squared).unbind(0)
    out = []
    m = m0
    for q in scaled:
        m = torch.add(q, m, alpha=beta)
        out.append(m)
    return torch.stack(out)

"""Step-wise MomentumRNN cells vs Appendix F and literal float64 transcriptions."""
import math

import pytest
import torch

from plugins.rnn import (
    AdamLSTMCell,
    MomentumLSTMCell,
    MomentumRNNCell,
    NAGLSTMCell,
    RMSPropLSTMCell,
    SRLSTMCell,
)
from plugins.rnn.filters import ConstantDecay, NAGDecay, bias_channel, carried_weight, filter_sequence
from reference_appendix_f import MomentumLSTMCell as AppendixFCell

D, H, B, T = 3, 4, 5, 7
TOL = 1e-12


def sig(z):
    return 1.0 / (1.0 + torch.exp(-z))


def literal_lstm(gates, c):
    """Eq. 2 gate by gate, torch order (i, f, g, o), forget gate on c as in Appendix F."""
    i, f, g, o = (gates[:, j * H:(j + 1) * H] for j in range(4))
    c = sig(f) * c + sig(i) * torch.tanh(g)
    return sig(o) * torch.tanh(c), c


def params(cell):
    return cell.x2h.weight, cell.x2h.bias, cell.h2h.weight, cell.h2h.bias


def randomise(cell, gen):
    with torch.no_grad():
        for p in cell.parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return cell


def literal_momentum_lstm(xs, W, b, U, c_b, mu_of_step, s):
    """v_t = μ_t v_{t-1} + s (W x_t + b);  gates = v_t + U h + c_b (eq. 9, Remark 3)."""
    h = xs.new_zeros(B, H)
    c = xs.new_zeros(B, H)
    v = xs.new_zeros(B, 4 * H)
    hs = []
    for t in range(1, len(xs) + 1):
        v = mu_of_step(t) * v + s * (xs[t - 1] @ W.T + b)
        h, c = literal_lstm(v + h @ U.T + c_b, c)
        hs.append(h)
    return torch.stack(hs), v


def literal_adam_lstm(xs, W, b, U, c_b, mu, s, beta, eps):
    """Eq. 15: v = μv + s g; m = βm + (1−β) g²; gates = v/√(m+ε) + U h + c_b."""
    h = xs.new_zeros(B, H)
    c = xs.new_zeros(B, H)
    v = xs.new_zeros(B, 4 * H)
    m = xs.new_zeros(B, 4 * H)
    hs = []
    for x in xs:
        g = x @ W.T + b
        v = mu * v + s * g
        m = beta * m + (1 - beta) * g * g
        h, c = literal_lstm(v / torch.sqrt(m + eps) + h @ U.T + c_b, c)
        hs.append(h)
    return torch.stack(hs), v, m


def unroll(cell, xs, extra):
    h = xs.new_zeros(B, H)
    c = xs.new_zeros(B, H)
    state = extra
    hs = []
    for x in xs:
        h, (h, c), *state = cell(x, (h, c), *state)
        hs.append(h)
    return torch.stack(hs), state


def assert_close_with_grads(out_a, out_b, inputs_a, inputs_b, gen):
    assert torch.allclose(out_a, out_b, rtol=0, atol=TOL)
    probe = torch.randn(out_a.shape, generator=gen, dtype=out_a.dtype)
    ga = torch.autograd.grad((out_a * probe).sum(), inputs_a)
    gb = torch.autograd.grad((out_b * probe).sum(), inputs_b)
    for a, b_ in zip(ga, gb):
        assert torch.allclose(a, b_, rtol=0, atol=TOL)


def test_momentum_lstm_cell_matches_appendix_f(make_generator):
    torch.manual_seed(0)
    ref = AppendixFCell(D, H, 0.6, 0.9).double()
    torch.manual_seed(0)
    ours = MomentumLSTMCell(D, H, 0.6, 0.9).double()
    for a, b in zip(params(ref), params(ours)):
        assert torch.equal(a, b)
    gen = make_generator()
    randomise(ref, gen)
    ours.load_state_dict(ref.state_dict())
    xs = torch.randn(T, B, D, generator=gen, dtype=torch.float64)
    state = [(torch.randn(B, H, generator=gen, dtype=torch.float64),) * 2,
             torch.randn(B, 4 * H, generator=gen, dtype=torch.float64)]
    (hr, cr), vr = state
    (ho, co), vo = state
    for x in xs:
        hr, (hr, cr), vr = ref(x, (hr, cr), vr)
        ho, (ho, co), vo = ours(x, (ho, co), vo)
    for a, b in ((hr, ho), (cr, co), (vr, vo)):
        assert torch.allclose(a, b, rtol=0, atol=TOL)


def test_appendix_f_initialisation():
    cell = MomentumLSTMCell(D, H, 0.6, 1.0)
    W = cell.x2h.weight
    assert torch.allclose(W.T @ W, torch.eye(D), atol=1e-6)
    assert torch.equal(cell.h2h.weight, torch.eye(4 * H, H))
    expected = torch.zeros(4 * H)
    expected[H:2 * H] = 1.0
    assert torch.equal(cell.x2h.bias, expected) and torch.equal(cell.h2h.bias, expected)


@pytest.mark.parametrize("mu,s", [(0.6, 0.9), (0.0, 0.6)])
def test_momentum_lstm_cell_literal(mu, s, make_generator):
    gen = make_generator()
    cell = randomise(MomentumLSTMCell(D, H, mu, s).double(), gen)
    xs = torch.randn(T, B, D, generator=gen, dtype=torch.float64, requires_grad=True)
    ours, (v,) = unroll(cell, xs, [xs.new_zeros(B, 4 * H)])
    ref, v_ref = literal_momentum_lstm(xs, *params(cell), lambda t: mu, s)
    assert torch.allclose(v, v_ref, rtol=0, atol=TOL)
    assert_close_with_grads(ours, ref, (xs,) + params(cell), (xs,) + params(cell), gen)


@pytest.mark.parametrize("restart", [None, 1, 3])
def test_nag_sr_lstm_cell_literal(restart, make_generator):
    gen = make_generator()
    s = 0.8
    cell = randomise(NAGLSTMCell(D, H, s, restart).double(), gen)
    xs = torch.randn(2 * T, B, D, generator=gen, dtype=torch.float64, requires_grad=True)

    def mu(t):
        k = t if restart is None else (t - 1) % restart + 1
        return (k - 1) / (k + 2)

    ours, (v, step) = unroll(cell, xs, [xs.new_zeros(B, 4 * H), 0])
    ref, v_ref = literal_momentum_lstm(xs, *params(cell), mu, s)
    assert int(step) == 2 * T
    assert torch.allclose(v, v_ref, rtol=0, atol=TOL)
    assert_close_with_grads(ours, ref, (xs,) + params(cell), (xs,) + params(cell), gen)


def test_sr_restart_forgets_momentum(make_generator):
    gen = make_generator()
    cell = randomise(SRLSTMCell(D, H, 0.5, restart=4).double(), gen)
    x = torch.randn(B, D, generator=gen, dtype=torch.float64)
    h = torch.zeros(B, H, dtype=torch.float64)
    v = torch.randn(B, 4 * H, generator=gen, dtype=torch.float64)
    _, _, v_new, _ = cell(x, (h, h), v, 4)  # step 5 opens a new block: μ = 0
    assert torch.allclose(v_new, 0.5 * cell.x2h(x), rtol=0, atol=TOL)
    _, _, v_new, _ = cell(x, (h, h), v, 5)  # k = 2: μ = 1/4
    assert torch.allclose(v_new, 0.25 * v + 0.5 * cell.x2h(x), rtol=0, atol=TOL)


@pytest.mark.parametrize("kind", ["adam", "rmsprop"])
def test_adam_rmsprop_lstm_cell_literal(kind, make_generator):
    gen = make_generator()
    mu, s, beta, eps = (0.6 if kind == "adam" else 0.0), 0.7, 0.9, 1e-8
    cell = (AdamLSTMCell(D, H, mu, s, beta, eps) if kind == "adam"
            else RMSPropLSTMCell(D, H, s, beta, eps))
    cell = randomise(cell.double(), gen)
    xs = torch.randn(T, B, D, generator=gen, dtype=torch.float64, requires_grad=True)
    zero = xs.new_zeros(B, 4 * H)
    ours, (v, m) = unroll(cell, xs, [zero, zero])
    ref, v_ref, m_ref = literal_adam_lstm(xs, *params(cell), mu, s, beta, eps)
    assert torch.allclose(v, v_ref, rtol=0, atol=TOL) and torch.allclose(m, m_ref, rtol=0, atol=TOL)
    assert_close_with_grads(ours, ref, (xs,) + params(cell), (xs,) + params(cell), gen)


def test_momentum_rnn_cell_eq9_literal_and_eq10_equivalence(make_generator):
    gen = make_generator()
    mu, s = 0.7, 0.6
    cell9 = randomise(MomentumRNNCell(D, H, mu, s).double(), gen)
    xs = torch.randn(T, B, D, generator=gen, dtype=torch.float64)
    W, b, U, c_b = params(cell9)
    h = v = xs.new_zeros(B, H)
    hr = vr = xs.new_zeros(B, H)
    cell10 = MomentumRNNCell(D, H, mu, s, parameterization="eq10").double()
    with torch.no_grad():  # Remark 1: Ŵ = U⁻¹W (and U⁻¹b) gives the same dynamical system
        cell10.x2h.weight.copy_(torch.linalg.solve(U, W))
        cell10.x2h.bias.copy_(torch.linalg.solve(U, b))
        cell10.h2h.load_state_dict(cell9.h2h.state_dict())
    h10 = v10 = xs.new_zeros(B, H)
    for x in xs:
        h, v = cell9(x, h, v)
        vr = mu * vr + s * (x @ W.T + b)
        hr = torch.tanh(hr @ U.T + c_b + vr)
        h10, v10 = cell10(x, h10, v10)
        assert torch.allclose(h, hr, rtol=0, atol=TOL)
        assert torch.allclose(h10, h, rtol=0, atol=1e-10)


def dense(decay):
    """The whole (G, T+1, T+1) decay matrix (small T only)."""
    tau = torch.arange(decay.length + 1)
    return decay.matrix(tau, tau)


def literal_product(mus, t, k):
    return math.prod(mus[j] for j in range(k + 1, t + 1))


@pytest.mark.parametrize("start,restart", [(0, None), (5, None), (0, 3), (7, 3), (2, 1)])
def test_nag_decay_matrix_literal(start, restart):
    steps = 9
    mus = {}
    for j in range(1, steps + 1):
        t = start + j
        k = t if restart is None else (t - 1) % restart + 1
        mus[j] = (k - 1) / (k + 2)
    decay = dense(NAGDecay(torch.tensor([start]), restart, steps))[0]
    for t in range(steps + 1):
        for k in range(steps + 1):
            expected = literal_product(mus, t, k) if k <= t else 0.0
            if k == 0 and start == 0 and t > 0:
                expected = 0.0
            assert decay[t, k].item() == pytest.approx(expected, rel=1e-14, abs=1e-300)


def test_constant_decay_literal():
    decay = dense(ConstantDecay(0.3, 6))[0]
    for t in range(7):
        for k in range(7):
            assert decay[t, k].item() == pytest.approx(0.3 ** (t - k) if k <= t else 0.0,
                                                       rel=1e-14)


@pytest.mark.parametrize("decay", [
    ConstantDecay(0.7, 11),
    NAGDecay(torch.tensor([0]), None, 11),
    NAGDecay(torch.tensor([3, 0, 5]), 4, 11),
], ids=["constant", "nag", "sr-groups"])
def test_filter_sequence_literal_and_chunked(decay, make_generator):
    """x̃_t = μ_t x̃_{t-1} + s x_t step by step, vs the chunked parallel form; the bias channel
    and the carried weight against the same recursion."""
    gen = make_generator()
    x = torch.randn(11, 3, 2, generator=gen, dtype=torch.float64)
    s = 0.8
    full = dense(decay)
    literal, acc, ones, carried = [], torch.zeros(3, 2, dtype=torch.float64), [], []
    c = torch.zeros(3, dtype=torch.float64)
    w0 = torch.ones(3, dtype=torch.float64)
    for t in range(1, 12):
        mu = full[:, t, t - 1].expand(3)  # M[t, t-1] = μ_t
        acc = mu[:, None] * acc + s * x[t - 1]
        c, w0 = mu * c + s, mu * w0
        literal.append(acc)
        ones.append(c)
        carried.append(w0)
    literal = torch.stack(literal)
    for chunk in (128, 4, 1):
        assert torch.allclose(filter_sequence(x, decay, s, chunk), literal, rtol=1e-13, atol=1e-14)
    channel = bias_channel(decay, s, 3, torch.float64, x.device)
    assert torch.allclose(channel, torch.stack(ones), rtol=1e-13, atol=1e-14)
    assert torch.allclose(carried_weight(decay, 3), torch.stack(carried), rtol=1e-13, atol=1e-300)


class LoopedConstantDecay(ConstantDecay):
    stationary = False  # forces filter_sequence's chunk loop


@pytest.mark.parametrize("steps,chunk", [(1, 4), (9, 4), (12, 4), (70, 128), (257, 128), (300, 128)])
def test_stationary_filter_matches_recursion_and_chunk_loop(steps, chunk, make_generator):
    """Constant μ takes one matrix product for all chunks and one for the carry between
    them: forward against x̃_t = μ x̃_{t-1} + s x_t, gradients against the chunk loop, at
    lengths that are and are not multiples of the chunk."""
    gen = make_generator()
    mu, s = 0.95, 0.7
    x = torch.randn(steps, 3, 2, generator=gen, dtype=torch.float64, requires_grad=True)
    acc, literal = torch.zeros(3, 2, dtype=torch.float64), []
    for x_t in x.detach():
        acc = mu * acc + s * x_t
        literal.append(acc)
    fast = filter_sequence(x, ConstantDecay(mu, steps), s, chunk)
    looped = filter_sequence(x, LoopedConstantDecay(mu, steps), s, chunk)
    assert torch.allclose(fast, torch.stack(literal), rtol=1e-12, atol=1e-13)
    cotangent = torch.randn(fast.shape, generator=gen, dtype=torch.float64)
    (g_fast,), (g_loop,) = (torch.autograd.grad(y, x, cotangent) for y in (fast, looped))
    assert torch.allclose(g_fast, g_loop, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("steps,chunk,padded", [(70, 128, False), (12, 4, False), (9, 4, True)])
def test_stationary_filter_pads_only_a_short_last_chunk(steps, chunk, padded, make_generator):
    """A length that fills its chunks (PTB's 70 steps are one chunk) is filtered without the copy
    that pads the last chunk, nor, in one chunk, a slice whose backward copies the gradient or the
    chunk layout's transposes; the result is the recursion's either way."""
    from torch.profiler import ProfilerActivity, profile
    x = torch.randn(steps, 3, 2, generator=make_generator(), dtype=torch.float64, requires_grad=True)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fast = filter_sequence(x, ConstantDecay(0.9, steps), 0.7, chunk)
        fast.sum().backward()
    names = {event.name for event in prof.events()}
    assert ("aten::constant_pad_nd" in names) == padded
    assert ("aten::slice_backward" in names) == (padded or steps > chunk)     # the carry between chunks
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        filter_sequence(x, ConstantDecay(0.9, steps), 0.7, chunk)
    called = {event.name for event in prof.events() if not (event.cpu_parent and
                                                           event.cpu_parent.name.startswith("aten::"))}
    assert ("aten::transpose" in called) == (steps > chunk)
    acc, literal = torch.zeros(3, 2, dtype=torch.float64), []
    for x_t in x.detach():
        acc = 0.9 * acc + 0.7 * x_t
        literal.append(acc)
    assert torch.allclose(fast, torch.stack(literal), rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("make,match", [
    (lambda: MomentumLSTMCell(D, H, -0.1, 1.0), "momentum"),
    (lambda: MomentumLSTMCell(D, H, 1.0, 1.0), "momentum"),
    (lambda: MomentumLSTMCell(D, H, 0.5, 0.0), "step_size"),
    (lambda: MomentumLSTMCell(D, H, 0.5, -1.0), "step_size"),
    (lambda: MomentumLSTMCell(0, H, 0.5, 1.0), "input_size"),
    (lambda: AdamLSTMCell(D, H, 0.5, 1.0, 1.0), "beta"),
    (lambda: AdamLSTMCell(D, H, 0.5, 1.0, -0.5), "beta"),
    (lambda: AdamLSTMCell(D, H, 0.5, 1.0, 0.9, eps=0.0), "eps"),
    (lambda: NAGLSTMCell(D, H, 1.0, restart=0), "restart"),
    (lambda: SRLSTMCell(D, H, 1.0, restart=None), "restart"),
    (lambda: MomentumRNNCell(D, H, 0.5, 1.0, parameterization="eq11"), "parameterization"),
    (lambda: MomentumLSTMCell(D, H, False, 1.0), "momentum"),
    (lambda: MomentumLSTMCell(D, H, 0.5, True), "step_size"),
    (lambda: AdamLSTMCell(D, H, 0.5, 1.0, 0.9, eps=math.inf), "eps"),
    (lambda: AdamLSTMCell(D, H, 0.5, math.nan, 0.9), "step_size"),
    (lambda: SRLSTMCell(D, H, 1.0, restart=True), "restart"),
])
def test_bad_hyperparameters(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_bad_step_input():
    cell = MomentumLSTMCell(D, H, 0.5, 1.0)
    h = torch.zeros(B, H)
    with pytest.raises(ValueError, match="input"):
        cell(torch.zeros(B, D + 1), (h, h), torch.zeros(B, 4 * H))
    with pytest.raises(ValueError, match="input"):
        cell(torch.zeros(T, B, D), (h, h), torch.zeros(B, 4 * H))


@pytest.mark.parametrize("step", [-5, -1, 2 ** 63 - 1, 2 ** 62, 2.0])
def test_nag_cell_refuses_bad_step_counters(step):
    cell = NAGLSTMCell(D, H, 1.0)
    h = torch.zeros(B, H)
    with pytest.raises(ValueError, match="step"):
        cell(torch.zeros(B, D), (h, h), torch.zeros(B, 4 * H), step)
    if isinstance(step, int) and abs(step) < 2 ** 63:
        with pytest.raises(ValueError, match="step"):
            cell(torch.zeros(B, D), (h, h), torch.zeros(B, 4 * H), torch.full((B,), step))

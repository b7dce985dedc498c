"""Momentum connection (eq. 15) and adaptive momentum (eq. 18) vs literal transcriptions; the one
builder and its defaults, shared by the fairseq and HF integrations."""
import itertools
import math

import pytest
import torch

from plugins.connection import (
    AdaptiveMomentumConnection,
    ConnectionState,
    MomentumConnection,
    adaptive_momentum,
    build_connection,
    momentum_connection,
)

# Momentum Transformer paper, Table 1, "Non-Autoregressive Machine Translation" rows: "Momentum in
# Momentum Connection" 0.3, "Stepsize in Momentum Connection" 0.9 (momentum and adaptive rows);
# Section 3.2.1 chooses the threshold δ = 10^-3.
TABLE_1_NAT_CONNECTION_MOMENTUM = 0.3
TABLE_1_NAT_CONNECTION_STEP_SIZE = 0.9
SECTION_3_2_1_DELTA = 1e-3


def literal_stack(x, updates, mu, gamma):
    """The authors' loop: v = 0; for each layer: v = mu * v - A; x = x - gamma * v."""
    v = torch.zeros_like(x)
    for a in updates:
        v = mu * v - a
        x = x - gamma * v
    return x


def literal_adaptive_mu(a, a_prev, delta, eps):
    """Eq. 18 token by token with Python floats."""
    out = torch.empty(a.shape[:-1] + (1,), dtype=a.dtype)
    for idx in itertools.product(*(range(n) for n in a.shape[:-1])):
        diff = math.sqrt(sum((float(x) - float(y)) ** 2 for x, y in zip(a[idx], a_prev[idx])))
        prev = math.sqrt(sum(float(y) ** 2 for y in a_prev[idx]))
        out[idx] = min(max((1 - math.sqrt(diff / (prev + eps))) ** 2, 0.0), 1 - delta)
    return out


@pytest.mark.parametrize("mu,gamma", [(0.0, 1.0), (0.6, 1.0), (0.9, 0.5)])
def test_momentum_connection_matches_authors_loop(make_generator, mu, gamma):
    gen = make_generator()
    x = torch.randn(2, 5, 8, generator=gen, dtype=torch.float64)
    updates = [torch.randn(2, 5, 8, generator=gen, dtype=torch.float64) for _ in range(4)]
    conn, state, h = MomentumConnection(mu, gamma), None, x
    for a in updates:
        h, state = conn(h, a, state)
    torch.testing.assert_close(h, literal_stack(x, updates, mu, gamma))
    if mu == 0.0 and gamma == 1.0:
        torch.testing.assert_close(h, x + sum(updates))      # the plain residual


def test_functional_form_expands_to_paper_terms(make_generator):
    gen = make_generator()
    x, a, v_prev = (torch.randn(3, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    x_next, v = momentum_connection(x, a, v_prev, momentum=0.7, step_size=0.5)
    torch.testing.assert_close(x_next, x + 0.5 * a - 0.5 * 0.7 * v_prev)
    torch.testing.assert_close(v, 0.7 * v_prev - a)


def test_adaptive_momentum_matches_literal(make_generator):
    gen = make_generator()
    a_prev = torch.randn(2, 6, 5, generator=gen, dtype=torch.float64)
    a = a_prev + 0.3 * torch.randn(2, 6, 5, generator=gen, dtype=torch.float64)
    a[0, 0] = 10 * a_prev[0, 0]                                  # a clamp at 1 − δ
    a[1, 2] = a_prev[1, 2]                                       # no change: μ clamps at 1 − δ
    mu = adaptive_momentum(a, a_prev, delta=1e-3, eps=1e-6)
    torch.testing.assert_close(mu, literal_adaptive_mu(a, a_prev, 1e-3, 1e-6))
    assert mu.min() >= 0 and mu.max() <= 1 - 1e-3


def test_adaptive_connection_stack_matches_literal(make_generator):
    gen = make_generator()
    x = torch.randn(2, 4, 6, generator=gen, dtype=torch.float64)
    updates = [torch.randn(2, 4, 6, generator=gen, dtype=torch.float64) for _ in range(3)]
    conn, state, h = AdaptiveMomentumConnection(step_size=0.8), None, x
    for a in updates:
        h, state = conn(h, a, state)
    v = -updates[0]                                              # first layer: μ = 0 by choice
    expected = x - 0.8 * v
    for a_prev, a in zip(updates, updates[1:]):
        v = literal_adaptive_mu(a, a_prev, 1e-3, 1e-6) * v - a
        expected = expected - 0.8 * v
    torch.testing.assert_close(h, expected)


def test_zero_updates_give_no_nan():
    x = torch.randn(2, 3, 4, requires_grad=True)
    zero = torch.zeros(2, 3, 4, requires_grad=True)
    conn, state, h = AdaptiveMomentumConnection(), None, x
    for _ in range(3):
        h, state = conn(h, zero * 1.0, state)
    h.sum().backward()
    assert torch.isfinite(h).all() and torch.isfinite(x.grad).all() and torch.isfinite(zero.grad).all()


def test_padding_does_not_reach_real_tokens(make_generator):
    gen = make_generator()
    x = torch.randn(1, 6, 4, generator=gen)
    updates = [torch.randn(1, 6, 4, generator=gen) for _ in range(3)]
    garbage = [u.clone() for u in updates]
    for g in garbage:
        g[:, 4:] = torch.randn(1, 2, 4, generator=gen) * 1e3
    outs = []
    for ups in (updates, garbage):
        conn, state, h = AdaptiveMomentumConnection(), None, x
        for a in ups:
            h, state = conn(h, a, state)
        outs.append(h)
    torch.testing.assert_close(outs[0][:, :4], outs[1][:, :4])


@pytest.mark.parametrize("make,needle", [
    (lambda: MomentumConnection(momentum=1.0), r"momentum must be in \[0, 1\)"),
    (lambda: MomentumConnection(momentum=0.5, step_size=0.0), "step_size must be > 0"),
    (lambda: AdaptiveMomentumConnection(delta=0.0), r"delta must be in \(0, 1\]"),
    (lambda: AdaptiveMomentumConnection(delta=2.0), r"delta must be in \(0, 1\]"),
    (lambda: AdaptiveMomentumConnection(step_size=-1.0), "step_size must be > 0"),
])
def test_bad_values(make, needle):
    with pytest.raises(ValueError, match=needle):
        make()


def test_defaults_are_table_1():
    conn = build_connection("momentum")
    assert conn.momentum == TABLE_1_NAT_CONNECTION_MOMENTUM
    assert conn.step_size == TABLE_1_NAT_CONNECTION_STEP_SIZE
    adaptive = build_connection("adaptive")
    assert (adaptive.step_size, adaptive.delta) == (TABLE_1_NAT_CONNECTION_STEP_SIZE, SECTION_3_2_1_DELTA)
    assert (MomentumConnection().momentum, AdaptiveMomentumConnection().step_size) == (0.3, 0.9)


def test_build_connection_kinds():
    assert build_connection("none") is None
    conn = build_connection("momentum", momentum=0.45, step_size=0.7)
    assert type(conn) is MomentumConnection and (conn.momentum, conn.step_size) == (0.45, 0.7)
    conn = build_connection("adaptive", step_size=0.5, delta=0.2)
    assert type(conn) is AdaptiveMomentumConnection and (conn.step_size, conn.delta) == (0.5, 0.2)


@pytest.mark.parametrize("kwargs,needle", [
    (dict(kind="bogus"), r"connection must be one of 'none', 'momentum', 'adaptive'; got 'bogus'"),
    (dict(kind=None), "connection must be one of"),
    (dict(kind="none", momentum=1.0), r"connection_momentum must be in \[0, 1\)"),
    (dict(kind="adaptive", momentum=float("nan")), "connection_momentum must be a finite number"),
    (dict(kind="momentum", step_size=True), "connection_step_size must be a number, got bool"),
    (dict(kind="momentum", step_size=float("inf")), "connection_step_size must be a finite number"),
    (dict(kind="adaptive", delta=0.0), r"connection_delta must be in \(0, 1\]"),
    (dict(kind="adaptive", delta="0.1"), "connection_delta must be a number"),
])
def test_build_connection_refuses_bad_values(kwargs, needle):
    kind = kwargs.pop("kind")
    with pytest.raises(ValueError, match=needle):
        build_connection(kind, **kwargs)


def _fairseq_and_hf_connections(tmp_path, kind, values):
    """The first layer's connection of a fairseq momentum_transformer_lm and of an HF
    MomentumTransformerModel given the same values (None = the integration's default)."""
    from helpers.fairseq_cli import build_model, lm_args

    from hf_momentum import MomentumTransformerConfig, MomentumTransformerModel
    flags = {"momentum": "--connection-momentum", "step_size": "--connection-step-size",
             "delta": "--connection-delta"}
    fields = {"momentum": "connection_momentum", "step_size": "connection_step_size",
              "delta": "adaptive_delta"}
    extra = [a for k, v in values.items() for a in (flags[k], str(v))]
    task_args, arch_args = lm_args("momentum_transformer_lm", "--decoder-layers", "2",
                                   "--decoder-embed-dim", "16", "--decoder-ffn-embed-dim", "32",
                                   "--decoder-attention-heads", "2", "--connection", kind, *extra)
    fairseq_model, _, _ = build_model(tmp_path, task_args, arch_args)
    config = MomentumTransformerConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2,
                                       num_attention_heads=2, connection=kind,
                                       **{fields[k]: v for k, v in values.items()})
    return fairseq_model.decoder.layers[0].connection, MomentumTransformerModel(config).layers[0].connection


@pytest.mark.parametrize("kind,values", [
    ("momentum", {}), ("adaptive", {}), ("momentum", dict(momentum=0.45, step_size=0.7)),
    ("adaptive", dict(step_size=0.5, delta=0.2)),
])
def test_fairseq_and_hf_build_the_same_connection(tmp_path, make_generator, kind, values):
    fairseq_conn, hf_conn = _fairseq_and_hf_connections(tmp_path, kind, values)
    assert type(fairseq_conn) is type(hf_conn)
    assert fairseq_conn.extra_repr() == hf_conn.extra_repr()
    if not values:
        assert fairseq_conn.step_size == TABLE_1_NAT_CONNECTION_STEP_SIZE
        if kind == "momentum":
            assert fairseq_conn.momentum == TABLE_1_NAT_CONNECTION_MOMENTUM
    gen = make_generator()
    x, a1, a2 = (torch.randn(2, 3, 16, generator=gen, dtype=torch.float64) for _ in range(3))
    outs = []
    for conn in (fairseq_conn, hf_conn):
        h, state = conn(x, a1)
        outs.append(conn(h, a2, state)[0])
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)


def test_connection_none_gives_no_module_in_either_integration(tmp_path):
    assert _fairseq_and_hf_connections(tmp_path, "none", {}) == (None, None)


CONNECTION_MODULES = [lambda: MomentumConnection(0.6, 0.9), lambda: AdaptiveMomentumConnection(0.9)]


@pytest.mark.parametrize("make", CONNECTION_MODULES, ids=["momentum", "adaptive"])
def test_a_state_of_another_batch_or_length_is_refused(make):
    """A velocity from a batch of 2 would broadcast over a batch of 1 (or of 1 over 2) and give
    a wrong result without an error."""
    conn = make()
    x, a = torch.randn(2, 5, 8), torch.randn(2, 5, 8)
    _, state = conn(x, a)
    for rows in (slice(0, 1), slice(None)):
        other = ConnectionState(state.velocity[rows, :1], state.update[rows, :1])
        with pytest.raises(ValueError, match=r"state.velocity must have the shape of x \(2, 5, 8\)"):
            conn(x, a, other)
    with pytest.raises(ValueError, match=r"velocity must have the shape of x \(1, 5, 8\).*got \(2, 5, 8\)"):
        conn(x[:1], a[:1], state)
    with pytest.raises(ValueError, match=r"state.update must have the shape of x"):
        conn(x, a, ConnectionState(state.velocity, state.update[:, :, :4]))
    with pytest.raises(ValueError, match=r"update must have the shape of x \(2, 5, 8\), got \(1, 5, 8\)"):
        conn(x, a[:1])


@pytest.mark.parametrize("make", CONNECTION_MODULES, ids=["momentum", "adaptive"])
def test_a_tuple_state_is_refused_clearly(make):
    conn = make()
    x, a = torch.randn(2, 5, 8), torch.randn(2, 5, 8)
    _, state = conn(x, a)
    with pytest.raises(ValueError, match=r"state must be a ConnectionState or None, got tuple"):
        conn(x, a, (state.velocity, state.update))
    with pytest.raises(ValueError, match=r"state.velocity must have the shape of x .* got NoneType"):
        conn(x, a, ConnectionState(None, state.update))

"""The one chunk body (plugins.attention.chunk.chunk_body) and its blocked scan, on both layouts,
against a float64 token-by-token loop of a rule's definition (plugins.attention.rule):
m'_i = r·m'_{i−1} + φ(k_i)v_iᵀ,  s_i = s_{i−1} + p·m'_{i−1} + q·φ(k_i)v_iᵀ,  z_i = z_{i−1} + φ(k_i),
out_i = φ(q_i)ᵀs_i / (φ(q_i)ᵀz_i + eps). Rules beyond eq. 12 (p ≠ q·r, p = 0 with r > 0) check that
the kernels read every coefficient from the rule. Chunk counts above SCAN_BLOCK run the blocked scan."""
import pytest
import torch

from plugins.attention.chunk import chunk_causal_momentum_attention
from plugins.attention.rule import MomentumRule, momentum_rule
from plugins.attention.scan import SCAN_BLOCK, affine_scan, entering
from plugins.attention.state import MomentumAttentionState
from plugins.attention.varlen import varlen_causal_momentum_attention

RULES = {
    "momentum": momentum_rule(0.9, 0.7),
    "linear": momentum_rule(0.0, 1.0),
    "not_eq12": MomentumRule(decay=0.5, carry=0.3, direct=1.2),
    "m_never_reaches_s": MomentumRule(decay=0.6, carry=0.0, direct=0.8),
}
EPS = 1e-6
TOL = dict(rtol=1e-9, atol=1e-10)


def rule_loop(fq, fk, v, rule, state):
    """The rule token by token on one sequence fq, fk (H, L, D), v (H, L, Dv) from state (s, z, m)
    of shapes (H, D, Dv), (H, D), (H, D, Dv); returns out (H, L, Dv) and the final (s, z, m)."""
    s, z, m_prime = state[0], state[1], -state[2]
    outs = []
    for i in range(fq.shape[1]):
        kv = fk[:, i, :, None] * v[:, i, None, :]
        s = s + rule.carry * m_prime + rule.direct * kv
        m_prime = rule.decay * m_prime + kv
        z = z + fk[:, i]
        num = (fq[:, i, :, None] * s).sum(1)
        den = (fq[:, i] * z).sum(-1, keepdim=True)
        outs.append(num / (den + EPS))
    out = torch.stack(outs, 1) if outs else v.new_zeros(v.shape)
    return out, (s, z, -m_prime)


def positive(gen, *shape):
    return torch.rand(*shape, generator=gen, dtype=torch.float64) + 0.1


def random_state(gen, B, H, D, Dv):
    return MomentumAttentionState(s=torch.randn(B, H, D, Dv, generator=gen, dtype=torch.float64),
                                  z=positive(gen, B, H, D),
                                  m=torch.randn(B, H, D, Dv, generator=gen, dtype=torch.float64))


def grads(loss, leaves):
    return torch.autograd.grad(loss, leaves, allow_unused=True, materialize_grads=True)


def state_loss(state, weights):
    return sum((t * w).sum() for t, w in zip((state.s, state.z, state.m), weights))


@pytest.mark.parametrize("name", sorted(RULES))
@pytest.mark.parametrize("with_init", [False, True])
def test_padded_rows_match_the_rule_token_by_token(name, with_init, make_generator):
    """Rows of lengths 150, 97, 1 and 0 (right padding, zero padded keys), chunk 4: 38 chunks,
    so the scan runs two levels of blocks; output, returned state and every gradient."""
    rule, gen = RULES[name], make_generator()
    B, H, N, D, Dv, C = 4, 2, 150, 3, 2, 4
    assert -(-N // C) > SCAN_BLOCK
    lengths = torch.tensor([150, 97, 1, 0])
    real = torch.arange(N) < lengths[:, None]
    fq, fk = positive(gen, B, H, N, D), positive(gen, B, H, N, D) * real[:, None, :, None]
    v = torch.randn(B, H, N, Dv, generator=gen, dtype=torch.float64) * real[:, None, :, None]
    init = random_state(gen, B, H, D, Dv) if with_init else MomentumAttentionState.zeros(
        B, H, D, Dv, dtype=torch.float64, device="cpu")
    leaves = [t.requires_grad_() for t in (fq, fk, v, init.s, init.z, init.m)[:6 if with_init else 3]]
    upstream = torch.randn(B, H, N, Dv, generator=gen, dtype=torch.float64) * real[:, None, :, None]
    weights = [torch.randn(t.shape, generator=gen, dtype=torch.float64) for t in (init.s, init.z, init.m)]

    out, state = chunk_causal_momentum_attention(fq, fk, v, rule=rule, eps=EPS, chunk_size=C,
                                                 initial_state=init if with_init else None,
                                                 lengths=lengths, return_state=True)
    got = grads((out * upstream).sum() + state_loss(state, weights), leaves)

    rows = [rule_loop(fq[b, :, :L], fk[b, :, :L], v[b, :, :L], rule, (init.s[b], init.z[b], init.m[b]))
            for b, L in enumerate(lengths.tolist())]
    expected_state = MomentumAttentionState(*(torch.stack([r[1][p] for r in rows]) for p in range(3)))
    expected = [torch.cat([r[0], r[0].new_zeros(H, N - r[0].shape[1], Dv)], 1) for r in rows]
    expected = torch.stack(expected)
    want = grads((expected * upstream).sum() + state_loss(expected_state, weights), leaves)

    torch.testing.assert_close(out * real[:, None, :, None], expected, **TOL)
    for part in "szm":
        torch.testing.assert_close(getattr(state, part), getattr(expected_state, part), **TOL)
    on_tokens = real[:, None, :, None]           # padded keys are zero by contract, not by the kernel
    for i, (g, w) in enumerate(zip(got, want)):
        torch.testing.assert_close(g * on_tokens if i < 3 else g, w, **TOL)


@pytest.mark.parametrize("name", sorted(RULES))
@pytest.mark.parametrize("with_init", [False, True])
def test_packed_segments_match_each_segment_alone(name, with_init, make_generator):
    """Segments of 5, 0, 70 and 75 tokens in one row, chunk 4 (over SCAN_BLOCK chunks): each
    restarts from its own state; output, returned states (the empty one keeps its state) and
    every gradient equal the rule run on each segment alone."""
    rule, gen = RULES[name], make_generator()
    H, D, Dv, C = 2, 3, 2, 4
    cu = torch.tensor([0, 5, 5, 75, 150])
    n, N = cu.numel() - 1, int(cu[-1])
    fq, fk = positive(gen, 1, H, N, D), positive(gen, 1, H, N, D)
    v = torch.randn(1, H, N, Dv, generator=gen, dtype=torch.float64)
    init = random_state(gen, n, H, D, Dv) if with_init else MomentumAttentionState.zeros(
        n, H, D, Dv, dtype=torch.float64, device="cpu")
    leaves = [t.requires_grad_() for t in (fq, fk, v, init.s, init.z, init.m)[:6 if with_init else 3]]
    upstream = torch.randn(1, H, N, Dv, generator=gen, dtype=torch.float64)
    weights = [torch.randn(t.shape, generator=gen, dtype=torch.float64) for t in (init.s, init.z, init.m)]

    out, state = varlen_causal_momentum_attention(fq, fk, v, cu_seqlens=cu, rule=rule, eps=EPS, chunk_size=C,
                                                  initial_state=init if with_init else None,
                                                  return_state=True, cu_seqlens_cpu=cu)
    got = grads((out * upstream).sum() + state_loss(state, weights), leaves)

    bounds = list(zip(cu[:-1].tolist(), cu[1:].tolist()))
    runs = [rule_loop(fq[0, :, a:b], fk[0, :, a:b], v[0, :, a:b], rule, (init.s[i], init.z[i], init.m[i]))
            for i, (a, b) in enumerate(bounds)]
    expected = torch.cat([r[0] for r in runs], 1)[None]
    expected_state = MomentumAttentionState(*(torch.stack([r[1][p] for r in runs]) for p in range(3)))
    want = grads((expected * upstream).sum() + state_loss(expected_state, weights), leaves)

    torch.testing.assert_close(out, expected, **TOL)
    for part in "szm":
        torch.testing.assert_close(getattr(state, part), getattr(expected_state, part), **TOL)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **TOL)


def scan_loop(a, u):
    y, ys = torch.zeros_like(u[:, :, 0]), []
    for t in range(u.shape[2]):
        y = (a if isinstance(a, float) else a[t]) * y + u[:, :, t]
        ys.append(y)
    return torch.stack(ys, 2)


@pytest.mark.parametrize("T", [1, SCAN_BLOCK, SCAN_BLOCK + 1, 3 * SCAN_BLOCK + 5, SCAN_BLOCK ** 2 + 7])
@pytest.mark.parametrize("decay", ["float", "restarting"])
def test_affine_scan_equals_its_recurrence(T, decay, make_generator):
    gen = make_generator()
    u = torch.randn(2, 3, T, 4, 2, generator=gen, dtype=torch.float64)
    a = 0.93
    if decay == "restarting":
        a = torch.rand(T, generator=gen, dtype=torch.float64) * (torch.rand(T, generator=gen) > 0.2)
    torch.testing.assert_close(affine_scan(a, u), scan_loop(a, u), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("decay", [1.0, 0.7, 0.0])
@pytest.mark.parametrize("restarting", [False, True])
def test_entering_never_meets_a_later_chunk(decay, restarting):
    """inf in the contribution of chunk c′ leaves the states entering chunks 0..c′ finite
    (inf·0 = NaN would show if it met them with weight 0), over 40 chunks (the blocked scan)."""
    T, c_inf = 40, 23
    local = torch.ones(1, 2, T, 3)
    local[:, :, c_inf] = float("inf")
    first = None
    if restarting:
        first = torch.zeros(T, dtype=torch.bool)
        first[[0, 5, 30]] = True
    out = entering(local, decay, first, None)
    assert torch.isfinite(out[:, :, :c_inf + 1]).all()
    if not restarting:
        assert not torch.isfinite(out[:, :, c_inf + 1]).all()

"""Chunked (eq. 13 / 14) vs the quadratic references vs the recurrence (eq. 12), float64,
forward and gradients."""
import itertools

import pytest
import torch

from plugins.attention import (
    linear_attention,
    momentum_attention,
    momentum_attention_step,
    naive_causal_momentum_attention,
    naive_noncausal_momentum_attention,
    naive_recurrent_momentum_attention,
)
from plugins.attention.feature_maps import elu_plus_one

LENGTHS = [1, 63, 64, 65, 500]
CHUNKS = [16, 64]
MOMENTA = [0.0, 0.1, 0.6, 0.9, 0.99]
STEPS = [0.6, 1.0, 2.0]
TOL = dict(rtol=1e-9, atol=1e-10)


def random_qkv(gen, B=2, H=2, N=10, Dk=8, Dv=6, Nq=None):
    q = torch.randn(B, H, N if Nq is None else Nq, Dk, generator=gen, dtype=torch.float64)
    k = torch.randn(B, H, N, Dk, generator=gen, dtype=torch.float64)
    v = torch.randn(B, H, N, Dv, generator=gen, dtype=torch.float64)
    return q.requires_grad_(), k.requires_grad_(), v.requires_grad_()


def value_and_grads(fn, q, k, v, upstream):
    out = fn(q, k, v)
    grads = torch.autograd.grad((out * upstream).sum(), (q, k, v), allow_unused=True)
    return out.detach(), [torch.zeros_like(t) if g is None else g for t, g in zip((q, k, v), grads)]


def assert_same(a, b, **tol):
    out_a, grads_a = a
    out_b, grads_b = b
    torch.testing.assert_close(out_a, out_b, **(tol or TOL))
    for name, ga, gb in zip("qkv", grads_a, grads_b):
        torch.testing.assert_close(ga, gb, **(tol or TOL), msg=lambda m: f"d{name}: {m}")


def literal_eq13(q, k, v, beta, gamma, eps):
    """Eq. 13 written out with scalar loops, independent of every vectorised form."""
    B, H, N, _ = q.shape
    out = torch.zeros(B, H, N, v.shape[-1], dtype=q.dtype)
    fq, fk = elu_plus_one(q), elu_plus_one(k)
    for b, h, i in itertools.product(range(B), range(H), range(N)):
        num = torch.zeros(v.shape[-1], dtype=q.dtype)
        den = torch.zeros((), dtype=q.dtype)
        for j in range(i + 1):
            w = gamma * (1 - beta ** (i - j + 1)) / (1 - beta)
            num += w * torch.dot(fq[b, h, i], fk[b, h, j]) * v[b, h, j]
            den += torch.dot(fq[b, h, i], fk[b, h, j])
        out[b, h, i] = num / (den + eps)
    return out


def literal_eq14(q, k, v, beta, gamma, eps):
    B, H, N, _ = k.shape
    out = torch.zeros(B, H, q.shape[2], v.shape[-1], dtype=q.dtype)
    fq, fk = elu_plus_one(q), elu_plus_one(k)
    for b, h, i in itertools.product(range(B), range(H), range(q.shape[2])):
        num = sum(gamma * (1 - beta ** (N - j)) / (1 - beta) * torch.dot(fq[b, h, i], fk[b, h, j])
                  * v[b, h, j]
                  for j in range(N))
        den = sum(torch.dot(fq[b, h, i], fk[b, h, j]) for j in range(N))
        out[b, h, i] = num / (den + eps)
    return out


@pytest.mark.parametrize("beta", [0.0, 0.6, 0.99])
def test_references_match_literal_equations(make_generator, beta):
    q, k, v = (t.detach() for t in random_qkv(make_generator(), B=1, H=2, N=7))
    torch.testing.assert_close(naive_causal_momentum_attention(q, k, v, momentum=beta, step_size=0.6),
                               literal_eq13(q, k, v, beta, 0.6, 1e-6), **TOL)
    torch.testing.assert_close(naive_noncausal_momentum_attention(q, k, v, momentum=beta, step_size=2.0),
                               literal_eq14(q, k, v, beta, 2.0, 1e-6), **TOL)
    recurrent, _ = naive_recurrent_momentum_attention(q, k, v, momentum=beta, step_size=0.6)
    torch.testing.assert_close(recurrent, literal_eq13(q, k, v, beta, 0.6, 1e-6), **TOL)


@pytest.mark.parametrize("step_size", STEPS)
@pytest.mark.parametrize("momentum", MOMENTA)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("chunk_size", CHUNKS)
@pytest.mark.parametrize("N", LENGTHS)
def test_chunked_matches_naive(make_generator, N, chunk_size, causal, momentum, step_size):
    q, k, v = random_qkv(make_generator(), N=N)
    upstream = torch.randn(2, 2, N, 6, generator=make_generator("up"), dtype=torch.float64)
    naive = naive_causal_momentum_attention if causal else naive_noncausal_momentum_attention
    expected = value_and_grads(lambda *a: naive(*a, momentum=momentum, step_size=step_size),
                               q, k, v, upstream)
    got = value_and_grads(lambda *a: momentum_attention(*a, momentum=momentum, step_size=step_size,
                                                        causal=causal, chunk_size=chunk_size),
                          q, k, v, upstream)
    assert_same(got, expected)


@pytest.mark.parametrize("momentum,step_size", [(0.0, 1.0), (0.6, 0.6), (0.99, 2.0)])
@pytest.mark.parametrize("N", [1, 65, 130])
def test_step_by_step_recurrence_matches_chunked(make_generator, N, momentum, step_size):
    q, k, v = random_qkv(make_generator(), N=N)
    upstream = torch.randn(2, 2, N, 6, generator=make_generator("up"), dtype=torch.float64)

    def stepwise(q, k, v):
        state, outs = None, []
        for i in range(N):
            out, state = momentum_attention_step(q[:, :, i:i + 1], k[:, :, i:i + 1], v[:, :, i:i + 1],
                                                 state, momentum=momentum, step_size=step_size)
            outs.append(out)
        return torch.cat(outs, dim=2)

    chunked = value_and_grads(lambda *a: momentum_attention(*a, momentum=momentum, step_size=step_size,
                                                            chunk_size=16), q, k, v, upstream)
    assert_same(value_and_grads(stepwise, q, k, v, upstream), chunked)
    naive_rec = value_and_grads(lambda *a: naive_recurrent_momentum_attention(
        *a, momentum=momentum, step_size=step_size)[0], q, k, v, upstream)
    assert_same(naive_rec, chunked)


def test_linear_attention_is_eq7(make_generator):
    q, k, v = (t.detach() for t in random_qkv(make_generator(), N=90))
    fq, fk = elu_plus_one(q), elu_plus_one(k)
    s = torch.cumsum(fk[..., :, None] * v[..., None, :], dim=2)          # eq. 7's s_i
    z = torch.cumsum(fk, dim=2)
    expected = (fq[..., None, :] @ s)[..., 0, :] / ((fq * z).sum(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(linear_attention(q, k, v, chunk_size=16), expected, **TOL)
    full = (fq @ (fk.transpose(-1, -2) @ v)) / ((fq * fk.sum(2, keepdim=True)).sum(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(linear_attention(q, k, v, causal=False), full, **TOL)


def test_momentum_changes_the_output(make_generator):
    """Guards against a fast path that silently ignores β or γ."""
    q, k, v = (t.detach() for t in random_qkv(make_generator(), N=40))
    base = momentum_attention(q, k, v, momentum=0.0)
    assert not torch.allclose(momentum_attention(q, k, v, momentum=0.5), base)
    assert not torch.allclose(momentum_attention(q, k, v, momentum=0.0, step_size=2.0), base)
    assert not torch.allclose(momentum_attention(q, k, v, momentum=0.5, causal=False),
                              momentum_attention(q, k, v, momentum=0.0, causal=False))


@pytest.mark.parametrize("name", ["elu", "relu", "identity", "callable"])
def test_feature_maps(make_generator, name):
    q, k, v = (t.detach() for t in random_qkv(make_generator(), N=33))
    maps = {"elu": elu_plus_one, "relu": torch.relu, "identity": torch.exp, "callable": torch.sigmoid}
    phi = maps[name]
    if name == "identity":
        q, k = phi(q), phi(k)
    feature_map = phi if name == "callable" else name
    expected = naive_causal_momentum_attention(q, k, v, momentum=0.6, feature_map=feature_map)
    torch.testing.assert_close(momentum_attention(q, k, v, momentum=0.6, feature_map=feature_map,
                                                  chunk_size=8), expected, **TOL)


def test_noncausal_cross_attention_lengths(make_generator):
    q, k, v = (t.detach() for t in random_qkv(make_generator(), N=20, Nq=7))
    torch.testing.assert_close(momentum_attention(q, k, v, momentum=0.6, causal=False),
                               literal_eq14(q, k, v, 0.6, 1.0, 1e-6), **TOL)


def test_empty_and_single_token(make_generator):
    q, k, v = (t.detach() for t in random_qkv(make_generator(), N=0))
    for causal in (True, False):
        out = momentum_attention(q, k, v, momentum=0.5, causal=causal)
        assert out.shape == (2, 2, 0, 6)
    out, state = momentum_attention(q, k, v, momentum=0.5, return_state=True)
    assert state.s.abs().sum() == 0 and state.s.shape == (2, 2, 8, 6)
    q, k, v = (t.detach() for t in random_qkv(make_generator("one"), N=1))
    for causal in (True, False):
        expected = literal_eq13(q, k, v, 0.5, 1.0, 1e-6)    # one token: eq. 13 = eq. 14
        torch.testing.assert_close(momentum_attention(q, k, v, momentum=0.5, causal=causal), expected, **TOL)


def test_empty_batch():
    """Batch size 0 (e.g. an empty shard): empty outputs, states and gradients, every form."""
    q, k, v = random_qkv(torch.Generator().manual_seed(0), B=0, N=9)
    for causal in (True, False):
        out = momentum_attention(q, k, v, momentum=0.5, causal=causal, chunk_size=4)
        assert out.shape == (0, 2, 9, 6)
        out.sum().backward()
        assert q.grad.shape == q.shape
    out, state = momentum_attention(q, k, v, momentum=0.5, return_state=True,
                                    padding_mask=torch.ones(0, 9, dtype=torch.bool))
    assert out.shape == (0, 2, 9, 6) and state.s.shape == (0, 2, 8, 6) and state.z.shape == (0, 2, 8)
    for n in (1, 3):
        out, new = momentum_attention_step(q[:, :, :n], k[:, :, :n], v[:, :, :n], state, momentum=0.5)
        assert out.shape == (0, 2, n, 6) and new.m.shape == (0, 2, 8, 6)


def doubling_map(x):
    """A feature map that changes the dimension: Dk → 2·Dk (both signs, as in Performer-style maps)."""
    return torch.cat([elu_plus_one(x), elu_plus_one(-x)], dim=-1)


@pytest.mark.parametrize("momentum,step_size", [(0.0, 1.0), (0.6, 0.6)])
def test_feature_map_changing_the_dimension(make_generator, momentum, step_size):
    """Parallel, token-by-token and prefill-then-decode forms agree; states are (…, 2·Dk, Dv)."""
    q, k, v = (t.detach() for t in random_qkv(make_generator(), N=21))
    kw = dict(momentum=momentum, step_size=step_size, feature_map=doubling_map)
    expected = naive_causal_momentum_attention(q, k, v, **kw)
    parallel, state = momentum_attention(q, k, v, chunk_size=8, return_state=True, **kw)
    torch.testing.assert_close(parallel, expected, **TOL)
    assert state.s.shape == (2, 2, 16, 6) and state.z.shape == (2, 2, 16)
    _, ref_state = naive_recurrent_momentum_attention(q, k, v, **kw)
    torch.testing.assert_close(state.s, ref_state.s, **TOL)
    outs, step_state = [], None
    for i in range(21):
        out, step_state = momentum_attention_step(q[:, :, i:i + 1], k[:, :, i:i + 1], v[:, :, i:i + 1],
                                                  step_state, **kw)
        outs.append(out)
    torch.testing.assert_close(torch.cat(outs, 2), expected, **TOL)
    _, pre = momentum_attention(q[:, :, :10], k[:, :, :10], v[:, :, :10], return_state=True, **kw)
    rest, _ = momentum_attention_step(q[:, :, 10:], k[:, :, 10:], v[:, :, 10:], pre, chunk_size=4, **kw)
    torch.testing.assert_close(rest, expected[:, :, 10:], **TOL)
    noncausal = momentum_attention(q, k, v, causal=False, **kw)
    torch.testing.assert_close(noncausal, naive_noncausal_momentum_attention(q, k, v, **kw), **TOL)

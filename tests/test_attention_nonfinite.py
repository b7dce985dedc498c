"""A NaN or inf in one input reaches only the outputs that depend on it (positions at or after
it, in causal order), forward and backward, for every chunk size: prefill and token-by-token
decoding agree on the finite prefix."""
import math

import pytest
import torch

from plugins.attention import (
    momentum_attention,
    momentum_attention_step,
    naive_causal_momentum_attention,
    naive_noncausal_momentum_attention,
)

TOL = dict(rtol=1e-9, atol=1e-10)
BAD_AT = 3


def inputs(gen, B=2, H=2, N=40, Dk=4, Dv=3):
    return [torch.randn(B, H, N, d, generator=gen, dtype=torch.float64) for d in (Dk, Dk, Dv)]


def poisoned(q, k, v, name, value):
    """A copy with one non-finite entry in row 0, head 1, position BAD_AT."""
    q, k, v = (t.clone() for t in (q, k, v))
    {"q": q, "k": k, "v": v}[name][0, 1, BAD_AT, 1] = value
    return q, k, v


@pytest.mark.parametrize("momentum", [0.0, 0.9])
@pytest.mark.parametrize("chunk_size", [1, 2, 4, 16, 64])
@pytest.mark.parametrize("value", [math.nan, math.inf])
@pytest.mark.parametrize("name", ["q", "k", "v"])
def test_nonfinite_input_reaches_only_later_outputs(make_generator, name, value, chunk_size, momentum):
    clean = inputs(make_generator())
    q, k, v = (t.requires_grad_() for t in poisoned(*clean, name, value))
    kw = dict(momentum=momentum, step_size=0.6)
    out = momentum_attention(q, k, v, chunk_size=chunk_size, **kw)
    expected = naive_causal_momentum_attention(*clean, **kw)
    before = out[:, :, :BAD_AT]
    torch.testing.assert_close(before, expected[:, :, :BAD_AT], **TOL)
    torch.testing.assert_close(out[1], expected[1], **TOL)            # other rows untouched
    if name == "q":                                                   # q_i reaches output i only
        assert not torch.isfinite(out[0, 1, BAD_AT]).any()
        torch.testing.assert_close(out[0, 1, BAD_AT + 1:], expected[0, 1, BAD_AT + 1:], **TOL)
    else:
        assert not torch.isfinite(out[0, 1, BAD_AT:]).all(-1).any()  # every later output is hit
    torch.testing.assert_close(out[0, 0], expected[0, 0], **TOL)      # and no other head

    # Gradients of a loss on the finite prefix are those of the clean sequence.
    clean = [t.clone().requires_grad_() for t in clean]
    grads = torch.autograd.grad(before.sum(), (q, k, v))
    ref = naive_causal_momentum_attention(*clean, **kw)[:, :, :BAD_AT].sum()
    for got, want, t in zip(grads, torch.autograd.grad(ref, clean), "qkv"):
        if t == name:                       # the bad entry's own gradient is not defined
            got, want = got.clone(), want.clone()
            got[0, 1, BAD_AT], want[0, 1, BAD_AT] = 0, 0
        torch.testing.assert_close(got, want, **TOL, msg=lambda m: f"d{t}: {m}")


@pytest.mark.parametrize("chunk_size", [1, 16])
@pytest.mark.parametrize("name", ["k", "v"])
def test_prefill_and_decoding_agree_with_a_nonfinite_input(make_generator, name, chunk_size):
    q, k, v = poisoned(*inputs(make_generator(), N=20), name, math.nan)
    kw = dict(momentum=0.9, step_size=0.6)
    parallel, state = momentum_attention(q, k, v, chunk_size=chunk_size, return_state=True, **kw)
    steps, step_state = [], None
    for i in range(q.shape[2]):
        out, step_state = momentum_attention_step(q[:, :, i:i + 1], k[:, :, i:i + 1], v[:, :, i:i + 1],
                                                  step_state, **kw)
        steps.append(out)
    steps = torch.cat(steps, 2)
    assert torch.equal(torch.isfinite(parallel), torch.isfinite(steps))
    finite = torch.isfinite(steps)
    torch.testing.assert_close(parallel[finite], steps[finite], **TOL)
    for part in ("s", "z", "m"):
        finite, step_finite = torch.isfinite(getattr(state, part)), torch.isfinite(getattr(step_state, part))
        assert torch.equal(finite, step_finite), part


@pytest.mark.parametrize("chunk_size", [1, 16])
def test_padding_and_a_nonfinite_real_key(make_generator, chunk_size):
    """Left padding (the gather path) and a NaN in a real key: earlier real outputs stay exact."""
    clean = inputs(make_generator(), N=30)
    q, k, v = poisoned(*clean, "k", math.nan)
    mask = torch.ones(2, 30, dtype=torch.bool)
    mask[0, :2] = False                                   # BAD_AT is the row's 2nd real token
    kw = dict(momentum=0.9, step_size=0.6)
    out = momentum_attention(q, k, v, padding_mask=mask, chunk_size=chunk_size, **kw)
    expected = naive_causal_momentum_attention(*clean, padding_mask=mask, **kw)
    torch.testing.assert_close(out[:, :, :BAD_AT], expected[:, :, :BAD_AT], **TOL)
    assert (out[0, :, :2] == 0).all()
    assert not torch.isfinite(out[0, 1, BAD_AT:]).all(-1).any()


def test_noncausal_nan_in_padded_queries_leaves_key_gradients_finite(make_generator):
    q, k, v = inputs(make_generator(), N=12)
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[0, 8:] = False
    q[0, :, 8:] = math.nan                                # garbage in the padded queries
    k[0, :, 8:] = math.nan
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = momentum_attention(q, k, v, momentum=0.6, causal=False, padding_mask=mask)
    real = mask[:, None, :, None]
    loss = torch.where(real, out, torch.zeros((), dtype=out.dtype)).sum()
    dq, dk, dv = torch.autograd.grad(loss, (q, k, v))
    clean = [t.detach()[:1, :, :8].clone().requires_grad_() for t in (q, k, v)]
    alone = naive_noncausal_momentum_attention(*clean, momentum=0.6)
    want = torch.autograd.grad(alone.sum(), clean)
    for got, w, t in zip((dq, dk, dv), want, "qkv"):
        assert torch.isfinite(got).all(), t
        torch.testing.assert_close(got[:1, :, :8], w, **TOL)
    torch.testing.assert_close(out[0, :, :8], alone.detach()[0], **TOL)

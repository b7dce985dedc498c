"""Padded batches equal their sequences alone; prefill-then-decode equals the parallel form."""
import pytest
import torch

from plugins.attention import (
    MomentumAttentionState,
    attend_summary,
    momentum_attention,
    momentum_attention_step,
    naive_causal_momentum_attention,
    naive_noncausal_momentum_attention,
    naive_recurrent_momentum_attention,
    summarize_keys,
)

TOL = dict(rtol=1e-9, atol=1e-10)
LENGTHS = [37, 64, 5]           # real tokens per row; the padded length is 70


def padded_batch(gen, side, N=70, H=2, Dk=8, Dv=6):
    """Rows of different true lengths, padded on the left or right with garbage: NaN keys and
    values, large queries."""
    seqs, rows, masks = [], [], []
    for n in LENGTHS:
        seq = [torch.randn(1, H, n, d, generator=gen, dtype=torch.float64) for d in (Dk, Dk, Dv)]
        pad = [torch.full((1, H, N - n, d), fill, dtype=torch.float64)
               for d, fill in ((Dk, 50.0), (Dk, float("nan")), (Dv, float("nan")))]
        mask = torch.zeros(1, N, dtype=torch.bool)
        if side == "right":
            rows.append([torch.cat([s, p], 2) for s, p in zip(seq, pad)])
            mask[:, :n] = True
        else:
            rows.append([torch.cat([p, s], 2) for s, p in zip(seq, pad)])
            mask[:, N - n:] = True
        seqs.append(seq)
        masks.append(mask)
    batch = [torch.cat([r[i] for r in rows]).requires_grad_() for i in range(3)]
    return seqs, batch, torch.cat(masks)


@pytest.mark.parametrize("momentum", [0.0, 0.6, 0.99])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_rows_equal_sequences_alone(make_generator, side, causal, momentum):
    seqs, (q, k, v), mask = padded_batch(make_generator(), side)
    out = momentum_attention(q, k, v, momentum=momentum, step_size=0.6, causal=causal,
                             padding_mask=mask, chunk_size=16)
    real_out = torch.where(mask[:, None, :, None], out, torch.zeros((), dtype=out.dtype))
    assert torch.isfinite(real_out).all()
    real_out.sum().backward()
    for b, (sq, sk, sv) in enumerate(seqs):
        sq, sk, sv = (t.clone().requires_grad_() for t in (sq, sk, sv))
        alone = momentum_attention(sq, sk, sv, momentum=momentum, step_size=0.6, causal=causal, chunk_size=16)
        alone.sum().backward()
        real = mask[b]
        torch.testing.assert_close(out[b][:, real], alone[0], **TOL)
        if causal:
            assert (out[b][:, ~real] == 0).all()
        for padded, single in ((q, sq), (k, sk), (v, sv)):
            torch.testing.assert_close(padded.grad[b][:, real], single.grad[0], **TOL)
            assert (padded.grad[b][:, ~real] == 0).all()


@pytest.mark.parametrize("causal", [True, False])
def test_any_padding_pattern_matches_reference(make_generator, causal):
    gen = make_generator()
    q, k, v = (torch.randn(3, 2, 50, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    mask = torch.rand(3, 50, generator=gen) > 0.4
    naive = naive_causal_momentum_attention if causal else naive_noncausal_momentum_attention
    expected = naive(q, k, v, momentum=0.9, step_size=2.0, padding_mask=mask)
    got = momentum_attention(q, k, v, momentum=0.9, step_size=2.0, causal=causal, padding_mask=mask,
                             chunk_size=16)
    torch.testing.assert_close(got, expected, **TOL)
    if causal:
        rec, _ = naive_recurrent_momentum_attention(q, k, v, momentum=0.9, step_size=2.0, padding_mask=mask)
        torch.testing.assert_close(got, rec, **TOL)


@pytest.mark.parametrize("momentum,step_size", [(0.0, 1.0), (0.6, 0.6), (0.99, 2.0)])
@pytest.mark.parametrize("side", ["none", "left", "right"])
@pytest.mark.parametrize("prefix", [1, 40, 64])
def test_prefill_then_decode_equals_parallel(make_generator, prefix, side, momentum, step_size):
    gen = make_generator()
    N = 70
    q, k, v = (torch.randn(3, 2, N, d, generator=gen, dtype=torch.float64) for d in (8, 8, 6))
    mask = torch.ones(3, prefix, dtype=torch.bool)
    if side == "left":
        mask[0, :prefix // 2] = False
    elif side == "right":
        mask[1, prefix - prefix // 3:] = False
    full_mask = torch.cat([mask, torch.ones(3, N - prefix, dtype=torch.bool)], dim=1)
    expected = naive_causal_momentum_attention(q, k, v, momentum=momentum, step_size=step_size,
                                               padding_mask=full_mask)
    kw = dict(momentum=momentum, step_size=step_size)
    pre, state = momentum_attention(q[:, :, :prefix], k[:, :, :prefix], v[:, :, :prefix], padding_mask=mask,
                                    chunk_size=16, return_state=True, **kw)
    _, ref_state = naive_recurrent_momentum_attention(q[:, :, :prefix], k[:, :, :prefix], v[:, :, :prefix],
                                                      padding_mask=mask, **kw)
    for name in ("s", "z", "m"):
        torch.testing.assert_close(getattr(state, name), getattr(ref_state, name), **TOL)
    outs = [pre]
    split = prefix + (N - prefix) // 2
    for i in range(prefix, split):              # one token at a time (fused step)
        out, state = momentum_attention_step(q[:, :, i:i + 1], k[:, :, i:i + 1], v[:, :, i:i + 1], state,
                                             **kw)
        outs.append(out)
    out, state = momentum_attention_step(q[:, :, split:], k[:, :, split:], v[:, :, split:], state,
                                         chunk_size=16, **kw)       # the rest as one multi-token step
    outs.append(out)
    torch.testing.assert_close(torch.cat(outs, dim=2), expected, **TOL)


def test_state_reorder_selects_beams(make_generator):
    gen = make_generator()
    q, k, v = (torch.randn(3, 2, 9, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    _, state = momentum_attention(q, k, v, momentum=0.6, return_state=True)
    index = torch.tensor([2, 2, 0])
    picked = state.reorder(index)
    _, expected = momentum_attention(q[index], k[index], v[index], momentum=0.6, return_state=True)
    for name in ("s", "z", "m"):
        torch.testing.assert_close(getattr(picked, name), getattr(expected, name), **TOL)


def test_padded_single_token_step_keeps_state(make_generator):
    gen = make_generator()
    q, k, v = (torch.randn(2, 2, 1, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    q[1], k[1], v[1] = float("nan"), float("nan"), float("nan")     # garbage in the padded row
    state = MomentumAttentionState.zeros(2, 2, 4, 4, dtype=torch.float64, device=torch.device("cpu"))
    state.s.normal_(generator=gen)
    out, new = momentum_attention_step(q, k, v, state, momentum=0.5,
                                       padding_mask=torch.tensor([[True], [False]]))
    assert (out[1] == 0).all()
    torch.testing.assert_close(new.s[1], state.s[1])
    assert not torch.allclose(new.s[0], state.s[0])


@pytest.mark.parametrize("momentum,step_size", [(0.0, 1.0), (0.6, 0.6), (0.99, 2.0)])
def test_key_summary_equals_noncausal_attention(make_generator, momentum, step_size):
    """Cross-attention during decoding: summarise padded encoder keys once, attend per step."""
    gen = make_generator()
    q = torch.randn(3, 2, 9, 8, generator=gen, dtype=torch.float64)
    k = torch.randn(3, 2, 40, 8, generator=gen, dtype=torch.float64)
    v = torch.randn(3, 2, 40, 6, generator=gen, dtype=torch.float64)
    mask = torch.rand(3, 40, generator=gen) > 0.3
    k[~mask[:, None, :, None].expand_as(k)] = float("nan")
    kw = dict(momentum=momentum, step_size=step_size)
    summary = summarize_keys(k, v, padding_mask=mask, **kw)
    expected = naive_noncausal_momentum_attention(q, torch.nan_to_num(k), v, padding_mask=mask, **kw)
    torch.testing.assert_close(attend_summary(q, summary), expected, **TOL)
    steps = torch.cat([attend_summary(q[:, :, i:i + 1], summary) for i in range(9)], dim=2)
    torch.testing.assert_close(steps, expected, **TOL)
    index = torch.tensor([2, 0, 0])
    torch.testing.assert_close(attend_summary(q[index], summary.reorder(index)), expected[index], **TOL)


def test_key_summary_rejects_mismatched_queries(make_generator):
    gen = make_generator()
    k, v = torch.randn(2, 2, 5, 4, generator=gen), torch.randn(2, 2, 5, 4, generator=gen)
    summary = summarize_keys(k, v, momentum=0.5)
    with pytest.raises(ValueError, match="does not match the summary"):
        attend_summary(torch.randn(2, 2, 3, 5), summary)
    with pytest.raises(ValueError, match=r"momentum must be in \[0, 1\)"):
        summarize_keys(k, v, momentum=1.0)

"""Packed sequences (`cu_seqlens`): every segment of a packed row equals that sequence run alone
through the float64 literal forms of the paper (eq. 12 one token at a time, eq. 14 quadratic),
forward and gradients, with random segment lengths (1-token segments, empty segments, boundaries
inside chunks), per-segment initial and final states, NaN kept inside its segment, and the
packed prefill → per-sequence decoding hand-off."""
import itertools
import warnings

import pytest
import torch

from plugins.attention import (
    MomentumAttentionState,
    attend_summary,
    linear_attention,
    momentum_attention,
    momentum_attention_step,
    naive_noncausal_momentum_attention,
    naive_recurrent_momentum_attention,
    summarize_keys,
)

TOL = dict(rtol=1e-9, atol=1e-10)
H, DK, DV = 2, 5, 3


def random_lengths(gen, count, longest):
    """Segment lengths with 1-token and empty segments among them."""
    lengths = torch.randint(1, longest + 1, (count,), generator=gen).tolist()
    lengths[1] = 1
    lengths[-2] = 0
    return lengths


def packed(gen, lengths, init=True):
    N, n = sum(lengths), len(lengths)
    q, k, v = (torch.randn(1, H, N, d, generator=gen, dtype=torch.float64).requires_grad_()
               for d in (DK, DK, DV))
    cu = torch.tensor([0, *itertools.accumulate(lengths)])
    state = None
    if init:
        state = MomentumAttentionState(
            s=torch.randn(n, H, DK, DV, generator=gen, dtype=torch.float64).requires_grad_(),
            z=torch.rand(n, H, DK, generator=gen, dtype=torch.float64).requires_grad_(),
            m=torch.randn(n, H, DK, DV, generator=gen, dtype=torch.float64).requires_grad_())
    return q, k, v, cu, state


def reference_state(state, s):
    return None if state is None else MomentumAttentionState(state.s[s:s + 1], state.z[s:s + 1],
                                                             state.m[s:s + 1])


def state_loss(state, weights):
    return sum((getattr(state, name) * w).sum() for name, w in zip("szm", weights))


@pytest.mark.parametrize("momentum", [0.0, 0.6, 0.99])
@pytest.mark.parametrize("chunk_size", [1, 4, 16])
@pytest.mark.parametrize("init", [False, True])
def test_causal_segments_equal_eq12_alone(make_generator, momentum, chunk_size, init):
    gen = make_generator()
    lengths = random_lengths(gen, 7, 23)
    q, k, v, cu, state = packed(gen, lengths, init)
    out, final = momentum_attention(q, k, v, momentum=momentum, step_size=0.7, chunk_size=chunk_size,
                                    cu_seqlens=cu, initial_state=state, return_state=True)
    n = len(lengths)
    out_w = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    state_w = [torch.randn(t.shape, generator=gen, dtype=torch.float64) for t in (final.s, final.z, final.m)]
    ((out * out_w).sum() + state_loss(final, state_w)).backward()

    leaves = [q, k, v] + ([] if state is None else [state.s, state.z, state.m])
    grads = [t.grad for t in leaves]
    for t in leaves:
        t.grad = None
    reference_loss = 0
    for s in range(n):
        a, b = int(cu[s]), int(cu[s + 1])
        init_s = reference_state(state, s)
        ref_out, ref_state = naive_recurrent_momentum_attention(
            q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], init_s, momentum=momentum, step_size=0.7)
        torch.testing.assert_close(out[:, :, a:b], ref_out, **TOL)
        for name in "szm":
            torch.testing.assert_close(getattr(final, name)[s], getattr(ref_state, name)[0], **TOL)
        reference_loss = (reference_loss + (ref_out * out_w[:, :, a:b]).sum()
                          + state_loss(ref_state, [w[s:s + 1] for w in state_w]))
    reference_loss.backward()
    for got, leaf in zip(grads, leaves):
        torch.testing.assert_close(got, leaf.grad, **TOL)


@pytest.mark.parametrize("momentum", [0.0, 0.6])
def test_noncausal_segments_equal_eq14_alone(make_generator, momentum):
    gen = make_generator()
    lengths = random_lengths(gen, 6, 20)
    q, k, v, cu, _ = packed(gen, lengths, init=False)
    out = momentum_attention(q, k, v, momentum=momentum, step_size=0.7, causal=False, chunk_size=4,
                             cu_seqlens=cu)
    weight = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    (out * weight).sum().backward()
    grads = [t.grad for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    reference = 0
    for s in range(len(lengths)):
        a, b = int(cu[s]), int(cu[s + 1])
        ref = naive_noncausal_momentum_attention(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b],
                                                 momentum=momentum, step_size=0.7)
        torch.testing.assert_close(out[:, :, a:b], ref, **TOL)
        reference = reference + (ref * weight[:, :, a:b]).sum()
    reference.backward()
    for got, t in zip(grads, (q, k, v)):
        torch.testing.assert_close(got, t.grad, **TOL)


@pytest.mark.parametrize("causal", [True, False])
def test_a_segment_does_not_see_its_neighbours(make_generator, causal):
    """Changing (even to NaN) one segment's inputs leaves every other segment's outputs and
    states bit-identical: a mixing implementation fails here."""
    gen = make_generator()
    lengths = [9, 1, 14, 6]
    q, k, v, cu, _ = packed(gen, lengths, init=False)
    kwargs = dict(momentum=0.8, causal=causal, chunk_size=4, cu_seqlens=cu)
    before = momentum_attention(q, k, v, **kwargs)
    k2, v2 = k.detach().clone(), v.detach().clone()
    k2[:, :, 10:24] = torch.randn(1, H, 14, DK, generator=gen, dtype=torch.float64)
    v2[:, :, 12] = float("nan")
    after = momentum_attention(q, k2, v2, **kwargs)
    others = torch.ones(sum(lengths), dtype=torch.bool)
    others[10:24] = False
    assert torch.equal(before[:, :, others], after[:, :, others])
    assert torch.isnan(after[:, :, 12 if causal else 10:24]).all()
    if causal:
        assert torch.isfinite(after[:, :, 10:12]).all()       # before the NaN in its own segment


@pytest.mark.parametrize("causal", [True, False])
def test_strided_offsets_give_the_contiguous_offsets_result_without_a_warning(make_generator, causal):
    """cu_seqlens as a strided view (every other entry of a longer tensor): torch's searchsorted
    warned of a copy on every call."""
    gen = make_generator()
    q, k, v, cu, _ = packed(gen, [5, 0, 7, 3], init=False)
    strided = torch.stack([cu, cu], 1).flatten()[::2]
    assert not strided.is_contiguous() and torch.equal(strided, cu)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = momentum_attention(q, k, v, momentum=0.8, causal=causal, chunk_size=4, cu_seqlens=strided)
    torch.testing.assert_close(got, momentum_attention(q, k, v, momentum=0.8, causal=causal, chunk_size=4,
                                                       cu_seqlens=cu), rtol=0, atol=0)


def test_linear_attention_and_padding_mask_that_agrees(make_generator):
    gen = make_generator()
    q, k, v, cu, _ = packed(gen, [6, 1, 11], init=False)
    out = linear_attention(q, k, v, cu_seqlens=cu, chunk_size=4,
                           padding_mask=torch.ones(1, 18, dtype=torch.bool))
    for a, b in ((0, 6), (6, 7), (7, 18)):
        alone = linear_attention(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b])
        torch.testing.assert_close(out[:, :, a:b], alone, **TOL)


def test_packed_prefill_then_per_sequence_decoding(make_generator):
    """Prefill three prompts packed in one row, decode each with the returned states (batch 3),
    then continue packed again with the step function: equal to each sequence in one pass."""
    gen = make_generator()
    prompts, more = [5, 1, 9], 3
    q, k, v, cu, _ = packed(gen, [p + more + 2 for p in prompts], init=False)
    q, k, v = (t.detach() for t in (q, k, v))
    starts = cu[:-1].tolist()
    take = lambda t, offset, width: torch.cat([t[:, :, a + offset(i):a + offset(i) + width(i)]
                                               for i, a in enumerate(starts)], 2)
    prompt_cu = torch.tensor([0, *itertools.accumulate(prompts)])
    kw = dict(momentum=0.9, step_size=0.5, chunk_size=4)
    _, state = momentum_attention(*(take(t, lambda i: 0, lambda i: prompts[i]) for t in (q, k, v)),
                                  cu_seqlens=prompt_cu, return_state=True, **kw)
    decoded = []
    for step in range(more):
        rows = [torch.cat([t[:, :, a + prompts[i] + step] for i, a in enumerate(starts)])[:, :, None]
                for t in (q, k, v)]
        out, state = momentum_attention_step(*rows, state, **kw)
        decoded.append(out)
    last_two = (take(t, lambda i: prompts[i] + more, lambda i: 2) for t in (q, k, v))
    out, state = momentum_attention_step(*last_two, state, cu_seqlens=torch.tensor([0, 2, 4, 6]), **kw)
    for i, a in enumerate(starts):
        b = a + prompts[i] + more + 2
        full = momentum_attention(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], **kw)
        for step in range(more):
            torch.testing.assert_close(decoded[step][i], full[0, :, prompts[i] + step, None], **TOL)
        torch.testing.assert_close(out[:, :, 2 * i:2 * i + 2], full[:, :, -2:], **TOL)


def test_float32_under_autocast_accumulates_in_float32(make_generator):
    gen = make_generator()
    q, k, v, cu, _ = packed(gen, [30, 1, 40], init=False)
    low = [t.detach().to(torch.bfloat16) for t in (q, k, v)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, state = momentum_attention(*low, momentum=0.9, cu_seqlens=cu, return_state=True)
    assert out.dtype == torch.bfloat16 and state.s.dtype == torch.float32
    exact = momentum_attention(*(t.double() for t in low), momentum=0.9, cu_seqlens=cu)
    torch.testing.assert_close(out.double(), exact, rtol=2e-2, atol=2e-2)


def test_compiled_packed_attention_matches_eager(make_generator):
    gen = make_generator()
    q, k, v, cu, state = packed(gen, [7, 1, 12, 0, 5], init=True)
    q, k, v = (t.detach().float() for t in (q, k, v))
    state = state.to(torch.float32).detach()

    def run(q, k, v, cu, state):
        return momentum_attention(q, k, v, momentum=0.7, chunk_size=4, cu_seqlens=cu,
                                  initial_state=state, return_state=True)

    eager = run(q, k, v, cu, state)
    compiled = torch.compile(run, fullgraph=True, backend="aot_eager")(q, k, v, cu, state)
    torch.testing.assert_close(compiled[0], eager[0])
    for name in "szm":
        torch.testing.assert_close(getattr(compiled[1], name), getattr(eager[1], name))


@pytest.mark.parametrize("cu, message", [
    (torch.tensor([[0, 4, 10]]), "1-D"),
    (torch.tensor([0.0, 4.0, 10.0]), "int32 or int64"),
    (torch.tensor([1, 4, 10]), "start at 0"),
    (torch.tensor([0, 6, 4, 10]), "non-decreasing"),
    (torch.tensor([0, 4, 9]), "end at the sequence length 10"),
    (torch.tensor([0]), "n \\+ 1 >= 2"),
    ([0, 4, 10], "1-D int32/int64 tensor"),
])
def test_bad_cu_seqlens_is_refused(cu, message):
    q = torch.randn(1, 2, 10, 4)
    with pytest.raises(ValueError, match=f"cu_seqlens.*{message}|{message}.*cu_seqlens"):
        momentum_attention(q, q, q, momentum=0.5, cu_seqlens=cu)


def test_packing_needs_one_row_one_device_and_no_contradicting_mask():
    q = torch.randn(2, 2, 10, 4)
    cu = torch.tensor([0, 4, 10])
    with pytest.raises(ValueError, match="cu_seqlens needs .* one row .* got batch 2"):
        momentum_attention(q, q, q, momentum=0.5, cu_seqlens=cu)
    with pytest.raises(ValueError, match="cu_seqlens must be on the input's device cpu, got meta"):
        momentum_attention(q[:1], q[:1], q[:1], momentum=0.5, cu_seqlens=cu.to("meta"))
    mask = torch.ones(1, 10, dtype=torch.bool)
    mask[0, 9] = False
    with pytest.raises(ValueError, match="padding_mask .* cu_seqlens"):
        momentum_attention(q[:1], q[:1], q[:1], momentum=0.5, cu_seqlens=cu, padding_mask=mask)
    state = MomentumAttentionState.zeros(1, 2, 4, 4, dtype=torch.float32, device="cpu")
    with pytest.raises(ValueError, match="one row per packed sequence: batch 2"):
        momentum_attention(q[:1], q[:1], q[:1], momentum=0.5, cu_seqlens=cu, initial_state=state)


def test_packed_summary_for_cross_attention(make_generator):
    """summarize_keys / attend_summary on packed keys and packed queries: sequence s's queries
    read only sequence s's keys (an encoder-decoder batch packed on both sides)."""
    gen = make_generator()
    key_lengths, query_lengths = [6, 1, 13], [3, 5, 1]
    _, k, v, key_cu, _ = packed(gen, key_lengths, init=False)
    q, _, _, query_cu, _ = packed(gen, query_lengths, init=False)
    summary = summarize_keys(k, v, momentum=0.8, step_size=0.5, cu_seqlens=key_cu, chunk_size=4)
    assert summary.kv.shape == (3, H, DK, DV)
    out = attend_summary(q, summary, cu_seqlens=query_cu, chunk_size=4)
    for s in range(3):
        ka, kb, qa, qb = int(key_cu[s]), int(key_cu[s + 1]), int(query_cu[s]), int(query_cu[s + 1])
        ref = naive_noncausal_momentum_attention(q[:, :, qa:qb], k[:, :, ka:kb], v[:, :, ka:kb],
                                                 momentum=0.8, step_size=0.5)
        torch.testing.assert_close(out[:, :, qa:qb], ref, **TOL)
    with pytest.raises(ValueError, match="one row per packed sequence: batch 2"):
        attend_summary(q[:, :, :8], summary, cu_seqlens=torch.tensor([0, 3, 8]))


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_triton_backend_through_the_api_matches_the_torch_path(make_generator, momentum):
    """The public API hands packed rows to the Triton kernels (interpreter on CPU): fp32 against
    the float64 PyTorch path, outputs, per-segment states and gradients."""
    pytest.importorskip("triton")
    gen = make_generator()
    q, k, v, cu, state = packed(gen, [9, 1, 0, 20, 3], init=True)
    results = {}
    for backend, dtype in (("triton", torch.float32), ("torch", torch.float64)):
        leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v, state.s, state.z, state.m)]
        init = MomentumAttentionState(*leaves[3:])
        out, final = momentum_attention(*leaves[:3], momentum=momentum, chunk_size=16, cu_seqlens=cu,
                                        initial_state=init, return_state=True, backend=backend)
        (out.sum() + final.s.sum() + final.z.sum() + 0.5 * final.m.sum()).backward()
        results[backend] = [out, final.s, final.z, final.m] + [t.grad for t in leaves]
    for fast, exact in zip(results["triton"], results["torch"]):
        torch.testing.assert_close(fast.double(), exact, rtol=1e-4, atol=1e-4)

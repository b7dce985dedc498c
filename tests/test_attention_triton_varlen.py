"""Packed sequences (`cu_seqlens`) in the Triton kernels of causal momentum attention
(Momentum Transformer, eq. 13 ≡ eq. 12 per segment): one row holding n segments, each its own
sequence, against the float64 token loop of eq. 12 run on every segment alone with its own
initial state. Outputs, per-segment final states and the gradients of q, k, v and of the
initial states. Without a GPU the kernels run through Triton's interpreter (TRITON_INTERPRET=1,
set by conftest.py): small shapes, chunk sizes 16 and 32, segments that start and end inside a
chunk, 1-token and empty segments."""
import importlib.util

import pytest
import torch
from helpers.triton_attention import SCANS, TOL, rel_rms, run_with_grads, triton_ops, use_scan
from helpers.triton_varlen import (
    EPS,
    each_segment_alone,
    offsets,
    packed_case,
    packed_inputs,
)

from plugins.attention.state import MomentumAttentionState

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")

def segment_error(got, expected, a, b):
    """RMS error on tokens [a, b) relative to the RMS of the whole reference: a segment's error
    cannot hide in the others', and a 1-token segment without initial state, whose dq and dk are
    O(eps) (pure cancellation), is held to the others' scale."""
    got, expected = got.detach().double(), expected.detach().double()
    err = (got[:, :, a:b] - expected[:, :, a:b]).pow(2).mean().sqrt()
    return (err / expected.pow(2).mean().sqrt().clamp(min=1e-30)).item()


# (segment lengths, chunk, β, γ, initial state): 1-token and empty segments (first, inside, last),
# segments that start and end inside a chunk, whole chunks (the grid's spare programs then exist)
CASES = [
    ([5, 0, 17, 1, 33, 16, 0], 16, 0.6, 0.8, True),
    ([1, 16, 16, 2, 0, 20], 16, 0.0, 1.0, True),
    ([0, 33, 1, 7], 16, 0.99, 0.6, False),
    ([40, 1, 0, 9, 18], 32, 0.0, 0.6, False),
    ([3, 31, 1, 32, 5], 32, 0.9, 1.0, True),
]


@pytest.mark.parametrize("scan", SCANS)
@pytest.mark.parametrize("lengths,chunk,beta,gamma,init", CASES)
def test_packed_segments_match_each_segment_run_alone(make_generator, monkeypatch, scan, lengths, chunk, beta,
                                                      gamma, init):
    tri = triton_ops()
    use_scan(monkeypatch, scan)
    gen = make_generator()
    H, Dk, Dv = 2, 16, 12                                   # Dv not a power of two
    n, T = len(lengths), sum(lengths)
    cu, inputs, state0, ups = packed_case(gen, lengths, H, Dk, Dv, init)

    def kernel(q, k, x, st):
        return tri.chunk_momentum_attention(q, k, x, momentum=beta, step_size=gamma, eps=EPS,
                                            chunk_size=chunk, initial_state=st, return_state=True,
                                            cu_seqlens=cu.to(torch.int32))

    def reference(q, k, x, st):
        return each_segment_alone(q, k, x, cu, st, beta, gamma)

    ref_out, ref_state, ref_grads = run_with_grads(reference, inputs, state0, ups, torch.float64)
    out, state, grads = run_with_grads(kernel, inputs, state0, ups, torch.float32)
    assert out.shape == (1, H, T, Dv) and state.s.shape == (n, H, Dk, Dv) and state.z.shape == (n, H, Dk)
    for s in range(n):                              # segment by segment: a small one cannot hide
        a, b = int(cu[s]), int(cu[s + 1])
        if b > a:
            assert rel_rms(out[:, :, a:b], ref_out[:, :, a:b]) <= TOL, f"output of segment {s}"
            for name, got, expected in zip(("fq", "fk", "v"), grads, ref_grads):
                err = segment_error(got, expected, a, b)
                assert err <= TOL, f"d{name} of segment {s}: {err:.2e}"
        for name in ("s", "z", "m"):
            err = rel_rms(getattr(state, name)[s], getattr(ref_state, name)[s])
            assert err <= TOL, f"state.{name} of segment {s}: {err:.2e}"
        for name, got, expected in zip(("s0", "z0", "m0"), grads[3:], ref_grads[3:]):
            err = rel_rms(got[s], expected[s])
            assert err <= TOL, f"d{name} of segment {s}: {err:.2e}"
    if init:
        empty = [s for s in range(n) if lengths[s] == 0]
        for s in empty:                             # an empty segment hands its initial state on
            for name in ("s", "z", "m"):
                torch.testing.assert_close(getattr(state, name)[s].double(), getattr(state0, name)[s],
                                           rtol=0, atol=1e-6)


def test_a_segment_does_not_see_its_neighbours(make_generator):
    """Changing one segment's q, k, v changes its outputs and final state and nothing of the
    other segments', bit for bit (a kernel that let states or chunk sums cross a boundary inside
    a chunk, or wrote a chunk's tail into the next segment, fails here)."""
    tri = triton_ops()
    gen = make_generator()
    lengths = [7, 12, 1, 21]
    cu = offsets(lengths).to(torch.int32)
    fq, fk, v = (t.float() for t in packed_inputs(gen, 1, sum(lengths), 16, 16))

    def run(q, k, x):
        return tri.chunk_momentum_attention(q, k, x, momentum=0.8, step_size=1.0, eps=EPS, chunk_size=16,
                                            return_state=True, cu_seqlens=cu)

    out, state = run(fq, fk, v)
    changed = [t.clone() for t in (fq, fk, v)]
    for t in changed:
        t[:, :, 7:19] = t[:, :, 7:19].flip(2) * 1.5           # segment 1, which ends inside chunk 1
    out2, state2 = run(*changed)
    assert not torch.allclose(out2[:, :, 7:19], out[:, :, 7:19])
    assert not torch.allclose(state2.s[1], state.s[1])
    for a, b in ((0, 7), (19, 41)):
        torch.testing.assert_close(out2[:, :, a:b], out[:, :, a:b], rtol=0, atol=0)
    for s in (0, 2, 3):
        torch.testing.assert_close(state2.s[s], state.s[s], rtol=0, atol=0)
        torch.testing.assert_close(state2.m[s], state.m[s], rtol=0, atol=0)


def test_packed_row_equals_the_padded_batch_kernels(make_generator):
    """The same segments as a right-padded batch through the dense kernels (`lengths`): equal
    outputs and states at β = 0 and β > 0, which also ties the β = 0 momentum (gathered outside
    the kernels) to the padded path's."""
    tri = triton_ops()
    gen = make_generator()
    lengths = [9, 1, 26]
    cu = offsets(lengths)
    fq, fk, v = (t.float() for t in packed_inputs(gen, 2, sum(lengths), 16, 16))
    batch = [torch.zeros(3, 2, 26, t.shape[-1]) for t in (fq, fk, v)]
    for s in range(3):
        for dst, src in zip(batch, (fq, fk, v)):
            dst[s, :, :lengths[s]] = src[0, :, cu[s]:cu[s + 1]]
    for beta in (0.0, 0.7):
        args = dict(momentum=beta, step_size=0.9, eps=EPS, chunk_size=16, return_state=True)
        out, state = tri.chunk_momentum_attention(fq, fk, v, cu_seqlens=cu, **args)
        dense, dense_state = tri.chunk_momentum_attention(*batch, lengths=torch.tensor(lengths), **args)
        for s in range(3):
            torch.testing.assert_close(out[0, :, cu[s]:cu[s + 1]], dense[s, :, :lengths[s]], rtol=1e-5,
                                       atol=1e-6)
        for name in ("s", "z", "m"):
            torch.testing.assert_close(getattr(state, name), getattr(dense_state, name), rtol=1e-5, atol=1e-6)


def test_chunk_tables_match_fla_prepare_chunk_indices():
    """varlen_tables (no host sync) against fla's prepare_chunk_offsets / prepare_chunk_indices
    written as a loop over segments, with the spare rows of the grid bound marked −1."""
    triton_ops()
    from plugins.attention.triton.chunk import varlen_tables
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        n = int(torch.randint(1, 9, (), generator=gen))
        lengths = torch.randint(0, 40, (n,), generator=gen)
        lengths[torch.rand(n, generator=gen) < 0.3] = 0
        lengths[0] += 1                                        # N >= 1
        BT = [16, 32, 64][int(torch.randint(0, 3, (), generator=gen))]
        cu = offsets(lengths.tolist())
        chunk_offsets, chunk_indices = varlen_tables(cu.to(torch.int32), int(cu[-1]), BT)
        counts = [-(-int(L) // BT) for L in lengths]
        expected = [(s, c) for s in range(n) for c in range(counts[s])]
        assert chunk_offsets.tolist() == [sum(counts[:s]) for s in range(n + 1)]
        assert chunk_indices.dtype == torch.int32 and len(chunk_indices) >= len(expected)
        assert [tuple(r) for r in chunk_indices[:len(expected)].tolist()] == expected
        assert (chunk_indices[len(expected):, 0] == -1).all()


def test_packed_inputs_are_checked():
    tri = triton_ops()
    q = torch.rand(1, 1, 6, 16)
    cu = torch.tensor([0, 2, 6])
    args = dict(momentum=0.5, step_size=1.0, eps=EPS, chunk_size=16)
    with pytest.raises(ValueError, match="cu_seqlens and lengths"):
        tri.chunk_momentum_attention(q, q, q, lengths=torch.tensor([6]), cu_seqlens=cu, **args)
    with pytest.raises(ValueError, match="batch 1"):
        two = q.expand(2, -1, -1, -1)
        tri.chunk_momentum_attention(two, two, two, cu_seqlens=cu, **args)
    with pytest.raises(ValueError, match="1-D integer"):
        tri.chunk_momentum_attention(q, q, q, cu_seqlens=cu.float(), **args)
    wrong = MomentumAttentionState.zeros(1, 1, 16, 16, dtype=torch.float32, device=q.device)
    with pytest.raises(ValueError, match=r"state.s must have shape \(2, 1, 16, 16\)"):
        tri.chunk_momentum_attention(q, q, q, cu_seqlens=cu, initial_state=wrong, **args)


def test_packed_call_compiles_without_graph_break(make_generator):
    """torch.compile(fullgraph=True) through the packed call, forward and backward with the
    per-segment states (aot_eager: the kernels still run through the interpreter)."""
    tri = triton_ops()
    gen = make_generator()
    cu = offsets([3, 14, 0, 5]).to(torch.int32)
    leaves = [t.float().requires_grad_() for t in packed_inputs(gen, 1, 22, 16, 16)]

    def loss(q, k, x):
        out, state = tri.chunk_momentum_attention(q, k, x, momentum=0.0, step_size=1.0, eps=EPS,
                                                  chunk_size=16, return_state=True, cu_seqlens=cu)
        return (out * out).sum() + state.s.pow(2).sum() + state.m.pow(2).sum()

    torch._dynamo.reset()
    compiled = torch.compile(loss, backend="aot_eager", fullgraph=True)
    got = torch.autograd.grad(compiled(*leaves), leaves)
    expected = torch.autograd.grad(loss(*leaves), leaves)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b)

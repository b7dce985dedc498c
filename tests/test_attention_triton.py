"""Triton kernels of momentum attention vs the float64 references (eq. 13 quadratic, eq. 12 token
loop), forward and every gradient. Without a GPU they run on CPU tensors through Triton's
interpreter (TRITON_INTERPRET=1, set by conftest.py), which is slow: the grid N × D × chunk × β × γ
× padding × initial state is covered by a representative set of cases (each value of each
factor at least once, mixed) rather than its full product."""
import importlib.util
import math
import os

import pytest
import torch
from helpers.triton_attention import (
    SCANS,
    TOL,
    loss_of,
    make_inputs,
    random_state,
    rel_rms,
    run_with_grads,
    triton_ops,
    upstreams,
    use_scan,
)

from plugins.attention import momentum_attention
from plugins.attention.naive import (
    naive_causal_momentum_attention,
    naive_recurrent_momentum_attention,
)
from plugins.attention.recurrent import fused_recurrent_step
from plugins.attention.rule import momentum_rule
from plugins.attention.state import MomentumAttentionState

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")


def torch_step(fq, fk, v, state, *, momentum, step_size, **kw):
    """The PyTorch step with the Triton step's arguments (β, γ instead of the rule object)."""
    return fused_recurrent_step(fq, fk, v, state, rule=momentum_rule(momentum, step_size), **kw)


# (N, D, chunk, β, γ, padded, initial state)
CASES = [
    (1, 16, 16, 0.6, 1.0, False, True),
    (1, 32, 32, 0.0, 0.6, True, True),     # one token and no state: dq, dk are O(eps), all cancellation
    (17, 32, 16, 0.99, 0.6, True, False),
    (17, 16, 32, 0.0, 1.0, False, True),
    (64, 16, 32, 0.0, 0.6, True, True),
    (64, 32, 16, 0.6, 1.0, False, False),
    (65, 16, 16, 0.6, 0.6, True, True),
    (65, 32, 32, 0.99, 1.0, False, True),
    (130, 16, 32, 0.99, 1.0, True, True),
    (130, 32, 16, 0.0, 1.0, False, False),
]


@pytest.mark.parametrize("scan", SCANS)
@pytest.mark.parametrize("N,D,chunk,beta,gamma,padded,init", CASES)
def test_chunk_forward_gradients_and_state_match_float64_references(make_generator, monkeypatch, scan, N, D,
                                                                    chunk, beta, gamma, padded, init):
    tri = triton_ops()
    use_scan(monkeypatch, scan)
    gen = make_generator()
    B, H, Dk, Dv = 2, 1, D, D - 8                             # Dv not a power of two
    lengths = torch.tensor([N, N // 2 if padded else N])                # N = 1 padded: a row of length 0
    fq, fk, v, real = make_inputs(gen, B, H, N, Dk, Dv, lengths)
    state0 = random_state(gen, B, H, Dk, Dv) if init else None
    ups = upstreams(gen, B, H, N, Dk, Dv)

    def run(fn, dtype):
        leaves = [t.to(dtype).requires_grad_() for t in (fq, fk, v)]
        st = None
        if init:
            st = MomentumAttentionState(*(t.to(dtype).requires_grad_()
                                          for t in (state0.s, state0.z, state0.m)))
            leaves += [st.s, st.z, st.m]
        out, state = fn(*leaves[:3], st)
        grads = torch.autograd.grad(loss_of(out, state, [u.to(dtype) for u in ups]), leaves)
        return out, state, grads

    def reference(q, k, x, st):
        # eq. 12 token by token (it is what continues from a state); eq. 13 quadratic below
        return naive_recurrent_momentum_attention(q, k, x, st, momentum=beta, step_size=gamma,
                                                  feature_map="identity", padding_mask=real)

    def kernel(q, k, x, st):
        return tri.chunk_momentum_attention(q, k, x, momentum=beta, step_size=gamma, eps=1e-6,
                                            chunk_size=chunk, initial_state=st, lengths=lengths,
                                            return_state=True)

    ref_out, ref_state, ref_grads = run(reference, torch.float64)
    out, state, grads = run(kernel, torch.float32)
    assert out.dtype == torch.float32 and state.s.dtype == torch.float32
    assert torch.all(out[~real[:, None, :, None].expand_as(out)] == 0), "padded outputs must be 0"
    assert rel_rms(out, ref_out) <= TOL
    for name in ("s", "z", "m"):
        assert rel_rms(getattr(state, name), getattr(ref_state, name)) <= TOL, f"state.{name}"
    names = ["fq", "fk", "v", "s0", "z0", "m0"][:len(grads)]
    for name, got, expected in zip(names, grads, ref_grads):
        assert rel_rms(got, expected) <= TOL, f"d{name}: {rel_rms(got, expected):.2e}"
    if not init:
        quadratic = naive_causal_momentum_attention(fq, fk, v, momentum=beta, step_size=gamma,
                                                    feature_map="identity", padding_mask=real)
        assert rel_rms(out, quadratic) <= TOL


def test_float64_through_the_interpreter(make_generator, monkeypatch):
    """fp64 keeps IEEE dots whatever exact fp32's are (bf16x6 splits fp32 values only)."""
    monkeypatch.setenv("MOMENTUM_TRITON_FP32_DOTS", "bf16x6")
    tri = triton_ops()
    gen = make_generator()
    lengths = torch.tensor([40, 23])
    fq, fk, v, real = make_inputs(gen, 2, 1, 40, 16, 16, lengths)
    out, state = tri.chunk_momentum_attention(fq, fk, v, momentum=0.9, step_size=0.6, eps=1e-6, chunk_size=16,
                                              initial_state=None, lengths=lengths, return_state=True)
    ref, ref_state = naive_recurrent_momentum_attention(fq, fk, v, momentum=0.9, step_size=0.6,
                                                        feature_map="identity", padding_mask=real)
    assert out.dtype == torch.float64 and state.m.dtype == torch.float64
    assert rel_rms(out, ref) <= 1e-12
    assert rel_rms(state.m, ref_state.m) <= 1e-12 and rel_rms(state.s, ref_state.s) <= 1e-12


def test_momentum_close_to_one_is_stable(make_generator):
    """β = 0.999: weights up to γ·1000 in the states; nothing is obtained by subtracting them."""
    tri = triton_ops()
    gen = make_generator()
    lengths = torch.tensor([150, 150])
    fq, fk, v, _ = make_inputs(gen, 2, 1, 150, 16, 16, lengths)
    q32, k32, v32 = (t.float().requires_grad_() for t in (fq, fk, v))
    out, _ = tri.chunk_momentum_attention(q32, k32, v32, momentum=0.999, step_size=1.0, eps=1e-6,
                                          chunk_size=16, initial_state=None, lengths=None, return_state=False)
    up = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    grads = torch.autograd.grad((out * up.float()).sum(), (q32, k32, v32))
    leaves = [t.clone().requires_grad_() for t in (fq, fk, v)]
    ref = naive_causal_momentum_attention(*leaves, momentum=0.999, step_size=1.0, feature_map="identity")
    ref_grads = torch.autograd.grad((ref * up).sum(), leaves)
    assert torch.isfinite(out).all()
    assert rel_rms(out, ref) <= TOL
    for got, expected in zip(grads, ref_grads):
        assert rel_rms(got, expected) <= TOL


@pytest.mark.parametrize("scan", SCANS)
@pytest.mark.parametrize("where", ["k", "v"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_real_token_does_not_reach_earlier_outputs(make_generator, monkeypatch, scan, where, bad):
    """An output at position i depends on positions ≤ i only, non-finite values included."""
    tri = triton_ops()
    use_scan(monkeypatch, scan)
    gen = make_generator()
    fq, fk, v, _ = make_inputs(gen, 1, 2, 20, 16, 16, torch.tensor([20]))
    fq, fk, v = fq.float(), fk.float(), v.float()
    poisoned = {"k": fk.clone(), "v": v.clone()}
    poisoned[where][:, :, 3] = bad
    out, _ = tri.chunk_momentum_attention(fq, poisoned["k"], poisoned["v"], momentum=0.6, step_size=1.0,
                                          eps=1e-6, chunk_size=16, initial_state=None, lengths=None,
                                          return_state=False)
    clean, _ = tri.chunk_momentum_attention(fq, fk, v, momentum=0.6, step_size=1.0, eps=1e-6, chunk_size=16,
                                            initial_state=None, lengths=None, return_state=False)
    assert torch.isfinite(out[:, :, :3]).all()
    torch.testing.assert_close(out[:, :, :3], clean[:, :, :3], rtol=0, atol=0)
    assert not torch.isfinite(out[:, :, 3]).all()


@pytest.mark.parametrize("beta,gamma", [(0.0, 1.0), (0.6, 0.6), (0.99, 2.0)])
def test_decoding_step_matches_eq12_and_the_torch_step(make_generator, beta, gamma):
    tri = triton_ops()
    gen = make_generator()
    B, H, Dk, Dv, steps = 3, 2, 16, 24, 5
    fq, fk, v, _ = make_inputs(gen, B, H, steps, Dk, Dv, torch.full((B,), steps))
    real = torch.rand(B, steps, generator=gen) < 0.7
    real[:, 0] = True
    state0 = random_state(gen, B, H, Dk, Dv)
    ref_out, ref_state = naive_recurrent_momentum_attention(fq, fk, v, state0, momentum=beta, step_size=gamma,
                                                            feature_map="identity", padding_mask=real)
    state = MomentumAttentionState(state0.s.float(), state0.z.float(), state0.m.float())
    torch_state = state
    for i in range(steps):
        args = (fq[:, :, i].float(), fk[:, :, i].float(), v[:, :, i].float())
        out, state = tri.fused_recurrent_step(*args, state, momentum=beta, step_size=gamma, eps=1e-6,
                                              real=real[:, i])
        torch_out, torch_state = torch_step(*args, torch_state, momentum=beta, step_size=gamma, eps=1e-6,
                                            real=real[:, i])
        assert out.dtype == torch.float32
        assert rel_rms(out, ref_out[:, :, i]) <= TOL
        torch.testing.assert_close(out, torch_out, rtol=1e-5, atol=1e-6)
        assert torch.all(out[~real[:, i]] == 0)
    for name in ("s", "z", "m"):
        assert rel_rms(getattr(state, name), getattr(ref_state, name)) <= TOL
        torch.testing.assert_close(getattr(state, name), getattr(torch_state, name), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("Dk", [200, 16])
def test_decoding_step_loops_over_key_blocks(make_generator, Dk):
    """The step kernel takes Dk in blocks of at most 64 rows (Dk = 200: three full blocks and a
    masked one; 16: one block), accumulating φ(q)ᵀs and φ(q)ᵀz over them; Dv = 72 gives two
    value programs, of which only the first writes z. Against the float64 eq. 12 token loop."""
    tri = triton_ops()
    gen = make_generator()
    B, H, Dv, steps = 2, 2, 72, 3
    fq, fk, v, _ = make_inputs(gen, B, H, steps, Dk, Dv, torch.full((B,), steps))
    real = torch.tensor([[True, True, True], [True, False, True]])
    state0 = random_state(gen, B, H, Dk, Dv)
    ref_out, ref_state = naive_recurrent_momentum_attention(fq, fk, v, state0, momentum=0.6, step_size=0.8,
                                                            feature_map="identity", padding_mask=real)
    state = MomentumAttentionState(state0.s.float(), state0.z.float(), state0.m.float())
    for i in range(steps):
        out, state = tri.fused_recurrent_step(fq[:, :, i].float(), fk[:, :, i].float(), v[:, :, i].float(),
                                              state, momentum=0.6, step_size=0.8, eps=1e-6, real=real[:, i])
        assert rel_rms(out, ref_out[:, :, i]) <= TOL
    for name in ("s", "z", "m"):
        assert rel_rms(getattr(state, name), getattr(ref_state, name)) <= TOL, name


def test_prefill_then_decode_equals_one_pass(make_generator):
    tri = triton_ops()
    gen = make_generator()
    fq, fk, v, _ = make_inputs(gen, 2, 2, 37, 16, 16, torch.tensor([37, 37]))
    fq, fk, v = fq.float(), fk.float(), v.float()
    kw = {"momentum": 0.9, "step_size": 0.6, "eps": 1e-6}
    full, _ = tri.chunk_momentum_attention(fq, fk, v, chunk_size=16, initial_state=None, lengths=None,
                                           return_state=False, **kw)
    out, state = tri.chunk_momentum_attention(fq[:, :, :33], fk[:, :, :33], v[:, :, :33], chunk_size=16,
                                              initial_state=None, lengths=None, return_state=True, **kw)
    outs = [out]
    for i in range(33, 37):
        step, state = tri.fused_recurrent_step(fq[:, :, i], fk[:, :, i], v[:, :, i], state, real=None, **kw)
        outs.append(step[:, :, None])
    torch.testing.assert_close(torch.cat(outs, dim=2), full, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_inputs_keep_their_dtype(make_generator, dtype):
    """Half in, half out; states in fp32; accuracy that of the input rounding. fp16 runs its own
    kernels here (fp16 dots, tf32-style state dots); the interpreter cannot run bf16 dots, so bf16
    is computed in fp32 here and its kernels are checked by tests/test_attention_gpu.py."""
    tri = triton_ops()
    gen = make_generator()
    fq, fk, v, _ = make_inputs(gen, 1, 2, 40, 16, 16, torch.tensor([40]))
    leaves = [t.to(dtype).requires_grad_() for t in (fq, fk, v)]
    out, state = tri.chunk_momentum_attention(*leaves, momentum=0.9, step_size=1.0, eps=1e-6, chunk_size=16,
                                              initial_state=None, lengths=None, return_state=True)
    grads = torch.autograd.grad(out.float().sum(), leaves)
    ref_leaves = [t.clone().requires_grad_() for t in (fq, fk, v)]
    ref = naive_causal_momentum_attention(*ref_leaves, momentum=0.9, feature_map="identity")
    ref_grads = torch.autograd.grad(ref.sum(), ref_leaves)
    assert out.dtype == dtype and state.s.dtype == torch.float32
    assert all(g.dtype == dtype for g in grads)
    assert rel_rms(out, ref) <= 2e-2
    for got, expected in zip(grads, ref_grads):
        assert rel_rms(got, expected) <= 5e-2


@pytest.mark.parametrize("scan", SCANS)
def test_compiles_without_graph_break(make_generator, monkeypatch, scan):
    """The registered triton_op traces under torch.compile(fullgraph=True), forward and backward
    (aot_eager on CPU: the kernels themselves still run through the interpreter); fused, in splits
    of one chunk, so that the op's fake output for the split states has their real size."""
    tri = triton_ops()
    use_scan(monkeypatch, scan)
    if scan == "fused":
        from plugins.attention.triton import chunk
        monkeypatch.setattr(chunk, "scan_splits", lambda rows, chunks, device: (chunks, 1))
    gen = make_generator()
    fq, fk, v, _ = make_inputs(gen, 1, 2, 20, 16, 16, torch.tensor([20]))
    leaves = [t.float().requires_grad_() for t in (fq, fk, v)]

    def loss(q, k, x):
        out, _ = tri.chunk_momentum_attention(q, k, x, momentum=0.6, step_size=1.0, eps=1e-6, chunk_size=16,
                                              initial_state=None, lengths=None, return_state=False)
        return (out * out).sum()

    torch._dynamo.reset()
    compiled = torch.compile(loss, backend="aot_eager", fullgraph=True)
    got = torch.autograd.grad(compiled(*leaves), leaves)
    expected = torch.autograd.grad(loss(*leaves), leaves)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b)


# The scan is chosen inside the registered ops (chunk.SCAN), which dynamo does not see: the chunked
# scan, the default, compiles in both layouts in a model (tests/test_hf_compile_training.py's
# test_triton_path_compiles_one_graph_for_every_length), the fused one packed here, and the split's
# states, whose number dynamo does see, in both layouts.
@pytest.mark.parametrize("layout,scan", [("packed", "fused"), ("padded", "fused-split"),
                                         ("packed", "fused-split")])
def test_dynamic_shapes_compile_whole_on_the_triton_path(make_generator, monkeypatch, scan, layout):
    """torch.compile(dynamic=True, fullgraph=True) over the public call with backend="triton": the
    registered op's fake outputs take the symbolic length, so lengths of 2, 2 and 5 chunks (and their
    padding or segments) share one graph, each equal to the eager call, forward and gradients.
    Fused in splits of two chunks, the split states' number follows the length: one more graph
    where the rows start to split (split.scan_splits' threshold), none after."""
    triton_ops()
    use_scan(monkeypatch, scan.partition("-")[0])
    if scan == "fused-split":
        import triton

        from plugins.attention.triton import chunk
        monkeypatch.setattr(chunk, "scan_splits", lambda rows, chunks, device: (triton.cdiv(chunks, 2), 2))
    from torch._dynamo.testing import CompileCounterWithBackend
    gen = make_generator()
    B = 2 if layout == "padded" else 1

    def attend(q, k, v, mask, cu):
        return momentum_attention(q, k, v, momentum=0.6, step_size=0.8, padding_mask=mask, cu_seqlens=cu,
                                  chunk_size=16, backend="triton")

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(attend, fullgraph=True, dynamic=True, backend=counter)
    graphs = []
    for N, cut in ((20, 7), (27, 20), (70, 33)):
        q, k, v = (torch.randn(B, 2, N, 16, generator=gen) for _ in range(3))
        mask = cu = None
        if layout == "padded":
            mask = torch.ones(B, N, dtype=torch.bool)
            mask[1, :cut] = False
        else:
            cu = torch.tensor([0, cut, N], dtype=torch.int32)
        ups = [torch.randn(B, 2, N, 16, generator=gen)]
        got, expected = (run_with_grads(lambda q, k, x, _, run=run: (run(q, k, x, mask, cu), None), (q, k, v),
                                        None, ups, torch.float32) for run in (compiled, attend))
        for a, b in zip((got[0], *got[2]), (expected[0], *expected[2])):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
        graphs.append(counter.frame_count)
    if scan == "fused-split":
        assert graphs[0] == graphs[1] < graphs[2], graphs
    else:
        assert graphs[0] == graphs[1] == graphs[2], graphs


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_eager_calls_equal_the_registered_ops(make_generator, layout):
    """Eager calls skip the custom-op dispatch (op._EagerChunk, op._EagerStep) and torch.compile
    traces the registered ops: both run the same launchers, so outputs, final states and every
    gradient (inputs, initial state, through the final state) are bit-identical."""
    from plugins.attention.triton import op
    gen = make_generator()
    B, N = (2, 40) if layout == "padded" else (1, 40)
    fq, fk, v, _ = make_inputs(gen, B, 2, N, 16, 24, torch.tensor([N, 23][:B]))
    lengths = torch.tensor([N, 23], dtype=torch.int32) if layout == "padded" else None
    cu = torch.tensor([0, 9, 9, 40], dtype=torch.int32) if layout == "packed" else None
    S = B if cu is None else 3
    state = random_state(gen, S, 2, 16, 24)
    ups = [torch.randn(t.shape, generator=gen) for t in (v, state.s, state.z, state.m)]

    def run(forward):
        leaves = [t.float().requires_grad_() for t in (fq, fk, v, state.s, state.z, state.m)]
        out, den, s, z, m, _splits = forward(*leaves, lengths, cu, 0.6, 0.8, 1e-6, 16)
        loss = sum((t * u).sum() for t, u in zip((out, s, z, m), ups))
        return (out, den, s, z, m) + torch.autograd.grad(loss, leaves)

    for got, expected in zip(run(op._EagerChunk.apply), run(op.chunk_momentum_attention_forward)):
        assert torch.equal(got, expected)

    q1, k1, v1 = (t[:, :, 0].float().requires_grad_() for t in (fq, fk, v))
    real = torch.tensor([1, 0][:B], dtype=torch.int8).repeat_interleave(2)      # (B·H,)

    def step(forward):
        leaves = [q1, k1, v1] + [t[:B].float().requires_grad_() for t in (state.s, state.z, state.m)]
        outputs = forward(*leaves, real, 0.6, 0.8, 1e-6)
        loss = sum((t * torch.ones_like(t)).sum() for t in outputs)
        return tuple(outputs) + torch.autograd.grad(loss, leaves)

    for got, expected in zip(step(op._EagerStep.apply), step(op.momentum_attention_step_forward)):
        assert torch.equal(got, expected)


@pytest.mark.parametrize("eager", [True, False])
def test_outputs_without_gradients_reach_the_backward_as_none(make_generator, monkeypatch, eager):
    """Autograd would otherwise fill zero tensors for the denominators, the split states and an
    unused final state (one memset launch each on a GPU), and the kernels would read the zero final
    state's gradient as a given one (HAS_FINAL_GRAD). Eager calls and the registered op alike."""
    from plugins.attention.triton import op
    gen = make_generator()
    fq, fk, v, _ = make_inputs(gen, 1, 2, 40, 16, 16, torch.tensor([40]))
    leaves = [t.float().requires_grad_() for t in (fq, fk, v)]
    finals = []

    def backward(*args):
        finals.append(args[10:13])                    # ds, dz, dm
        return op.chunk_backward.__wrapped__(*args)
    backward.__wrapped__ = op.chunk_backward
    monkeypatch.setattr(op, "chunk_backward", backward)
    forward = op._EagerChunk.apply if eager else op.chunk_momentum_attention_forward
    out, _den, s, _z, _m, _splits = forward(*leaves, None, None, None, None, None, 0.6, 1.0, 1e-6, 16)
    torch.autograd.grad(out.sum(), leaves, retain_graph=True)
    torch.autograd.grad(out.sum() + s.sum(), leaves)
    assert finals[0] == (None, None, None)
    assert all(g is not None for g in finals[1]), "a used final state's gradient, zeros for its unused parts"


@pytest.mark.parametrize("scan", SCANS)
@pytest.mark.parametrize("N", [256, 512])
def test_backward_keeps_no_per_position_states(make_generator, monkeypatch, scan, N):
    """What autograd keeps is O(N·D) (inputs, output, denominators), never the N·Dk·Dv per-position
    states nor the nchunks·Dk·Dv chunk states (the backward recomputes those, or, fused, never
    stores them). The fused kernels keep the states of the forward's splits (N = 512: 32 chunks
    of one row are split), at most one per program of two per SM: a bound that does not grow with N."""
    tri = triton_ops()
    use_scan(monkeypatch, scan)
    gen = make_generator()
    D = 16
    fq, fk, v, _ = make_inputs(gen, 1, 1, N, D, D, torch.tensor([N]))
    leaves = [t.float().requires_grad_() for t in (fq, fk, v)]
    saved = []

    def pack(t):
        saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        tri.chunk_momentum_attention(*leaves, momentum=0.6, step_size=1.0, eps=1e-6, chunk_size=16,
                                     initial_state=None, lengths=None, return_state=False)
    splits = (1 + 2 * 132) * (2 * D * D + D) if scan == "fused" else 0
    assert sum(saved) <= 4 * N * D + N + splits, f"saved {sum(saved)} elements for N·D = {N * D}"


def test_decoding_step_gradients_match_the_torch_step(make_generator):
    tri = triton_ops()
    gen = make_generator()
    B, H, Dk, Dv = 3, 2, 16, 24
    fq, fk, v, _ = make_inputs(gen, B, H, 3, Dk, Dv, torch.full((B,), 3))
    state0 = random_state(gen, B, H, Dk, Dv)
    real = torch.tensor([True, False, True])
    ups = [torch.randn(B, H, Dv, generator=gen, dtype=torch.float64)] + [
        torch.randn(t.shape, generator=gen, dtype=torch.float64) for t in (state0.s, state0.z, state0.m)]

    def run(step, dtype):
        leaves = [t.to(dtype).requires_grad_() for t in (fq, fk, v, state0.s, state0.z, state0.m)]
        state = MomentumAttentionState(*leaves[3:])
        loss = 0
        for i in range(3):                         # through a chain of steps
            out, state = step(leaves[0][:, :, i], leaves[1][:, :, i], leaves[2][:, :, i], state, momentum=0.9,
                              step_size=0.6, eps=1e-6, real=real if i == 1 else None)
            loss = loss + (out * ups[0].to(dtype)).sum()
        loss = loss + loss_of(out, state, [u.to(dtype) for u in ups]) - (out * ups[0].to(dtype)).sum()
        return torch.autograd.grad(loss, leaves)

    for got, expected in zip(run(tri.fused_recurrent_step, torch.float32), run(torch_step, torch.float64)):
        assert rel_rms(got, expected) <= TOL


def test_cpu_tensors_without_the_interpreter_are_refused(monkeypatch):
    tri = triton_ops()
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    x = torch.ones(1, 1, 4, 16)
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        tri.chunk_momentum_attention(x, x, x, momentum=0.5, step_size=1.0, eps=1e-6, chunk_size=16)
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        tri.fused_recurrent_step(x[:, :, 0], x[:, :, 0], x[:, :, 0], MomentumAttentionState.zeros(
            1, 1, 16, 16, dtype=torch.float32, device=x.device), momentum=0.5, step_size=1.0, eps=1e-6)


def test_mixed_dtypes_run_in_the_promoted_one_and_lengths_are_clamped(make_generator):
    """tl.dot takes one dtype: fp32 features with fp64 values run in fp64 (output in v's dtype);
    a length past N or below 0 reads nothing outside its row (as N and 0)."""
    tri = triton_ops()
    gen = make_generator()
    fq, fk, v, _ = make_inputs(gen, 2, 1, 20, 16, 16, torch.tensor([20, 20]))
    kw = {"momentum": 0.6, "step_size": 1.0, "eps": 1e-6, "chunk_size": 16, "initial_state": None,
          "return_state": True}
    out, state = tri.chunk_momentum_attention(fq.float(), fk.float(), v, lengths=torch.tensor([25, -3]), **kw)
    ref, ref_state = tri.chunk_momentum_attention(fq.float().double(), fk.float().double(), v,
                                                  lengths=torch.tensor([20, 0]), **kw)
    assert out.dtype == torch.float64 and state.s.dtype == torch.float64
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    torch.testing.assert_close(state.m, ref_state.m, rtol=0, atol=0)


def test_autotuning_keys_on_shape_buckets_that_compile_nothing():
    """The autotuner's choice is per power-of-two bucket of N and of B·H (capped), passed as plain
    int arguments that, like N and NT, are not specialised on: a new bucket re-times the kept
    configs without compiling (tests/triton_launch_check.py checks that on the compiled path)."""
    triton_ops()
    from plugins.attention.triton import chunk_kernels as K
    from plugins.attention.triton.utils import tuning_buckets
    assert tuning_buckets(1, 1) == {"N_BUCKET": 64, "BH_BUCKET": 1}
    assert tuning_buckets(150, 6) == {"N_BUCKET": 256, "BH_BUCKET": 8}
    assert tuning_buckets(256, 8) == {"N_BUCKET": 256, "BH_BUCKET": 8}
    assert tuning_buckets(10 ** 6, 10 ** 4) == {"N_BUCKET": 16384, "BH_BUCKET": 1024}
    for kernel in (K.fwd_h, K.fwd_o, K.bwd_dh, K.bwd_dv, K.bwd_dqk):
        assert {"N_BUCKET", "BH_BUCKET"} <= set(kernel.keys)
        jit = kernel.fn            # the interpreter keeps the jit options in `kwargs`
        unspecialised = getattr(jit, "do_not_specialize", None) or jit.kwargs["do_not_specialize"]
        assert {"N", "NT", "N_BUCKET", "BH_BUCKET"} <= set(unspecialised)


TF32_TOL = {"out": 5e-3, "state": 5e-3, "grad": 1e-2}       # plugins/attention/triton/utils.py


def truncated_to_tf32(x):
    """fp32 values with the 13 low mantissa bits cleared: tf32 as a tensor core that truncates
    its operands sees them (the worse of truncation and rounding)."""
    import numpy as np
    return (x.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)


def bf16x6_product(a, b, d):
    """d + a @ b of fp32 arrays as Triton's "bf16x6" computes it: each operand split into three
    bf16 parts (hi, mid, lo; each rounded to nearest), the five smaller products mid·mid, lo·hi,
    hi·lo, mid·hi, hi·mid summed first (exact bf16 products, fp32 sums; NaN among them dropped, as
    Triton drops it so that an infinite operand gives hi·hi's result), then hi·hi."""
    import numpy as np

    def parts(x):
        out, rest = [], x
        for _ in range(3):
            part = torch.from_numpy(rest).to(torch.bfloat16).float().numpy()
            out.append(part)
            rest = rest - part
        return out
    with np.errstate(invalid="ignore"):            # inf − inf in the parts of an infinite operand
        (a_hi, a_mid, a_lo), (b_hi, b_mid, b_lo) = parts(a), parts(b)
        small = np.zeros(d.shape, dtype=np.float32)
        for x, y in ((a_mid, b_mid), (a_lo, b_hi), (a_hi, b_lo), (a_mid, b_hi), (a_hi, b_mid)):
            small = small + np.matmul(x, y, dtype=np.float32)
    small = np.where(np.isnan(small), np.float32(0), small)
    return (np.matmul(a_hi, b_hi, dtype=np.float32) + small) + d


@pytest.fixture
def tf32_dots(monkeypatch):
    """The interpreter's tl.dot computes fp32 products exactly whatever precision it is asked
    for: here each dot records the precision asked, fp32 operands of a tf32 dot are truncated
    to tf32 first, and a bf16x6 dot (which the interpreter refuses: its precisions are
    "tf32", "tf32x3" and "ieee") is computed as the GPU does (bf16x6_product). Restores torch's
    float32 matmul precision afterwards."""
    import dataclasses

    import numpy as np
    from triton._C.libtriton import ir
    from triton.runtime import interpreter
    asked = []
    create_dot = interpreter.InterpreterBuilder.create_dot
    options = interpreter.interpreter_builder.options
    monkeypatch.setattr(interpreter.interpreter_builder, "options", dataclasses.replace(
        options, allowed_dot_input_precisions=(*options.allowed_dot_input_precisions, "bf16x6")))

    def tf32_create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        asked.append(input_precision)
        if input_precision == ir.INPUT_PRECISION.TF32 and a.data.dtype == np.float32:
            a = interpreter.TensorHandle(truncated_to_tf32(a.data), a.dtype)
            b = interpreter.TensorHandle(truncated_to_tf32(b.data), b.dtype)
        if input_precision == ir.INPUT_PRECISION.BF16x6:
            assert a.data.dtype == b.data.dtype == d.data.dtype == np.float32
            return interpreter.TensorHandle(bf16x6_product(a.data, b.data, d.data), d.dtype.scalar)
        return create_dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_dot", tf32_create_dot)
    precision = torch.get_float32_matmul_precision()
    yield asked, ir.INPUT_PRECISION
    torch.set_float32_matmul_precision(precision)


@pytest.mark.parametrize("precision", ["highest", "high", "medium", "highest, ieee", "highest, bf16x6"])
def test_float32_takes_tf32_dots_where_torch_allows_them(make_generator, tf32_dots, monkeypatch, precision):
    """torch.set_float32_matmul_precision("high" / "medium") gives fp32 inputs tf32 dots, read at
    each launch (forward and backward); "highest" (torch's default) exact fp32: by default
    ("auto") six bf16 products in the per-chunk kernels and fp32 FMA in the scans,
    MOMENTUM_TRITON_FP32_DOTS=ieee FMA in every kernel, =bf16x6 six bf16 products in every kernel.
    Against the float64 eq. 12 reference within the tolerances utils.py documents, with tf32 and
    bf16x6 emulated."""
    precision, _, dots = precision.partition(", ")
    if dots:
        monkeypatch.setenv("MOMENTUM_TRITON_FP32_DOTS", dots)
    tri = triton_ops()
    asked, kinds = tf32_dots
    gen = make_generator()
    B, H, N, Dk, Dv = 2, 1, 70, 32, 24
    lengths = torch.tensor([N, 41])
    fq, fk, v, real = make_inputs(gen, B, H, N, Dk, Dv, lengths)
    state0 = random_state(gen, B, H, Dk, Dv)
    ups = [torch.randn(B, H, N, Dv, generator=gen, dtype=torch.float64)] + [
        torch.randn(t.shape, generator=gen, dtype=torch.float64) for t in (state0.s, state0.z, state0.m)]

    def run(fn, dtype):
        leaves = [t.to(dtype).requires_grad_() for t in (fq, fk, v, state0.s, state0.z, state0.m)]
        out, state = fn(*leaves[:3], MomentumAttentionState(*leaves[3:]))
        return out, state, torch.autograd.grad(loss_of(out, state, [u.to(dtype) for u in ups]), leaves)

    ref_out, ref_state, ref_grads = run(lambda q, k, x, st: naive_recurrent_momentum_attention(
        q, k, x, st, momentum=0.9, step_size=0.8, feature_map="identity", padding_mask=real), torch.float64)
    torch.set_float32_matmul_precision(precision)
    out, state, grads = run(lambda q, k, x, st: tri.chunk_momentum_attention(
        q, k, x, momentum=0.9, step_size=0.8, eps=1e-6, chunk_size=32, initial_state=st, lengths=lengths,
        return_state=True), torch.float32)
    exact = precision == "highest"
    exact_dots = {"": {kinds.IEEE, kinds.BF16x6}, "ieee": {kinds.IEEE}, "bf16x6": {kinds.BF16x6}}[dots]
    assert set(asked) == (exact_dots if exact else {kinds.TF32})
    tol = {key: TOL for key in TF32_TOL} if exact else TF32_TOL
    assert rel_rms(out, ref_out) <= tol["out"]
    for name in ("s", "z", "m"):
        assert rel_rms(getattr(state, name), getattr(ref_state, name)) <= tol["state"], name
    for name, got, expected in zip(["fq", "fk", "v", "s0", "z0", "m0"], grads, ref_grads):
        assert rel_rms(got, expected) <= tol["grad"], f"d{name}: {rel_rms(got, expected):.2e}"


@pytest.mark.parametrize("value,message", [
    ("tf32x3", r"MOMENTUM_TRITON_FP32_DOTS must be one of \('auto', 'ieee', 'bf16x6'\), got 'tf32x3'"),
    ("bf16x6", r"MOMENTUM_TRITON_FP32_DOTS=bf16x6 needs a GPU: Triton's interpreter")])
def test_exact_fp32_dots_this_triton_cannot_run_are_refused_by_name(monkeypatch, value, message):
    tri = triton_ops()
    if value == "bf16x6" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("a GPU's Triton runs bf16x6 dots: the refusal is the interpreter's")
    monkeypatch.setenv("MOMENTUM_TRITON_FP32_DOTS", value)
    q = torch.rand(1, 1, 8, 16)
    with pytest.raises(ValueError, match=message):
        tri.chunk_momentum_attention(q, q, q, momentum=0.5, step_size=1.0, eps=1e-6, chunk_size=16)


def test_launches_past_cuda_grid_limits_are_refused_clearly():
    """batch·heads and the chunk count go on grid dimensions CUDA limits to 65,535."""
    triton_ops()
    from plugins.attention.triton.utils import check_grid
    check_grid(65535, 65535)
    with pytest.raises(ValueError, match="batch size × heads = 65536"):
        check_grid(65536)
    with pytest.raises(ValueError, match="65536 chunks"):
        check_grid(1, 65536)


@pytest.mark.parametrize("scan", SCANS)
@pytest.mark.parametrize("beta", [0.0, 0.6])
def test_non_finite_padding_is_a_masked_no_op(make_generator, monkeypatch, scan, beta):
    """Padded positions are never read: NaN there changes no output, state or gradient."""
    tri = triton_ops()
    use_scan(monkeypatch, scan)
    gen = make_generator()
    lengths = torch.tensor([20, 9, 0])
    fq, fk, v, real = make_inputs(gen, 3, 1, 20, 16, 16, lengths)
    pad = ~real[:, None, :, None]
    up = torch.randn(3, 1, 20, 16, generator=gen, dtype=torch.float64).float()

    def run(fill):
        leaves = [torch.where(pad, torch.full((), fill), t).float().requires_grad_() for t in (fq, fk, v)]
        out, state = tri.chunk_momentum_attention(*leaves, momentum=beta, step_size=1.0, eps=1e-6,
                                                  chunk_size=16, initial_state=None, lengths=lengths,
                                                  return_state=True)
        grads = torch.autograd.grad((out * up).sum() + state.s.sum() + state.m.sum(), leaves)
        return [out, state.s, state.z, state.m, *grads]

    poisoned = run(float("nan"))
    for got, clean in zip(poisoned, run(0.0)):
        torch.testing.assert_close(got, clean, rtol=0, atol=0)
    assert torch.all(poisoned[4][pad.expand(-1, -1, -1, 16)] == 0)


if importlib.util.find_spec("triton") is not None:
    import triton
    import triton.language as tl

    from plugins.attention.triton.utils import geometric

    @triton.jit
    def geometric_kernel(n_ptr, out_ptr, log_beta, inv, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(out_ptr + offs, geometric(tl.load(n_ptr + offs), log_beta, inv))


@pytest.mark.parametrize("beta", [0.5, 0.99, 0.999, 0.9999])
def test_geometric_coefficients_have_no_cancellation(beta):
    """(1 − β^n)/(1 − β) in fp32, in-kernel, to a few ulp of the float64 value for n = 1 … 4096
    (for β near 1 and small n, 1 − β^n is tiny: a plain 1 − exp(n log β) would lose it)."""
    triton_ops()
    n = torch.arange(1, 4097, dtype=torch.float32)
    out = torch.empty_like(n)
    geometric_kernel[(1,)](n, out, math.log(beta), 1.0 / (1.0 - beta), BLOCK=4096)
    exact = (1 - torch.tensor(beta, dtype=torch.float64) ** n.double()) / (1 - beta)
    assert ((out.double() - exact).abs() / exact).max().item() <= 2e-6


COMPILE_FOR_SM90 = r'''
import sys
import time

from triton.backends import backends

if "nvidia" not in backends:
    sys.exit(77)
import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.autotuner import Autotuner

from plugins.attention.triton import chunk_kernels as K
from plugins.attention.triton import fused_chunk_kernels as FK
from plugins.attention.triton import fused_recurrent as F
from plugins.attention.triton import split as S
from plugins.attention.triton.utils import BF16X6, prune_chunk_k, prune_chunk_v, prune_scan, tuning_configs

BF16X6 = BF16X6.value      # exact fp32's dots as six bf16 products (Triton's "bf16x6")

INPUTS = {"q", "k", "v", "o", "do", "dq", "dk", "dv"}
TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def compile_for_sm90(kernel, dtype, consts, num_warps=4):
    """Compile to a cubin for an H100 (no GPU needed), with the pointer types the launchers pass."""
    fn = kernel.fn if isinstance(kernel, Autotuner) else kernel
    acc = "fp64" if dtype == "fp64" else "fp32"
    types = {}
    for name in fn.arg_names:
        if name in consts:
            types[name] = "constexpr"
        elif name in ("N", "H", "NT", "CPS", "G", "N_BUCKET", "BH_BUCKET", "FLAG_ROWS"):
            types[name] = "i32"
        else:
            element = {"lengths": "i32", "real": "i8", "cu_seqlens": "i32", "chunk_offsets": "i32",
                       "chunk_indices": "i32"}.get(name, dtype if name in INPUTS else acc)
            if name in ("h_s", "h_m", "dh_s", "dh_m") and dtype == "bf16":
                element = "bf16"
            types[name] = "*" + element
    triton.compile(ASTSource(fn, types, constexprs=consts), target=GPUTarget("cuda", 90, 32),
                   options={"num_warps": num_warps, "num_stages": 2})


DK, DV, BT = 32, 24, 32
# (input dtype, momentum, exact dots, packed sequences) at a Dv that is no power of two (masked
# tiles). fp16, fp32 with tf32 dots and one state run through the real launcher at D = 64 / 128 in
# tests/triton_launch_check.py (test_triton_launch.py), which compiles every kept config.
for dtype, momentum, ieee, varlen in (("bf16", True, False, False), ("fp32", True, True, False),
                                      ("fp32", True, BF16X6, False), ("bf16", True, False, True)):
    flags = {"LOW": dtype == "bf16", "IEEE": ieee}
    meta = dict(DK=DK, DV=DV, BT=BT, MOMENTUM=momentum, HAS_LEN=not varlen, IS_VARLEN=varlen, **flags)
    for kernel, prune, extra in ((K.fwd_h, prune_scan, {"USE_INIT": True, "STORE_H": True}),
                                 (K.fwd_o, prune_chunk_v, {"SPLIT": True}),
                                 (K.bwd_dh, prune_scan, {"HAS_FINAL_GRAD": True, "STORE_H": True}),
                                 (K.bwd_dv, prune_chunk_v, {"SPLIT": True}),
                                 (K.bwd_dqk, prune_chunk_k, {"SPLIT": True})):
        first = {"q": torch.empty(0, dtype=TORCH_DTYPES[dtype])}     # the pruning reads its dtype
        config = prune(tuning_configs(), first, **meta)[-1]
        start = time.time()
        compile_for_sm90(kernel, dtype, {**meta, **extra, **config.kwargs}, config.num_warps)
        print(dtype, momentum, ieee, varlen, kernel.fn.__name__, config, f"{time.time() - start:.1f}s")
# the fused kernels (8 warps, chunks of 32; bf16 padded at D 64 runs in tests/triton_launch_check.py) and
# the scans from zero before them
for dtype, momentum, ieee, varlen in (("bf16", True, False, True), ("bf16", False, False, False),
                                      ("fp32", True, True, False), ("fp32", True, BF16X6, False)):
    meta = dict(DK=DK, DV=DV, BT=32, BK=32, BV=32, SPLIT_V=False, MOMENTUM=momentum, HAS_LEN=not varlen,
                IS_VARLEN=varlen, LOW=dtype == "bf16", IEEE=ieee)
    for kernel, extra in ((FK.fused_fwd, {"USE_INIT": True}), (FK.fused_bwd_dq, {"USE_INIT": True}),
                          (FK.fused_bwd_dkv, {"HAS_FINAL_GRAD": True, "DDEN_READY": varlen})):
        start = time.time()
        compile_for_sm90(kernel, dtype, {**meta, **extra}, 8)
        print(dtype, momentum, ieee, varlen, kernel.fn.__name__, f"{time.time() - start:.1f}s")
scan_meta = dict(DK=DK, DV=DV, BT=32, BK=32, BV=32, MOMENTUM=True, HAS_LEN=True, IS_VARLEN=False, LOW=True,
                 IEEE=False)
compile_for_sm90(K.fwd_h, "bf16", dict(**scan_meta, USE_INIT=False, STORE_H=False))
compile_for_sm90(K.bwd_dh, "bf16", dict(**scan_meta, HAS_FINAL_GRAD=False, STORE_H=False))
for reverse in (False, True):
    merge_meta = dict(DK=DK, DV=DV, BT=BT, BK=32, BV=32, MOMENTUM=True, HAS_LEN=True, IS_VARLEN=False)
    compile_for_sm90(S.merge_splits, "bf16", dict(**merge_meta, USE_INIT=True, REVERSE=reverse))
for phi in (0, 1):
    compile_for_sm90(F.step_kernel, "bf16", dict(DK=DK, DV=DV, BK=32, BV=32, HAS_REAL=True, PHI=phi))
'''


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("d", [16, 24, 48, 64, 128])
def test_chunk_pruning_never_keeps_a_config_that_faulted_on_a_gpu(d, dtype, monkeypatch):
    """The chunk kernels' pruner drops utils.CHUNK_FAULTS (a tile config that faulted on an H100)
    and still keeps a config for every head size; at D 64 the unfiltered pruner would keep it."""
    from plugins.attention.triton import utils
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)    # the GPU's config list, not the interpreter's
    first = {"q": torch.empty(0, dtype=dtype)}
    meta = dict(DK=d, DV=d, IEEE=False)
    kept = {(c.kwargs["BK"], c.kwargs["BV"], c.num_warps)
            for c in utils.prune_chunk(utils.tuning_configs(), first, **meta)}
    assert kept and not kept & utils.CHUNK_FAULTS
    if d == 64:
        unfiltered = utils._prune(utils.tuning_configs(), first, meta, 8, ((32, 32, 4),))
        assert utils.CHUNK_FAULTS <= {(c.kwargs["BK"], c.kwargs["BV"], c.num_warps) for c in unfiltered}


@pytest.mark.parametrize("d", [16, 24, 48, 64, 128])
def test_exact_fp32_keeps_a_tile_over_the_whole_head_for_the_chunk_kernels(d, monkeypatch):
    """Exact fp32 FMA dots: fwd_o and bwd_dv also keep one V tile over the whole head, bwd_dqk one
    K tile (BK or BV 16 on the other side, 8 warps), at heads of at most 64; not for bf16x6 or tf32
    dots, 16-bit or fp64 inputs, wider heads, or under the interpreter (one config there)."""
    from plugins.attention.triton import utils
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)

    def kept(prune, dtype=torch.float32, ieee=True):
        first = {"q": torch.empty(0, dtype=dtype)}
        return {(c.kwargs["BK"], c.kwargs["BV"], c.num_warps)
                for c in prune(utils.tuning_configs(), first, DK=d, DV=d, IEEE=ieee)}
    base = kept(utils.prune_chunk)
    whole = utils.block(d)
    wanted = {"fwd_o": (16, whole, 8), "bwd_dv": (16, whole, 8), "bwd_dqk": (whole, 16, 8)}
    for name, tile in wanted.items():
        assert kept(utils.CHUNK_PRUNERS[name]) == (base | {tile} if d <= 64 else base), name
        assert (kept(utils.CHUNK_PRUNERS[name], ieee=utils.BF16X6.value)
                == kept(utils.prune_chunk, ieee=utils.BF16X6.value)), name
        for dtype, ieee in ((torch.float32, False), (torch.bfloat16, False), (torch.float64, True)):
            assert tile not in kept(utils.CHUNK_PRUNERS[name], dtype, ieee) or tile in base, (name, dtype)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert len(utils.CHUNK_PRUNERS["fwd_o"](utils.tuning_configs(), {"q": torch.empty(0)},
                                            DK=d, DV=d, IEEE=True)) == 1


def test_kernels_compile_for_an_h100():
    """The interpreter accepts what the compiler may refuse (dot shapes and dtypes, constexpr
    rules, layouts): every kernel is compiled to an sm_90 cubin, without a GPU, at Dk 32 and Dv 24,
    for bf16 (padded and packed) and exact fp32 (FMA dots, and bf16x6), with the launch settings
    the autotuner would keep; the fused kernels for bf16 (packed, and one state) and exact fp32
    (both ways)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    triton_ops()
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", COMPILE_FOR_SM90], env=env, cwd=root, capture_output=True,
                          text=True, timeout=600)
    if done.returncode == 77:
        pytest.skip("this triton has no NVIDIA backend")
    assert done.returncode == 0, done.stderr[-4000:]


def _package_imports(path):
    """(imported module of plugins.attention.triton, whether the import is inside a function) of
    every `from .x import …` / `from . import x` in one file of the package."""
    import ast
    tree = ast.parse(path.read_text())
    inner = {id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) for n in ast.walk(f)}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            names = [node.module] if node.module else [alias.name for alias in node.names]
            for name in names:
                yield name.split(".")[0], id(node) in inner


def test_kernel_modules_load_on_first_use_only():
    """Only the package's __init__ imports inside a function (its kernel modules on first use, so
    that importing the package never fails), and only entry_points; the other modules import at
    the top, where tests/test_architecture.py sees that they import one way."""
    from pathlib import Path
    package = Path(__file__).resolve().parents[1] / "plugins" / "attention" / "triton"
    for path in sorted(package.glob("*.py")):
        imports = list(_package_imports(path))
        if path.stem == "__init__":
            assert {name for name, _ in imports} == {"entry_points"}
        else:
            assert not any(inner for _, inner in imports), f"{path.name} imports inside a function"

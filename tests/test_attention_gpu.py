"""Triton kernels of momentum attention on a CUDA GPU (marker `gpu`; skipped with a reason where
there is none): bf16 / fp16 / fp32 on real shapes up to T = 65,536 against the PyTorch chunked
path (float64 where it fits), finite gradients, padding, states, decoding and torch.compile."""
import importlib.util
import os

import pytest
import torch
from helpers.triton_attention import SCANS, use_scan

from plugins.attention import momentum_attention
from plugins.attention.chunk import chunk_causal_momentum_attention
from plugins.attention.recurrent import fused_recurrent_step
from plugins.attention.rule import momentum_rule
from plugins.attention.state import MomentumAttentionState

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")]

# relative RMS against float64: the input rounding of each dtype dominates
TOL = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 3e-2}


def torch_step(fq, fk, v, state, *, momentum, step_size, **kw):
    """The PyTorch step with the Triton step's arguments (β, γ instead of the rule object)."""
    return fused_recurrent_step(fq, fk, v, state, rule=momentum_rule(momentum, step_size), **kw)


def rel_rms(got, expected):
    """0 for two all-zero tensors (a gradient that is exactly 0, as m₀'s at β = 0)."""
    got, expected = got.detach().double(), expected.detach().double()
    return ((got - expected).pow(2).mean().sqrt() / expected.pow(2).mean().sqrt().clamp(min=1e-30)).item()


def inputs(seed, B, H, N, D, Dv=None, device="cuda"):
    gen = torch.Generator(device=device).manual_seed(seed)
    fq = torch.nn.functional.elu(torch.randn(B, H, N, D, generator=gen, device=device)) + 1
    fk = torch.nn.functional.elu(torch.randn(B, H, N, D, generator=gen, device=device)) + 1
    v = torch.randn(B, H, N, Dv or D, generator=gen, device=device)
    return fq, fk, v


def triton_attention(fq, fk, v, **kw):
    from plugins.attention.triton import chunk_momentum_attention
    kw = {"momentum": 0.9, "step_size": 1.0, "eps": 1e-6, "chunk_size": 64, "initial_state": None,
          "lengths": None, "return_state": False, **kw}
    return chunk_momentum_attention(fq, fk, v, **kw)


def torch_attention(fq, fk, v, **kw):
    kw = {"momentum": 0.9, "step_size": 1.0, "eps": 1e-6, "chunk_size": 64, "initial_state": None,
          "lengths": None, "return_state": False, **kw}
    rule = momentum_rule(kw.pop("momentum"), kw.pop("step_size"))
    return chunk_causal_momentum_attention(fq, fk, v, rule=rule, **kw)


def value_and_grads(fn, tensors, dtype, upstream):
    leaves = [t.to(dtype).requires_grad_() for t in tensors]
    out, _ = fn(*leaves)
    grads = torch.autograd.grad((out.float() * upstream).sum(), leaves)
    return out, grads


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("momentum", [0.0, 0.9, 0.999])
@pytest.mark.parametrize("shape", [(4, 16, 1024, 64, 64), (2, 8, 4096, 128, 128), (2, 4, 777, 32, 24),
                                   (3, 2, 300, 16, 16)])
def test_triton_matches_float64_torch_path(shape, momentum, dtype):
    """Head sizes 16 … 128 (tiles of 16, 32, 64 and masked columns: Dv = 24), N not a multiple of
    the chunk."""
    B, H, N, D, Dv = shape
    tensors = inputs(N + D, B, H, N, D, Dv)
    upstream = torch.randn(B, H, N, Dv, device="cuda")
    ref, ref_grads = value_and_grads(lambda *t: torch_attention(*t, momentum=momentum), tensors,
                                     torch.float64, upstream.double())
    out, grads = value_and_grads(lambda *t: triton_attention(*t, momentum=momentum), tensors, dtype, upstream)
    assert out.dtype == dtype
    assert rel_rms(out, ref) <= TOL[dtype]
    for got, expected in zip(grads, ref_grads):
        assert torch.isfinite(got).all()
        assert rel_rms(got, expected) <= 3 * TOL[dtype]


@pytest.mark.parametrize("shape, dtype", [((4, 16, 1024, 64, 64), torch.float32),
                                          ((4, 16, 1024, 64, 64), torch.bfloat16),
                                          ((2, 4, 777, 32, 24), torch.float16),
                                          ((1, 4, 20000, 64, 64), torch.bfloat16)])
def test_fused_kernels_match_float64_torch_path(shape, dtype, monkeypatch):
    """The fused kernels (chunk.SCAN = "fused", head sizes up to 64): full rows, a length that is no
    multiple of their chunk with masked value columns, and few long rows, where the launcher splits
    the scans and the kernels chain the splits (in fp32 there:
    test_split_scans_keep_long_packed_segments_separate). Each dtype and shape once: gpu-check's
    tests part starts every test in its budget."""
    use_scan(monkeypatch, "fused")
    B, H, N, D, Dv = shape
    tensors = inputs(N + D + 1, B, H, N, D, Dv)
    upstream = torch.randn(B, H, N, Dv, device="cuda")
    ref, ref_grads = value_and_grads(lambda *t: torch_attention(*t, momentum=0.9), tensors, torch.float64,
                                     upstream.double())
    out, grads = value_and_grads(lambda *t: triton_attention(*t, momentum=0.9), tensors, dtype, upstream)
    assert rel_rms(out, ref) <= TOL[dtype]
    for got, expected in zip(grads, ref_grads):
        assert torch.isfinite(got).all()
        assert rel_rms(got, expected) <= 3 * TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_long_sequence_is_finite_and_close_to_fp32(dtype):
    B, H, N, D = 1, 4, 65536, 64
    tensors = inputs(7, B, H, N, D)
    upstream = torch.randn(B, H, N, D, device="cuda")
    ref, ref_grads = value_and_grads(lambda *t: torch_attention(*t, momentum=0.99), tensors, torch.float32,
                                     upstream)
    out, grads = value_and_grads(lambda *t: triton_attention(*t, momentum=0.99), tensors, dtype, upstream)
    assert torch.isfinite(out).all() and all(torch.isfinite(g).all() for g in grads)
    assert rel_rms(out, ref) <= TOL[dtype]
    for got, expected in zip(grads, ref_grads):
        assert rel_rms(got, expected) <= 3 * TOL[dtype]


@pytest.mark.parametrize("scan", SCANS)
def test_padding_and_states_match_torch_path(scan, monkeypatch):
    use_scan(monkeypatch, scan)
    B, H, N, D = 3, 4, 1000, 64
    fq, fk, v = (t.double() for t in inputs(3, B, H, N, D))
    lengths = torch.tensor([1000, 517, 0], device="cuda")
    real = (torch.arange(N, device="cuda") < lengths[:, None])[:, None, :, None]
    fk, v = fk * real, v * real
    gen = torch.Generator(device="cuda").manual_seed(5)
    state = MomentumAttentionState(*(torch.randn(*s, generator=gen, device="cuda", dtype=torch.float64)
                                     for s in ((B, H, D, D), (B, H, D), (B, H, D, D))))
    kw = {"momentum": 0.9, "initial_state": state, "lengths": lengths, "return_state": True}
    ref, ref_state = torch_attention(fq, fk, v, **kw)
    out, got_state = triton_attention(fq.float(), fk.float(), v.float(), **kw)
    assert torch.all(out[~real.expand_as(out)] == 0)
    assert rel_rms(out * real, ref * real) <= 1e-4
    for name in ("s", "z", "m"):
        assert rel_rms(getattr(got_state, name), getattr(ref_state, name)) <= 1e-4


@pytest.mark.parametrize("scan", SCANS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_split_scans_keep_long_packed_segments_separate(dtype, scan, monkeypatch):
    """One packed row of segments of 5000, 0, 6001 and 129 tokens, H 2, the state scans forced into
    splits of 8 chunks (22 per row, partial splits at the segments' ends; split.scan_splits picks
    other counts), each
    segment from its own initial state: outputs, final states and gradients as each segment run
    alone through the PyTorch path in float64."""
    from plugins.attention.triton import chunk
    use_scan(monkeypatch, scan)
    monkeypatch.setattr(chunk, "scan_splits", lambda rows, chunks, device: (-(-chunks // 8), 8))
    lengths, H, D = [5000, 0, 6001, 129], 2, 64
    cu = torch.tensor([0] + lengths, device="cuda").cumsum(0)
    T = int(cu[-1])
    fq, fk, v = inputs(23, 1, H, T, D)
    gen = torch.Generator(device="cuda").manual_seed(29)
    state0 = [torch.randn(len(lengths), H, D, D, generator=gen, device="cuda"),
              torch.rand(len(lengths), H, D, generator=gen, device="cuda") * 3,
              torch.randn(len(lengths), H, D, D, generator=gen, device="cuda")]
    ups = [torch.randn(1, H, T, D, generator=gen, device="cuda")] + [torch.randn_like(t) for t in state0]

    def run(fn, precision):
        leaves = [t.to(precision).requires_grad_() for t in (fq, fk, v, *state0)]
        out, state = fn(*leaves)
        loss = (out.double() * ups[0]).sum() + sum((getattr(state, name).double() * up).sum()
                                                   for name, up in zip("szm", ups[1:]))
        return [out, state.s, state.z, state.m], torch.autograd.grad(loss, leaves)

    def alone(q, k, x, s0, z0, m0):
        outs, states = [], []
        for i in range(len(lengths)):
            a, b = int(cu[i]), int(cu[i + 1])
            init = MomentumAttentionState(s0[i:i + 1], z0[i:i + 1], m0[i:i + 1])
            if a == b:                                  # an empty segment keeps its initial state
                outs.append(q[:, :, a:b] * 0)
                states.append(init)
                continue
            out, st = torch_attention(q[:, :, a:b], k[:, :, a:b], x[:, :, a:b], initial_state=init,
                                      return_state=True)
            outs.append(out)
            states.append(st)
        return torch.cat(outs, 2), MomentumAttentionState(*(torch.cat([getattr(st, n) for st in states])
                                                            for n in ("s", "z", "m")))

    ref, ref_grads = run(alone, torch.float64)
    got, grads = run(lambda q, k, x, s0, z0, m0: triton_attention(
        q, k, x, initial_state=MomentumAttentionState(s0.float(), z0.float(), m0.float()),
        cu_seqlens=cu.to(torch.int32), return_state=True), dtype)
    for name, a, b in zip(["out", "s", "z", "m"], got, ref):
        assert rel_rms(a, b) <= TOL[dtype], name
    for name, a, b in zip(["fq", "fk", "v", "s0", "z0", "m0"], grads, ref_grads):
        assert torch.isfinite(a).all() and rel_rms(a, b) <= 3 * TOL[dtype], f"d{name}"


# its warm-up compiles the chunked kernels, the feature marks' and the decoding step's, and tunes
# three shapes: 70 s on an H200 (2026-11-28), past gpu-check's 60 s per test
@pytest.mark.timeout(150)
@pytest.mark.parametrize("scan", SCANS)
def test_the_trusted_path_never_waits_for_the_device(scan, monkeypatch):
    """No synchronizing CUDA call (a read back, a blocking copy) in what a model's layers run, after
    one warm-up call (the autotuner's benchmarks synchronize): the Triton entry's forward +
    backward with padding and states, in one pass and with split scans; `attend` with a padded
    batch's Segments; `attend_step` with and without gradients. torch.cuda's sync debug mode
    raises on any; a wait would put the host's time and the device's end to end."""
    from plugins.attention import AttentionSpec, attend, attend_step
    from plugins.packing import Segments
    use_scan(monkeypatch, scan)
    spec = AttentionSpec(momentum=0.6, backend="triton")

    def chunked(B, H, N):
        """The call, its inputs made here (a tensor from a list is a blocking copy)."""
        fq, fk, v = (t.bfloat16().requires_grad_() for t in inputs(5, B, H, N, 64))
        lengths = torch.tensor([N, N // 3][:B], device="cuda")
        state = MomentumAttentionState.zeros(B, H, 64, 64, dtype=torch.float32, device="cuda")

        def call():
            out, final = triton_attention(fq, fk, v, initial_state=state, lengths=lengths, return_state=True)
            torch.autograd.grad(out.float().sum() + final.s.sum(), (fq, fk, v))
        return call

    mask = torch.ones(2, 300, dtype=torch.bool, device="cuda")
    mask[1, :40] = False
    segments = Segments.from_padding_mask(mask, 2, 300)
    q, k, v = (torch.randn(2, 4, 300, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    q1, k1, v1 = (t[:, :, :1].detach() for t in (q, k, v))
    state = MomentumAttentionState.zeros(2, 4, 64, 64, dtype=torch.float32, device="cuda")

    def layer_calls():
        torch.autograd.grad(attend(q, k, v, spec, segments=segments).float().sum(), (q, k, v))
        with torch.no_grad():
            attend_step(q1, k1, v1, state, spec)
        grad_q = q1.clone().requires_grad_()
        out, _ = attend_step(grad_q, k1, v1, state, spec)
        torch.autograd.grad(out.float().sum(), grad_q)

    calls = [chunked(2, 4, 300), chunked(1, 2, 8192), layer_calls]
    for call in calls:
        call()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for call in calls:
            call()
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decoding_step_matches_torch_step(dtype):
    B, H, D = 8, 16, 64
    from plugins.attention.triton import fused_recurrent_step
    fq, fk, v = inputs(11, B, H, 5, D)
    state = MomentumAttentionState.zeros(B, H, D, D, dtype=torch.float32, device="cuda")
    ref_state = state
    real = torch.tensor([True, False] * (B // 2), device="cuda")
    for i in range(5):
        args = (fq[:, :, i], fk[:, :, i], v[:, :, i])
        out, state = fused_recurrent_step(*(t.to(dtype) for t in args), state, momentum=0.9, step_size=1.0,
                                          eps=1e-6, real=real)
        ref, ref_state = torch_step(*args, ref_state, momentum=0.9, step_size=1.0, eps=1e-6, real=real)
        assert out.dtype == dtype
        assert rel_rms(out, ref) <= TOL[dtype]
    assert rel_rms(state.s, ref_state.s) <= TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decoding_step_from_raw_inputs_at_a_head_below_its_tile(dtype):
    """The step a decoder layer runs without gradients (elu + 1 and the marks inside the kernel) at
    Dk 48, Dv 40 (tiles of 64 lanes): prefill + steps equal the batch call, padded rows included."""
    from plugins.attention import momentum_attention_step
    gen = torch.Generator(device="cuda").manual_seed(17)
    q, k, v = (torch.randn(4, 8, 9, d, generator=gen, device="cuda").to(dtype) for d in (48, 48, 40))
    mask = torch.ones(4, 9, dtype=torch.bool, device="cuda")
    mask[1, 6:] = False
    kw = dict(momentum=0.9, step_size=0.7, backend="triton")
    with torch.no_grad():
        whole = momentum_attention(q.double(), k.double(), v.double(), padding_mask=mask, backend="torch",
                                   momentum=0.9, step_size=0.7)
        out, state = momentum_attention(q[:, :, :5], k[:, :, :5], v[:, :, :5], padding_mask=mask[:, :5],
                                        return_state=True, **kw)
        outs = [out]
        for t in range(5, 9):
            out, state = momentum_attention_step(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], state,
                                                 padding_mask=mask[:, t:t + 1], **kw)
            outs.append(out)
    assert rel_rms(torch.cat(outs, 2), whole) <= TOL[dtype]


def test_compile_fullgraph_with_inductor():
    fq, fk, v = (t.bfloat16().requires_grad_() for t in inputs(13, 2, 4, 512, 64))

    def loss(q, k, x):
        out, _ = triton_attention(torch.relu(q) + 1e-3, k, x)
        return out.float().pow(2).sum()

    torch._dynamo.reset()
    compiled = torch.compile(loss, fullgraph=True)
    got = torch.autograd.grad(compiled(fq, fk, v), (fq, fk, v))
    expected = torch.autograd.grad(loss(fq, fk, v), (fq, fk, v))
    for a, b in zip(got, expected):
        assert rel_rms(a, b) <= 1e-3


def test_float64_on_gpu_matches_the_torch_path():
    """fp64 runs through the kernels too (exact dots on the CUDA cores; slow, for checking)."""
    fq, fk, v = (t.double() for t in inputs(17, 2, 2, 200, 32))
    lengths = torch.tensor([200, 77], device="cuda")
    real = (torch.arange(200, device="cuda") < lengths[:, None])[:, None, :, None]
    fk, v = fk * real, v * real                       # the torch path wants padded keys zeroed
    kw = {"lengths": lengths, "return_state": True}
    out, state = triton_attention(fq, fk, v, **kw)
    ref, ref_state = torch_attention(fq, fk, v, **kw)
    assert out.dtype == torch.float64
    assert rel_rms(out * real, ref * real) <= 1e-12
    assert rel_rms(state.s, ref_state.s) <= 1e-12 and rel_rms(state.m, ref_state.m) <= 1e-12


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_tensors_on_a_second_device_while_the_first_is_current():
    """Launches follow the tensors' device, not the current one (a model on cuda:1)."""
    torch.cuda.set_device(0)
    tensors = inputs(19, 2, 4, 300, 64)
    ref, ref_grads = value_and_grads(triton_attention, tensors, torch.bfloat16,
                                     torch.ones(2, 4, 300, 64, device="cuda"))
    moved = [t.to("cuda:1") for t in tensors]
    out, grads = value_and_grads(triton_attention, moved, torch.bfloat16,
                                 torch.ones(2, 4, 300, 64, device="cuda:1"))
    assert out.device == torch.device("cuda:1")
    torch.testing.assert_close(out.cpu(), ref.cpu(), rtol=0, atol=0)
    for got, expected in zip(grads, ref_grads):
        torch.testing.assert_close(got.cpu(), expected.cpu(), rtol=0, atol=0)


# bf16 kernels against float64 on the same bf16 values, relative RMS (see the test's docstring)
BF16_TOL = {"out": 1e-2, "state": 1e-2, "grad": 3e-2}
# fp32 with tf32 dots (torch.set_float32_matmul_precision("high")): plugins/attention/triton/utils.py
TF32_TOL = {"out": 5e-3, "state": 5e-3, "grad": 1e-2}


def same_inputs_case(seed, N, dtype, B=2, H=4, Dk=64, Dv=48):
    """Positive features, values, a padding mask (the second row ends at N // 2 + 3, past a chunk
    boundary for N ≥ 128), an initial state and upstream gradients, on the GPU, with q, k, v
    rounded to `dtype` once: the kernels and the float64 reference see the same values."""
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device="cuda", dtype=torch.float64)

    fq = (torch.nn.functional.elu(randn(B, H, N, Dk)) + 1).to(dtype)
    fk = (torch.nn.functional.elu(randn(B, H, N, Dk)) + 1).to(dtype)
    v = randn(B, H, N, Dv).to(dtype)
    mask = torch.arange(N, device="cuda")[None, :] < torch.tensor([N, N // 2 + 3], device="cuda")[:, None]
    state = [randn(B, H, Dk, Dv).float(), (torch.rand(B, H, Dk, generator=gen, device="cuda",
                                                       dtype=torch.float64) * 3).float(),
             randn(B, H, Dk, Dv).float()]
    ups = [randn(B, H, N, Dv), randn(B, H, Dk, Dv), randn(B, H, Dk), randn(B, H, Dk, Dv)]
    return (fq, fk, v), mask, state, ups


def attention_with_state(inputs, mask, state, ups, momentum, backend, dtype, state_dtype):
    """Output, final state and the gradients of q, k, v, s₀, z₀, m₀ through the public API."""
    leaves = [t.to(dtype).requires_grad_() for t in inputs] + [t.to(state_dtype).requires_grad_()
                                                               for t in state]
    out, final = momentum_attention(*leaves[:3], momentum=momentum, step_size=0.8, feature_map="identity",
                                    padding_mask=mask, initial_state=MomentumAttentionState(*leaves[3:]),
                                    return_state=True, backend=backend)
    parts = (out, final.s, final.z, final.m)
    loss = sum((part.double() * up).sum() for part, up in zip(parts, ups))
    return out, final, torch.autograd.grad(loss, leaves)


def check_against_float64(inputs, mask, state, ups, momentum, dtype, tol):
    ref_out, ref_state, ref_grads = attention_with_state(inputs, mask, state, ups, momentum, "torch",
                                                         torch.float64, torch.float64)
    out, final, grads = attention_with_state(inputs, mask, state, ups, momentum, "triton", dtype,
                                             torch.float32)
    assert out.dtype == dtype and final.s.dtype == torch.float32
    assert torch.all(out[~mask[:, None, :, None].expand_as(out)] == 0), "padded outputs must be 0"
    assert rel_rms(out, ref_out) <= tol["out"], f"out: {rel_rms(out, ref_out):.2e}"
    for name in ("s", "z", "m"):
        error = rel_rms(getattr(final, name), getattr(ref_state, name))
        assert error <= tol["state"], f"state.{name}: {error:.2e}"
    for name, got, expected in zip(["q", "k", "v", "s0", "z0", "m0"], grads, ref_grads):
        assert torch.isfinite(got).all(), f"d{name}"
        assert rel_rms(got, expected) <= tol["grad"], f"d{name}: {rel_rms(got, expected):.2e}"


# the chunked kernels at each length and momentum; the fused ones at one momentum per length (the
# tests part of gpu-check starts every test in its budget)
SAME_INPUT_CASES = [(N, m, "chunked") for N in (100, 1000, 2053) for m in (0.0, 0.6, 0.99)]
SAME_INPUT_CASES += [(100, 0.0, "fused"), (1000, 0.99, "fused"), (2053, 0.6, "fused")]


@pytest.mark.parametrize("N, momentum, scan", SAME_INPUT_CASES)
def test_bf16_kernels_match_float64_on_the_same_inputs(N, momentum, scan, monkeypatch):
    """bf16 q, k, v through backend="triton" (LOW mode: derived fp32 operands and the per-chunk
    states in bf16, states and accumulators in fp32) against the float64 PyTorch path on the
    same bf16 values; padding, an initial state, lengths that are no multiple of the chunk (64).
    Tolerance, relative RMS: bf16 keeps 8 significant bits, a rounding error up to 2⁻⁹ ≈ 2e-3
    relative (RMS about half). An output is the bf16 rounding of a ratio whose numerator went
    through two or three dots of bf16-rounded operands (the chunk states, the weighted keys):
    each adds an error of that size, so ~2–4e-3; the final states are fp32 sums of products of
    bf16-rounded operands, ~2e-3. A gradient goes through up to six such dots and through the
    cancellation between d(numerator) and d(denominator) terms (dq: φ(q)'s gradient is
    (s − out zᵀ)·dO/den), so a few times more. With the kernels' dots emulated in the
    interpreter (operands rounded to bf16, outputs and gradients stored in bf16), N = 300:
    outputs 2.3e-3, states 1.8e-3, gradients 5.8e-3 at most; the tolerances are 1e-2 for outputs
    and states and 3e-2 for gradients (≈ 4–5× those, for longer N and the GPU's own order of
    accumulation). Both kernel sets (chunk.SCAN: SAME_INPUT_CASES)."""
    use_scan(monkeypatch, scan)
    inputs, mask, state, ups = same_inputs_case(N + int(100 * momentum), N, torch.bfloat16)
    check_against_float64(inputs, mask, state, ups, momentum, torch.bfloat16, BF16_TOL)


@pytest.mark.parametrize("N", [300, 4096])
def test_fp32_takes_tf32_dots_where_torch_allows_them(N):
    """fp32 inputs under torch.set_float32_matmul_precision("high"): tf32 dots, within the
    tolerances plugins/attention/triton/utils.py states; "highest" (the default) stays within the
    exact fp32 ones (1e-4, 3e-4 for gradients)."""
    inputs, mask, state, ups = same_inputs_case(N, N, torch.float32)
    precision = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")
        check_against_float64(inputs, mask, state, ups, 0.9, torch.float32, TF32_TOL)
        torch.set_float32_matmul_precision("highest")
        check_against_float64(inputs, mask, state, ups, 0.9, torch.float32,
                              {"out": 1e-4, "state": 1e-4, "grad": 3e-4})
    finally:
        torch.set_float32_matmul_precision(precision)


@pytest.mark.parametrize("dots", ["ieee", "bf16x6"])
@pytest.mark.parametrize("scan,N,Dk,momentum", [("chunked", 300, 16, 0.999), ("chunked", 4096, 64, 0.9),
                                                 ("fused", 4096, 64, 0.9)])
def test_fp32_with_each_dots_setting_stays_within_the_exact_tolerances(monkeypatch, dots, scan, N, Dk,
                                                                       momentum):
    """MOMENTUM_TRITON_FP32_DOTS (plugins/attention/triton/utils.py): exact fp32's dots as fp32 FMA
    ("ieee") or six bf16 tensor-core products ("bf16x6") in every kernel, within the exact fp32
    tolerances against float64, in both kernel sets; the other tests run the default ("auto": six
    bf16 products in the per-chunk kernels, FMA in the scans). D 16 at β 0.999 is where Triton's
    tf32x3 dots faulted on an H200 (docs/benchmarks.md, 2026-11-27)."""
    use_scan(monkeypatch, scan)
    monkeypatch.setenv("MOMENTUM_TRITON_FP32_DOTS", dots)
    inputs, mask, state, ups = same_inputs_case(N + Dk, N, torch.float32, Dk=Dk, Dv=Dk)
    check_against_float64(inputs, mask, state, ups, momentum, torch.float32,
                          {"out": 1e-4, "state": 1e-4, "grad": 3e-4})


CHUNK_KERNELS = ["fwd_h", "fwd_o", "bwd_dh", "bwd_dv", "bwd_dqk"]


def tile_key(config):
    return config.kwargs["BK"], config.kwargs["BV"], config.num_warps


EXACT_TOL = {"out": 1e-4, "state": 1e-4, "grad": 3e-4}
CASE_TOL = {torch.float32: EXACT_TOL, torch.float16: BF16_TOL, torch.bfloat16: BF16_TOL}


def dense_case(shape, momentum, dtype):
    """A check on fresh inputs of `shape` (B, H, N, Dk, Dv): output and q, k, v gradients against
    float64."""
    B, H, N, D, Dv = shape
    tensors = inputs(N + D, B, H, N, D, Dv)
    upstream = torch.randn(B, H, N, Dv, device="cuda")
    ref, ref_grads = value_and_grads(lambda *t: torch_attention(*t, momentum=momentum), tensors,
                                     torch.float64, upstream.double())

    def check():
        out, grads = value_and_grads(lambda *t: triton_attention(*t, momentum=momentum), tensors, dtype,
                                     upstream)
        torch.cuda.synchronize()
        assert rel_rms(out, ref) <= TOL[dtype]
        for got, expected in zip(grads, ref_grads):
            assert torch.isfinite(got).all()
            assert rel_rms(got, expected) <= 3 * TOL[dtype]
    return check


def padded_case(N, momentum, dtype):
    """Padding, an initial state and Dv = 48 (masked value columns) through the public API."""
    case = same_inputs_case(N + 7, N, dtype)

    def check():
        check_against_float64(*case, momentum, dtype, CASE_TOL[dtype])
        torch.cuda.synchronize()
    return check


@pytest.mark.skipif(os.environ.get("GPU_TILE_SWEEP") != "1", reason=(
    "the forced tile-config sweep compiles every kept config: opt-in, GPU_TILE_SWEEP=1"))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kernel", CHUNK_KERNELS)
def test_every_kept_tile_config(kernel, dtype, monkeypatch):
    """Each (BK, BV, warps) that the kernel's pruner keeps, forced in turn (the other kernels at
    their pruner's first config, no autotuning), launches and matches float64, forward and
    gradients: head sizes 64 (β 0.9) and 128 (β 0), where the tiles differ, and a padded batch with an
    initial state and Dv = 48. Autotuning runs every kept config, so one that faults or is wrong
    breaks whichever call tunes first; this names it (chunk kernels at BK 64, BV 32, 8 warps
    faulted on an H100 with Triton 3.6: utils.CHUNK_FAULTS)."""
    from plugins.attention.triton import chunk_kernels as K
    seen = set()
    forced = [None]

    def pinned(name, original):
        def prune(configs, named_args, **kw):
            kept = original(configs, named_args, **kw)
            if name == kernel:
                seen.update(tile_key(c) for c in kept)
                kept = [c for c in kept if tile_key(c) == forced[0]] or kept[:1]
            return kept[:1]
        return prune

    autotuners = [getattr(K, name) for name in CHUNK_KERNELS]
    for name, autotuner in zip(CHUNK_KERNELS, autotuners):
        monkeypatch.setattr(autotuner, "early_config_prune", pinned(name, autotuner.early_config_prune))
        monkeypatch.setattr(autotuner, "cache", {})
    # each case compiles every kept config once (its own constexprs): three cases keep the test
    # inside gpu-check's 120 s per test
    cases = [(f"{shape} β={m}", dense_case(shape, m, dtype))
             for shape, m in [((2, 4, 200, 64, 64), 0.9), ((1, 2, 130, 128, 128), 0.0)]]
    cases += [("padded N=100 β=0.6", padded_case(100, 0.6, dtype))]
    checked = 0
    for where, check in cases:
        seen.clear()
        forced[0] = None
        for autotuner in autotuners:
            autotuner.cache.clear()
        check()
        for key in sorted(seen):
            forced[0] = key
            for autotuner in autotuners:
                autotuner.cache.clear()
            try:
                check()
            except Exception as error:
                raise AssertionError(f"{kernel} at (BK, BV, warps) = {key}, {where}: {error}") from error
            checked += 1
    assert checked >= len(cases)

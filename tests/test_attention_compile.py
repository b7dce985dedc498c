"""torch.compile(fullgraph=True) through momentum attention on CPU: no graph break (fullgraph
raises on one), forward and gradients equal to eager. The aot_eager backend traces exactly what
inductor would (Dynamo, then AOTAutograd's joint forward/backward graph) without its C++
compile, which would take minutes here; one test compiles with inductor itself."""
import itertools

import pytest
import torch

from plugins.attention import momentum_attention, momentum_attention_step

TOL = dict(rtol=1e-5, atol=1e-6)


@pytest.fixture(autouse=True)
def no_fake_tensor_cache():
    """Trace without torch's fake-tensor dispatch cache, a speed-up that slows these symbolic-shape
    traces down (its hits rebuild each output through Tensor.set_ with symbolic strides): the file
    took 131 s on two workers with it and 85 s without (torch 2.13). The Triton path's compile tests
    (test_attention_triton.py, test_hf_compile_training.py) keep torch's default."""
    with torch._dynamo.config.patch(fake_tensor_cache_enabled=False):
        yield


class TinyAttention(torch.nn.Module):
    """A projection into heads, then causal momentum attention: what a model layer does."""

    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)

    def forward(self, x, mask=None, cu_seqlens=None):
        B, N, _ = x.shape
        q, k, v = self.qkv(x).view(B, N, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        return momentum_attention(q, k, v, momentum=0.9, step_size=0.6, chunk_size=8, padding_mask=mask,
                                  cu_seqlens=cu_seqlens)


def eager_and_compiled(module, *args, compiled=None):
    results = []
    if compiled is None:
        compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    for fn in (module, compiled):
        module.zero_grad()
        out = fn(*args)
        real = torch.ones((), dtype=torch.bool) if args[1] is None else args[1][:, None, :, None]
        torch.where(real, out, 0.0).pow(2).sum().backward()
        results.append((out.detach(), [p.grad.clone() for p in module.parameters()]))
    return results


@pytest.mark.parametrize("padded", [False, True])
def test_compiled_model_matches_eager(make_generator, padded):
    gen = make_generator()
    torch._dynamo.reset()
    module = TinyAttention()
    x = torch.randn(2, 21, 16, generator=gen)
    mask = None
    if padded:
        mask = torch.ones(2, 21, dtype=torch.bool)
        mask[0, :6] = False                              # left padding, with garbage in it
        x[0, :6] = 1e4
    (out, grads), (out_c, grads_c) = eager_and_compiled(module, x, mask)
    assert torch.isfinite(grads[0]).all()
    assert_compiled_equals_eager(out, grads, out_c, grads_c, equal_nan=True)


def assert_compiled_equals_eager(out, grads, out_c, grads_c, equal_nan=False):
    torch.testing.assert_close(out_c, out, **TOL, equal_nan=equal_nan)
    for g, g_c in zip(grads, grads_c):
        # fp32 sums taken in another order (AOTAutograd's decomposed backward) err in proportion to the
        # largest terms, not to each entry: 1e-5 of the largest entry (one entry in 768 was 1.9e-6 off
        # with atol 1e-6 for some initial weights, before and after 2026-11-29's changes)
        torch.testing.assert_close(g_c, g, rtol=TOL["rtol"], atol=1e-5 * float(g.abs().max()))


def test_compiled_decoding_step_and_triton_dispatch(make_generator, monkeypatch):
    """The single-token step and the backend="triton" dispatch (a stand-in kernel module under
    TRITON_INTERPRET=1) trace whole as well, so registered Triton ops drop into the same graph."""
    from helpers.fake_triton import fake_kernels, install
    calls = []
    install(monkeypatch, fake_kernels(calls))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    gen = make_generator()
    torch._dynamo.reset()
    q, k, v = (torch.randn(2, 2, 12, 8, generator=gen) for _ in range(3))

    def prefill_then_step(q, k, v):
        out, state = momentum_attention(q[:, :, :-1], k[:, :, :-1], v[:, :, :-1], momentum=0.9,
                                        return_state=True, backend="triton")
        last, state = momentum_attention_step(q[:, :, -1:], k[:, :, -1:], v[:, :, -1:], state,
                                              momentum=0.9, backend="triton")
        return torch.cat([out, last], 2), state.s

    eager = prefill_then_step(q, k, v)
    compiled = torch.compile(prefill_then_step, fullgraph=True, backend="aot_eager")(q, k, v)
    # eager, without gradients, the step takes the raw inputs (marked_step); compiled, the plain step
    assert [c["form"] for c in calls] == ["chunk", "marked_step", "chunk", "step"]
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a, b, **TOL)
    torch.testing.assert_close(eager[0], momentum_attention(q, k, v, momentum=0.9, backend="torch"), **TOL)


@pytest.mark.parametrize("padded", [False, True])
def test_dynamic_shapes_compile_whole(make_generator, padded):
    """torch.compile(dynamic=True, fullgraph=True), as users compile for batches of varying length: the
    call checks its numbers (a dataclass default such as eps is then a symbolic float, which has no
    hasattr and no math.isfinite). Traced, the chunks' scan runs in padded blocks of 16 chunks, so the
    graph follows the number of block levels, not the length: 17 to 100 tokens (3 to 13 chunks of 8,
    a multiple of the chunk among them) share one graph, 130 and 200 (over 16 chunks: a second level)
    one more; each equals eager, forward and gradients. Unpadded, the first level only: the second
    level's graph is the padded one's without the mask (about 15 s more of symbolic tracing)."""
    from torch._dynamo.testing import CompileCounterWithBackend
    gen = make_generator()
    torch._dynamo.reset()
    module = TinyAttention()
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(module, fullgraph=True, backend=counter, dynamic=True)
    graphs = []
    lengths = (17, 29, 64, 100, 130, 200) if padded else (17, 29, 64, 100)
    for length in lengths:
        x = torch.randn(2, length, 16, generator=gen)
        mask = None
        if padded:
            mask = torch.ones(2, length, dtype=torch.bool)
            mask[0, :5] = False
        (out, grads), (out_c, grads_c) = eager_and_compiled(module, x, mask, compiled=compiled)
        assert_compiled_equals_eager(out, grads, out_c, grads_c)
        graphs.append(counter.frame_count)
    assert graphs[0] == graphs[1] == graphs[2] == graphs[3], graphs
    if padded:
        assert graphs[3] < graphs[4] == graphs[5], graphs


@pytest.mark.usefixtures("inductor_cpp_without_simd")
def test_inductor_compiles_lengths_of_a_scan_level_into_one_graph(make_generator):
    """torch.compile's default backend generates code, not only traces it: under dynamic=True,
    inductor lowers the traced scan (padded blocks, symbolic chunk counts) once for 17 and 100
    tokens, padded, and its code equals eager, forward and gradients (one C++ build, about 30 s)."""
    from torch._dynamo.testing import CompileCounterWithBackend
    gen = make_generator()
    torch._dynamo.reset()
    module = TinyAttention()
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(module, fullgraph=True, backend=counter, dynamic=True)
    for length in (17, 100):
        x = torch.randn(2, length, 16, generator=gen)
        mask = torch.ones(2, length, dtype=torch.bool)
        mask[0, :5] = False
        (out, grads), (out_c, grads_c) = eager_and_compiled(module, x, mask, compiled=compiled)
        assert_compiled_equals_eager(out, grads, out_c, grads_c)
    assert counter.frame_count == 1


@pytest.mark.usefixtures("inductor_cpp_without_simd")
def test_inductor_trains_packed_rows_of_another_length_with_the_same_graph(make_generator):
    """Packed documents (cu_seqlens) of 13 and then 7 tokens through one inductor graph under
    dynamic=True, forward and gradients equal to eager. The traced scan returned a view into its
    padded blocks, which the backward saved; inductor stores such a tensor compactly, and torch
    (2.13) then gave the backward's input the first call's strides as numbers: the second length
    raised "expected size 2==2, stride 32==48 at dim=1" (pytorch/pytorch#191885)."""
    gen = make_generator()
    torch._dynamo.reset()
    module = TinyAttention()
    compiled = torch.compile(module, fullgraph=True, backend="inductor", dynamic=True)
    for lengths in ((1, 6, 4, 2), (5, 1, 1)):
        x = torch.randn(1, sum(lengths), 16, generator=gen)
        cu = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)
        (out, grads), (out_c, grads_c) = eager_and_compiled(module, x, None, cu, compiled=compiled)
        assert_compiled_equals_eager(out, grads, out_c, grads_c)


def test_many_lengths_stay_under_the_recompile_limit(make_generator):
    """Plain torch.compile(fullgraph=True) (dynamic=None: static first, then dynamic after a new
    shape) over more lengths than torch's recompile limit (8): when the scan stepped over the chunks
    in Python, every chunk count was a graph, and the ninth raised FailOnRecompileLimitHit."""
    from torch._dynamo.testing import CompileCounterWithBackend
    gen = make_generator()
    torch._dynamo.reset()
    module = TinyAttention()
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(module, fullgraph=True, backend=counter)
    lengths = range(9, 113, 8)                           # 13 lengths, 2 to 14 chunks
    assert len(lengths) > torch._dynamo.config.recompile_limit
    for length in lengths:
        x = torch.randn(1, length, 16, generator=gen)
        (out, grads), (out_c, grads_c) = eager_and_compiled(module, x, None, compiled=compiled)
        assert_compiled_equals_eager(out, grads, out_c, grads_c)
    assert counter.frame_count == 2


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_traced_scan_equals_the_quadratic_form_in_float64(make_generator, layout):
    """The traced form (padded scan blocks, one chunk more) against eq. 13 written out quadratically,
    in float64, under dynamic shapes, at lengths on both sides of a block level (11 and 37 chunks of
    4), padded left and right, or packed (the scan's restarts) with each document run alone."""
    from plugins.attention.naive import naive_causal_momentum_attention
    gen = make_generator()
    torch._dynamo.reset()

    def attend(q, k, v, mask, cu):
        return momentum_attention(q, k, v, momentum=0.8, step_size=0.7, chunk_size=4, padding_mask=mask,
                                  cu_seqlens=cu)

    compiled = torch.compile(attend, fullgraph=True, backend="aot_eager", dynamic=True)
    for N, cut in ((45, 7), (150, 61)):
        B = 2 if layout == "padded" else 1
        q, k, v = (torch.randn(B, 2, N, 8, generator=gen, dtype=torch.float64) for _ in range(3))
        mask = cu = None
        if layout == "padded":
            mask = torch.ones(B, N, dtype=torch.bool)
            mask[0, :cut] = False
            mask[1, N - cut:] = False
            real = mask[:, None, :, None]
            got = torch.where(real, compiled(q, k, v, mask, cu), 0.0)
            expected = torch.where(real, naive_causal_momentum_attention(q, k, v, momentum=0.8, step_size=0.7,
                                                                         padding_mask=mask), 0.0)
        else:
            cu = torch.tensor([0, cut, N], dtype=torch.int32)
            got = compiled(q, k, v, mask, cu)
            expected = torch.cat([naive_causal_momentum_attention(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b],
                                                                  momentum=0.8, step_size=0.7)
                                  for a, b in ((0, cut), (cut, N))], 2)
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)


def test_momentum_and_step_size_traced_as_numbers_compile_whole(make_generator):
    """Under dynamic=True the momentum and step size given as a compiled function's arguments are traced
    as symbolic floats: the rule's checks take them, and the output equals eager's in float64."""
    gen = make_generator()
    torch._dynamo.reset()
    q, k, v = (torch.randn(2, 2, 13, 8, generator=gen, dtype=torch.float64) for _ in range(3))

    def attend(q, k, v, momentum, step_size):
        return momentum_attention(q, k, v, momentum=momentum, step_size=step_size, chunk_size=4)

    compiled = torch.compile(attend, fullgraph=True, backend="aot_eager", dynamic=True)
    for momentum, step_size in ((0.9, 0.6), (0.5, 1.3)):
        expected = attend(q, k, v, momentum, step_size)
        torch.testing.assert_close(compiled(q, k, v, momentum, step_size), expected, rtol=1e-12, atol=1e-12)

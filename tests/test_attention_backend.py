"""backend="auto" | "torch" | "triton": which kernels run, what they are handed, and — where
plugins.attention.triton imports — the Triton kernels through the public API against the
float64 references (CPU tensors under Triton's interpreter; small shapes)."""
import math
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")     # read when the kernels are first imported

from helpers.fake_triton import fake_kernels, install

from plugins.attention import (
    linear_attention,
    momentum_attention,
    momentum_attention_step,
    naive_causal_momentum_attention,
    naive_recurrent_momentum_attention,
)
from plugins.attention.backends import use_triton

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def broken(monkeypatch):
    install(monkeypatch, None)


def test_torch_and_auto_on_cpu_never_need_the_kernels(monkeypatch):
    broken(monkeypatch)
    for device in (CPU, CUDA):
        assert not use_triton("torch", device, float64=False)
    assert not use_triton("auto", CPU, float64=False)
    q = torch.randn(1, 2, 9, 4)
    torch.testing.assert_close(momentum_attention(q, q, q, momentum=0.5),
                               momentum_attention(q, q, q, momentum=0.5, backend="torch"), rtol=0, atol=0)


def test_auto_picks_triton_for_cuda_tensors_only_when_available(monkeypatch):
    monkeypatch.setattr("plugins.attention.backends._FAILED", {})
    install(monkeypatch, fake_kernels([]))
    assert use_triton("auto", CUDA, float64=False)
    assert not use_triton("auto", CUDA, float64=True)           # float64 stays on the reference path
    install(monkeypatch, fake_kernels([], available=False))
    assert not use_triton("auto", CUDA, float64=False)
    broken(monkeypatch)
    assert not use_triton("auto", CUDA, float64=False)


def test_triton_refuses_clearly_where_it_cannot_run(monkeypatch):
    install(monkeypatch, fake_kernels([]))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match=r"backend='triton' on CPU tensors needs Triton's interpreter: set "
                                         r"TRITON_INTERPRET=1"):
        use_triton("triton", CPU, float64=False)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert use_triton("triton", CPU, float64=False)
    with pytest.raises(ValueError, match="backend='triton' runs bfloat16, float16 and float32"):
        use_triton("triton", CPU, float64=True)
    with pytest.raises(ValueError, match="backend='triton' needs CUDA tensors"):
        use_triton("triton", torch.device("meta"), float64=False)
    install(monkeypatch, fake_kernels([], available=False))
    with pytest.raises(ValueError, match=r"is_available\(\) is False"):
        use_triton("triton", CUDA, float64=False)
    broken(monkeypatch)
    with pytest.raises(ValueError, match="needs plugins.attention.triton, which does not import"):
        use_triton("triton", CPU, float64=False)


def test_public_api_refuses_triton_on_cpu_without_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    q = torch.randn(1, 2, 5, 4)
    for call in (lambda: momentum_attention(q, q, q, momentum=0.5, backend="triton"),
                 lambda: linear_attention(q, q, q, backend="triton"),
                 lambda: momentum_attention_step(q[:, :, :1], q[:, :, :1], q[:, :, :1], None, momentum=0.5,
                                                 backend="triton")):
        with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
            call()
    # Eq. 14 always runs in PyTorch: the backend is checked, not needed.
    torch.testing.assert_close(momentum_attention(q, q, q, momentum=0.5, causal=False, backend="triton"),
                               momentum_attention(q, q, q, momentum=0.5, causal=False))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dispatch_hands_the_kernels_inputs_in_their_dtype(monkeypatch, make_generator, dtype):
    """Padding (gathered), initial state, NaN marks and the returned state go through the same
    code for both backends; only the kernel and the inputs' dtype differ."""
    calls = []
    install(monkeypatch, fake_kernels(calls))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    gen = make_generator()
    q, k, v = (torch.randn(2, 2, 30, 8, generator=gen).to(dtype) for _ in range(3))
    mask = torch.ones(2, 30, dtype=torch.bool)
    mask[0, :7] = False                                           # left padding: the gather path
    k[0, :, 20] = math.nan                                        # a non-finite real key
    _, init = momentum_attention(q, k, v, momentum=0.6, return_state=True, backend="torch")
    init = type(init)(*(torch.nan_to_num(t) for t in (init.s, init.z, init.m)))
    kw = dict(momentum=0.6, step_size=0.8, padding_mask=mask, chunk_size=8, initial_state=init,
              return_state=True)
    out, state = momentum_attention(q, k, v, backend="triton", **kw)
    ref, ref_state = momentum_attention(q, k, v, backend="torch", **kw)
    marks, call = calls                                           # the marks of the raw inputs first
    assert marks["form"] == "finite_features" and marks["dtypes"] == (dtype,) * 3
    assert marks["lengths"].tolist() == [23, 30]
    assert call["dtypes"] == (dtype,) * 3 and call["initial_state"].s.dtype == torch.float32
    assert call["momentum"] == 0.6 and call["chunk_size"] == 8 and call["lengths"].tolist() == [23, 30]
    assert out.dtype == dtype and state.s.dtype == torch.float32
    assert torch.equal(torch.isfinite(out), torch.isfinite(ref))
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=3e-2, atol=3e-2)
    finite = torch.isfinite(ref)
    torch.testing.assert_close(out[finite], ref[finite], **tol)
    assert torch.equal(torch.isfinite(state.s), torch.isfinite(ref_state.s))

    linear_attention(q, k, v, backend="triton")
    assert calls[-1]["momentum"] == 0.0
    step_out, _ = momentum_attention_step(q[:, :, :1], k[:, :, :1], v[:, :, :1], init, momentum=0.6,
                                          backend="triton")
    assert calls[-1]["form"] == "marked_step" and calls[-1]["dtypes"] == (dtype,) * 3   # raw, no gradients
    assert step_out.dtype == dtype
    leaves = [t[:, :, :1].clone().requires_grad_() for t in (q, k, v)]
    step_out, _ = momentum_attention_step(*leaves, init, momentum=0.6, backend="triton")
    assert calls[-1]["form"] == "step" and calls[-1]["dtypes"] == (torch.float32,) * 3
    assert step_out.dtype == dtype


# The real kernels, where plugins.attention.triton exists (CPU tensors under the interpreter).

def rel_rms(a, b):
    """RMS error relative to the reference's RMS, floored at 1e-3: a gradient that is zero in
    exact arithmetic (dq at N = 1) is compared in absolute terms."""
    a, b = a.double(), b.double()
    return ((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt().clamp(min=1e-3)).item()


@pytest.fixture
def triton_device():
    try:
        import plugins.attention.triton  # noqa: F401
    except ImportError as error:
        pytest.skip(f"plugins.attention.triton does not import here ({error})")
    if torch.cuda.is_available():
        return "cuda"
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("no CUDA and TRITON_INTERPRET is not 1: the Triton kernels cannot run")
    return "cpu"


def fp64_inputs(gen, B=2, H=2, N=17, D=16):
    return [torch.randn(B, H, N, D, generator=gen, dtype=torch.float64) for _ in range(3)]


@pytest.mark.parametrize("momentum,step_size", [(0.0, 1.0), (0.6, 0.6), (0.99, 1.0)])
@pytest.mark.parametrize("N", [1, 17, 65])
def test_triton_forward_and_gradients_match_eq13(triton_device, make_generator, N, momentum, step_size):
    q, k, v = fp64_inputs(make_generator(), N=N)
    upstream = torch.randn(2, 2, N, 16, generator=make_generator("up"), dtype=torch.float64)
    kw = dict(momentum=momentum, step_size=step_size)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    expected = naive_causal_momentum_attention(*leaves, **kw)
    want = torch.autograd.grad((expected * upstream).sum(), leaves)
    leaves32 = [t.float().to(triton_device).requires_grad_() for t in (q, k, v)]
    out = momentum_attention(*leaves32, chunk_size=16, backend="triton", **kw)
    got = torch.autograd.grad((out * upstream.float().to(triton_device)).sum(), leaves32)
    assert rel_rms(out.cpu(), expected) <= 1e-4
    for name, g, w in zip("qkv", got, want):
        assert rel_rms(g.cpu(), w) <= 1e-4, name


@pytest.mark.parametrize("side", ["left", "right"])
def test_triton_padding_and_initial_state_gradients(triton_device, make_generator, side):
    gen = make_generator()
    q, k, v = fp64_inputs(gen, N=40)
    mask = torch.ones(2, 40, dtype=torch.bool)
    if side == "left":
        mask[0, :13] = False
    else:
        mask[1, 29:] = False
    for t in (k, v):
        t[~mask[:, None, :, None].expand_as(t)] = math.nan     # garbage in the padding
    pre = fp64_inputs(gen, N=9)
    _, init = naive_recurrent_momentum_attention(*pre, momentum=0.9, step_size=0.6)
    kw = dict(momentum=0.9, step_size=0.6, padding_mask=mask)

    def run(tensors, state_parts, **extra):
        state = type(init)(*state_parts)
        return naive_recurrent_momentum_attention(*tensors, state, **kw)[0] if not extra else \
            momentum_attention(*tensors, initial_state=state, chunk_size=16, **kw, **extra)

    leaves = [t.clone().requires_grad_() for t in (q, k, v, init.s, init.z, init.m)]
    expected = run(leaves[:3], leaves[3:])
    real = mask[:, None, :, None]
    zero = torch.zeros((), dtype=torch.float64)
    want = torch.autograd.grad(torch.where(real, expected, zero).sum(), leaves)
    leaves32 = [t.detach().float().to(triton_device).requires_grad_() for t in leaves]
    out = run(leaves32[:3], leaves32[3:], backend="triton")
    got = torch.autograd.grad(torch.where(real.to(triton_device), out, 0.0).sum(), leaves32)
    got_real = torch.where(real, out.detach().cpu().double(), zero)
    assert rel_rms(got_real, torch.where(real, expected, zero)) <= 1e-4
    assert (out.detach().cpu()[~mask[:, None, :, None].expand_as(out)] == 0).all()
    for name, g, w in zip(["q", "k", "v", "s0", "z0", "m0"], got, want):
        g = torch.where(torch.isfinite(w), g.cpu().double(), zero)
        assert rel_rms(g, torch.nan_to_num(w)) <= 1e-4, name


def test_triton_prefill_then_decode_matches_eq12(triton_device, make_generator):
    q, k, v = fp64_inputs(make_generator(), N=40)
    kw = dict(momentum=0.9, step_size=0.6)
    expected = naive_causal_momentum_attention(q, k, v, **kw)
    q32, k32, v32 = (t.float().to(triton_device) for t in (q, k, v))
    outs = []
    out, state = momentum_attention(q32[:, :, :20], k32[:, :, :20], v32[:, :, :20], chunk_size=16,
                                    return_state=True, backend="triton", **kw)
    outs.append(out)
    for i in range(20, 30):
        out, state = momentum_attention_step(q32[:, :, i:i + 1], k32[:, :, i:i + 1], v32[:, :, i:i + 1],
                                             state, backend="triton", **kw)
        outs.append(out)
    out, state = momentum_attention_step(q32[:, :, 30:], k32[:, :, 30:], v32[:, :, 30:], state,
                                         chunk_size=16, backend="triton", **kw)
    outs.append(out)
    assert rel_rms(torch.cat(outs, 2).cpu(), expected) <= 1e-4
    _, ref_state = naive_recurrent_momentum_attention(q, k, v, **kw)
    for part in ("s", "z", "m"):
        assert rel_rms(getattr(state, part).cpu(), getattr(ref_state, part)) <= 1e-4, part


def test_triton_keeps_bfloat16(triton_device, make_generator):
    q, k, v = fp64_inputs(make_generator(), N=33)
    out = momentum_attention(*(t.to(triton_device, torch.bfloat16) for t in (q, k, v)), momentum=0.9,
                             chunk_size=16, backend="triton")
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    reference = naive_causal_momentum_attention(*(t.bfloat16().double() for t in (q, k, v)), momentum=0.9)
    assert rel_rms(out.cpu(), reference) <= 2e-2

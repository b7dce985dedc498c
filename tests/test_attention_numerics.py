"""Low precision and long sequences: float32 accumulation, no NaN/inf, close to float64."""
import pytest
import torch

from plugins.attention import momentum_attention, momentum_attention_step, naive_causal_momentum_attention


def rel_rms(a, b):
    a, b = a.double(), b.double()
    return ((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt()).item()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("momentum", [0.6, 0.999])
def test_long_low_precision_sequence_is_finite_and_accurate(make_generator, dtype, momentum):
    gen = make_generator()
    N = 65_536
    q, k, v = (torch.randn(1, 2, N, 16, generator=gen) for _ in range(3))
    q16, k16, v16 = (t.to(dtype) for t in (q, k, v))
    out = momentum_attention(q16, k16, v16, momentum=momentum)
    assert out.dtype == dtype
    assert torch.isfinite(out).all()
    reference = momentum_attention(*(t.double() for t in (q16, k16, v16)), momentum=momentum)
    assert rel_rms(out, reference) < 1e-2         # only the final rounding to `dtype` remains
    out, state = momentum_attention(q16, k16, v16, momentum=momentum, return_state=True)
    assert state.s.dtype == torch.float32 and torch.isfinite(state.s).all()


def test_states_stay_float32_under_autocast(make_generator):
    gen = make_generator()
    proj = torch.nn.Linear(16, 48)
    x = torch.randn(2, 300, 16, generator=gen)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        q, k, v = proj(x).view(2, 300, 3, 1, 16).permute(2, 0, 3, 1, 4)
        assert q.dtype == torch.bfloat16
        out, state = momentum_attention(q, k, v, momentum=0.9, return_state=True)
        step_out, state = momentum_attention_step(q[:, :, :1], k[:, :, :1], v[:, :, :1], state, momentum=0.9)
    assert out.dtype == torch.bfloat16 and step_out.dtype == torch.bfloat16
    assert state.s.dtype == state.z.dtype == state.m.dtype == torch.float32
    reference = momentum_attention(q.double(), k.double(), v.double(), momentum=0.9)
    assert rel_rms(out, reference) < 1e-2


def test_float32_close_to_float64_for_momentum_near_one(make_generator):
    gen = make_generator()
    q, k, v = (torch.randn(2, 2, 2000, 16, generator=gen, dtype=torch.float64) for _ in range(3))
    expected = naive_causal_momentum_attention(q, k, v, momentum=0.999, step_size=1.0)
    got = momentum_attention(q.float(), k.float(), v.float(), momentum=0.999)
    assert rel_rms(got, expected) < 1e-5


def test_relu_feature_map_with_all_zero_features_gives_zero_not_nan():
    q = -torch.ones(1, 1, 10, 4)
    out = momentum_attention(q, q, torch.randn(1, 1, 10, 4), momentum=0.5, feature_map="relu")
    assert torch.isfinite(out).all() and (out == 0).all()

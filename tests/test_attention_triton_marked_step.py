"""The decoding step without gradients in one Triton launch (triton.marked_recurrent_step): the
feature map, the non-finite marks and eq. 12 in `step_kernel` (PHI > 0) give what the PyTorch
step with nonfinite.NonFiniteMarks gives, the same entries non-finite and the same values
elsewhere, over several steps, with a padded row holding garbage; steps that need gradients keep
the differentiable path."""
import math

import pytest
import torch
from helpers.triton_attention import triton_ops

from plugins.attention import (
    MomentumAttentionState,
    momentum_attention_step,
    naive_recurrent_momentum_attention,
    nonfinite,
)

B, H, DK, DV = 3, 2, 16, 12
POISONS = [None, ("q", math.nan), ("q", -math.inf), ("k", math.inf), ("k", -math.inf), ("v", -math.inf)]


def steps(backend, inputs, feature_map, momentum, mask, state=None):
    """Each position of `inputs` through momentum_attention_step, without gradients."""
    q, k, v = inputs
    outs = []
    with torch.no_grad():
        for i in range(q.shape[2]):
            out, state = momentum_attention_step(
                q[:, :, i:i + 1], k[:, :, i:i + 1], v[:, :, i:i + 1], state, momentum=momentum,
                step_size=0.6, feature_map=feature_map, padding_mask=mask[:, i:i + 1], backend=backend)
            outs.append(out)
    return torch.cat(outs, 2), state


def poisoned_inputs(gen, poison, N=3, dtype=torch.float32):
    q, k, v = (torch.randn(B, H, N, d, generator=gen, dtype=dtype) for d in (DK, DK, DV))
    if poison is not None:
        name, value = poison
        {"q": q, "k": k, "v": v}[name][0, 1, 1, 3] = value      # row 0, head 1, the second step
    q[2, :, 0] = math.nan                                      # garbage in a padded position
    mask = torch.ones(B, N, dtype=torch.bool)
    mask[2, 0] = False
    return (q, k, v), mask


def assert_same(got, want):
    finite = torch.isfinite(want)
    assert torch.equal(torch.isfinite(got), finite)
    torch.testing.assert_close(got[finite], want[finite], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("poison", POISONS)
@pytest.mark.parametrize("feature_map,momentum", [("elu", 0.9), ("relu", 0.9), ("identity", 0.9),
                                                  ("elu", 0.0)])
def test_marked_step_equals_the_pytorch_step_with_marks(make_generator, feature_map, momentum, poison):
    triton_ops()
    inputs, mask = poisoned_inputs(make_generator(), poison)
    got, got_state = steps("triton", inputs, feature_map, momentum, mask)
    want, want_state = steps("torch", inputs, feature_map, momentum, mask)
    assert_same(got, want)
    for name in ("s", "z", "m"):
        assert_same(getattr(got_state, name), getattr(want_state, name))
    if poison is not None:
        assert not torch.isfinite(got[0, 1, 1:]).all(), "the poisoned step reaches the output"
        assert torch.isfinite(got[0, 1, :1]).all() and torch.isfinite(got[1]).all()


def test_half_precision_inputs_come_back_in_their_dtype(make_generator):
    triton_ops()
    (q, k, v), mask = poisoned_inputs(make_generator(), None, dtype=torch.bfloat16)
    got, state = steps("triton", (q, k, v), "elu", 0.9, mask)
    want, want_state = steps("torch", (q, k, v), "elu", 0.9, mask)
    assert got.dtype == torch.bfloat16 and state.s.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(state.s, want_state.s, rtol=1e-4, atol=1e-4)


def test_only_steps_without_gradients_skip_the_pytorch_marks(make_generator, monkeypatch):
    """Without gradients nonfinite.NonFiniteMarks is never built; with inputs that need them, the
    differentiable step runs and its gradients equal the PyTorch step's."""
    triton_ops()
    built = []
    original = nonfinite.NonFiniteMarks.feature_map.__func__
    monkeypatch.setattr(nonfinite.NonFiniteMarks, "feature_map",
                        classmethod(lambda cls, *a, **kw: built.append(1) or original(cls, *a, **kw)))
    (q, k, v), mask = poisoned_inputs(make_generator(), None, N=1)
    state = MomentumAttentionState.zeros(B, H, DK, DV, dtype=torch.float32, device=q.device)
    steps("triton", (q, k, v), "elu", 0.9, mask, state)
    assert built == []
    grads = []
    for backend in ("triton", "torch"):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out, _ = momentum_attention_step(*leaves, state, momentum=0.9, step_size=0.6, padding_mask=mask,
                                         backend=backend)
        grads.append(torch.autograd.grad(out[:2].sum(), leaves))
    assert built == [1, 1]
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("feature_map", ["elu", "relu", "identity"])
@pytest.mark.parametrize("dk,dv", [(8, 4), (20, 12), (48, 40)])
def test_head_dimensions_below_their_tile_equal_the_float64_recurrence(make_generator, feature_map, dk, dv):
    """Key dimensions that do not fill the kernel's BK lanes (8 and 20 of 16 and 32; 48 of 64): the
    lanes past Dk hold φ(0), which elu + 1 makes 1, and must not reach z, s or the output. Steps from
    a random state, a padded row among them, against eq. 12's float64 token loop."""
    triton_ops()
    gen = make_generator()
    q, k, v = (torch.randn(B, H, 4, d, generator=gen) for d in (dk, dk, dv))
    s, m = (torch.randn(B, H, dk, dv, generator=gen) for _ in range(2))
    state = MomentumAttentionState(s=s, z=torch.rand(B, H, dk, generator=gen), m=m)
    mask = torch.ones(B, 4, dtype=torch.bool)
    mask[1, 2] = False
    got, got_state = steps("triton", (q, k, v), feature_map, 0.9, mask, state)
    start = MomentumAttentionState(*(t.double() for t in (state.s, state.z, state.m)))
    want, want_state = naive_recurrent_momentum_attention(
        *(t.double() for t in (q, k, v)), start, momentum=0.9, step_size=0.6, feature_map=feature_map,
        padding_mask=mask)
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)
    for name in ("s", "z", "m"):
        torch.testing.assert_close(getattr(got_state, name).double(), getattr(want_state, name), rtol=1e-4,
                                   atol=1e-5)

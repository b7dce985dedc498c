"""Bad input raises ValueError early, naming the argument."""
import pytest
import torch

from plugins.attention import MomentumAttentionState, momentum_attention, momentum_attention_step


def qkv(B=2, H=2, N=5, D=4):
    return torch.randn(B, H, N, D), torch.randn(B, H, N, D), torch.randn(B, H, N, D)


@pytest.mark.parametrize("kwargs,needle", [
    (dict(momentum=1.0), r"momentum must be in \[0, 1\)"),
    (dict(momentum=-0.1), r"momentum must be in \[0, 1\)"),
    (dict(momentum=float("nan")), "momentum must be a finite number"),
    (dict(momentum="0.5"), "momentum must be a number"),
    (dict(momentum=0.5, step_size=0.0), "step_size must be > 0"),
    (dict(momentum=0.5, step_size=-1.0), "step_size must be > 0"),
    (dict(momentum=0.5, eps=0.0), "eps must be > 0"),
    (dict(momentum=0.5, chunk_size=0), r"chunk_size must be an integer in \[1, "),
    (dict(momentum=0.5, feature_map="softmax"), "feature_map must be one of"),
    (dict(momentum=0.5, padding_mask=torch.ones(2, 5)), "padding_mask must be a bool tensor"),
    (dict(momentum=0.5, padding_mask=torch.ones(2, 4, dtype=torch.bool)), r"padding_mask must have shape \(batch, length\)"),
    (dict(momentum=0.5, causal=False, return_state=True), "need causal=True"),
])
def test_bad_arguments(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        momentum_attention(*qkv(), **kwargs)


@pytest.mark.parametrize("shapes,needle", [
    (((2, 2, 5, 4), (3, 2, 5, 4), (3, 2, 5, 4)), "shapes do not match"),
    (((2, 2, 5, 4), (2, 2, 5, 4), (2, 2, 6, 4)), "shapes do not match"),
    (((2, 2, 5, 4), (2, 2, 5, 3), (2, 2, 5, 4)), "same last dimension"),
    (((2, 2, 4, 4), (2, 2, 5, 4), (2, 2, 5, 4)), "causal attention needs q and k of the same length"),
    (((2, 5, 4), (2, 5, 4), (2, 5, 4)), r"q must have shape \(batch, heads, length, dim\)"),
])
def test_mismatched_shapes(shapes, needle):
    with pytest.raises(ValueError, match=needle):
        momentum_attention(*(torch.randn(s) for s in shapes), momentum=0.5)


def test_non_floating_inputs():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="k must be a floating-point tensor"):
        momentum_attention(q, k.long(), v, momentum=0.5)


def test_step_rejects_a_state_of_the_wrong_shape():
    q, k, v = (t[:, :, :1] for t in qkv())
    state = MomentumAttentionState.zeros(2, 2, 4, 3, dtype=torch.float32, device=torch.device("cpu"))
    with pytest.raises(ValueError, match=r"state.s must have shape \(2, 2, 4, 4\)"):
        momentum_attention_step(q, k, v, state, momentum=0.5)
    with pytest.raises(ValueError, match=r"momentum must be in \[0, 1\)"):
        momentum_attention_step(q, k, v, None, momentum=1.5)

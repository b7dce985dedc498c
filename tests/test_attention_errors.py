"""Bad input raises ValueError early, naming the argument."""
import pytest
import torch

from plugins.attention import (
    MomentumAttentionState,
    linear_attention,
    momentum_attention,
    momentum_attention_step,
)


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
    (dict(momentum=0.5, chunk_size=0), r"chunk_size must be an integer >= 1, got 0"),
    (dict(momentum=0.5, feature_map="softmax"), "feature_map must be one of"),
    (dict(momentum=0.5, padding_mask=torch.ones(2, 5)), "padding_mask must be a bool tensor"),
    (dict(momentum=0.5, padding_mask=torch.ones(2, 4, dtype=torch.bool)),
     r"padding_mask must have shape \(batch, length\)"),
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


@pytest.mark.parametrize("form", ["step", "multi-token step", "initial_state"])
def test_a_tuple_state_is_refused_clearly(form):
    q, k, v = qkv()
    _, state = momentum_attention(q, k, v, momentum=0.5, return_state=True)
    as_tuple = (state.s, state.z, state.m)
    with pytest.raises(ValueError, match=r"state must be a MomentumAttentionState or None, got tuple.*"
                                         r"MomentumAttentionState\(s=\.\.\., z=\.\.\., m=\.\.\.\)"):
        if form == "step":
            momentum_attention_step(q[:, :, :1], k[:, :, :1], v[:, :, :1], as_tuple, momentum=0.5)
        elif form == "multi-token step":
            momentum_attention_step(q, k, v, as_tuple, momentum=0.5)
        else:
            momentum_attention(q, k, v, momentum=0.5, initial_state=as_tuple)


@pytest.mark.parametrize("n", [1, 5])
def test_unknown_backend_is_named(n):
    q, k, v = (t[:, :, :n] for t in qkv())
    needle = r"backend must be one of 'auto', 'torch', 'triton'; got 'cuda'"
    with pytest.raises(ValueError, match=needle):
        momentum_attention(q, k, v, momentum=0.5, backend="cuda")
    with pytest.raises(ValueError, match=needle):
        momentum_attention(q, k, v, momentum=0.5, causal=False, backend="cuda")
    with pytest.raises(ValueError, match=needle):
        linear_attention(q, k, v, backend="cuda")
    with pytest.raises(ValueError, match=needle):
        momentum_attention_step(q, k, v, None, momentum=0.5, backend="cuda")


def test_feature_map_must_keep_batch_heads_and_length():
    with pytest.raises(ValueError, match=r"feature_map must return a tensor of shape \(2, 2, 5\) \+ \(D′,\)"):
        momentum_attention(*qkv(), momentum=0.5, feature_map=lambda x: x.mean(2, keepdim=True))
    with pytest.raises(ValueError, match="feature_map must return a tensor"):
        momentum_attention_step(*(t[:, :, :1] for t in qkv()), None, momentum=0.5,
                                feature_map=lambda x: x[0])

"""Bad input raises ValueError early, naming the argument."""
import pytest
import torch

from plugins.attention import (
    MomentumAttentionState,
    NonCausalSummary,
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


@pytest.mark.parametrize("call", [
    lambda q, k, v: momentum_attention(q, k, v, momentum=0.5, causal="False"),
    lambda q, k, v: momentum_attention(q, k, v, momentum=0.5, return_state="no"),
    lambda q, k, v: momentum_attention(q, k, v, momentum=0.5, causal=0),
    lambda q, k, v: linear_attention(q, k, v, causal="False"),
], ids=["causal-str", "return_state-str", "causal-int", "linear-causal-str"])
def test_flags_must_be_bools(call):
    """A string is truthy: causal="False" would run the causal form, return_state="no" would
    return a tuple."""
    with pytest.raises(ValueError, match=r"(causal|return_state) must be True or False, got (str|int)"):
        call(*qkv())


def _state_parts(B=2, H=2, Dk=4, Dv=3, dtype=torch.float32):
    return dict(s=torch.zeros(B, H, Dk, Dv, dtype=dtype), z=torch.zeros(B, H, Dk, dtype=dtype),
                m=torch.zeros(B, H, Dk, Dv, dtype=dtype))


@pytest.mark.parametrize("change,needle", [
    (dict(m=None), "state.m must be a torch.Tensor, got NoneType"),
    (dict(s=[[0.0]]), "state.s must be a torch.Tensor, got list"),
    (dict(z=torch.zeros(2, 2, 4, dtype=torch.long)), "state.z must be a floating-point tensor"),
    (dict(m=torch.zeros(2, 2, 4, 3, dtype=torch.float64)), "state.s and state.m must have one dtype"),
    (dict(z=torch.zeros(3, 2, 4)),
     r"state must have s \(B, H, Dk, Dv\).*got s \(2, 2, 4, 3\), z \(3, 2, 4\)"),
    (dict(m=torch.zeros(2, 2, 4, 5)), r"state must have s .*m \(2, 2, 4, 5\)"),
    (dict(s=torch.zeros(2, 2, 4), m=torch.zeros(2, 2, 4)), "state must have s"),
])
def test_state_fields_are_checked_on_construction(change, needle):
    with pytest.raises(ValueError, match=needle):
        MomentumAttentionState(**{**_state_parts(), **change})


def test_state_to_is_the_state_itself_where_nothing_changes():
    """As Tensor.to: the same object where no part changes, a new state of cast parts otherwise."""
    gen = torch.Generator().manual_seed(0)
    state = MomentumAttentionState(**{name: torch.randn(t.shape, generator=gen)
                                      for name, t in _state_parts().items()})
    assert state.to(torch.float32) is state
    cast = state.to(torch.float64)
    assert cast is not state and {t.dtype for t in (cast.s, cast.z, cast.m)} == {torch.float64}
    for name in ("s", "z", "m"):
        torch.testing.assert_close(getattr(cast, name), getattr(state, name).double(), atol=0, rtol=0)


def test_summary_fields_are_checked_on_construction():
    with pytest.raises(ValueError, match="summary.z must be a torch.Tensor, got NoneType"):
        NonCausalSummary(kv=torch.zeros(2, 2, 4, 3), z=None)
    with pytest.raises(ValueError, match=r"summary must have kv \(B, H, Dk, Dv\) and z \(B, H, Dk\)"):
        NonCausalSummary(kv=torch.zeros(2, 2, 4, 3), z=torch.zeros(1, 2, 4))

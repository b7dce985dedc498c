"""The attention's q, k and v projections (MultiHeadAttention._projections): where gradients flow,
one GEMM on the three plain linear layers' joined weights, with the outputs and gradients of the
three calls and a third of their GEMMs; elsewhere each projection on its input cast once under
autocast (plugins.autocast.shared_input), with the output of autocast's own three casts. Layers
whose forward is not nn.Linear's (subclasses such as PEFT's, hooks, parametrizations, a replaced
forward) keep their own calls."""
import pytest
import torch
from torch import nn
from torch.nn.utils import parametrize
from torch.profiler import ProfilerActivity, profile

from plugins.autocast import shared_input
from plugins.transformer.attention import MultiHeadAttention, joinable
from plugins.transformer.config import BlockConfig

D, HEADS = 16, 2
GEMMS = ("aten::mm", "aten::addmm", "aten::bmm")


def attention(**settings):
    torch.manual_seed(0)
    return MultiHeadAttention(BlockConfig(D, HEADS, **settings))


def profiled(call):
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        out = call()
    return out, prof.events()


def copies_of(events, shape) -> int:
    return sum(1 for e in events if e.name == "aten::_to_copy" and e.input_shapes
               and list(e.input_shapes[0]) == list(shape))


@pytest.mark.parametrize("settings", [dict(attention="momentum", momentum=0.6), dict(attention="softmax")])
def test_one_cast_of_the_input_without_gradient_and_autocasts_output(settings):
    attn = attention(**settings).eval()
    x = torch.randn(2, 5, D)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        fast, events = profiled(lambda: attn._projections(x))
        each = [proj(x) for proj in (attn.q_proj, attn.k_proj, attn.v_proj)]   # autocast's three casts
        out, _ = attn(x)
    assert copies_of(events, x.shape) == 1
    assert all(torch.equal(a, b) for a, b in zip(fast, each)) and out.dtype == torch.bfloat16


def test_the_joined_gemm_gives_the_three_projections_and_their_gradients():
    attn = attention().double()
    x = torch.randn(2, 7, D, dtype=torch.float64, requires_grad=True)
    projections = (attn.q_proj, attn.k_proj, attn.v_proj)
    grads = [torch.randn(2, 7, D, dtype=torch.float64) for _ in range(3)]
    joined = attn._projections(x)
    separate = [proj(x) for proj in projections]
    params = [x] + [p for proj in projections for p in (proj.weight, proj.bias)]
    expected = torch.autograd.grad(separate, params, grads)
    got = torch.autograd.grad(joined, params, grads)
    for a, b in zip(joined, separate):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_a_training_step_runs_a_third_of_the_projection_gemms():
    attn = attention(attention="softmax")
    x = torch.randn(2, 5, D, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        (out, _), forward = profiled(lambda: attn(x))
    _, backward = profiled(lambda: out.float().sum().backward())
    gemms = sum(1 for e in list(forward) + list(backward) if e.name in GEMMS)
    # q, k, v joined: 1 forward + 2 backward; o_proj the same; SDPA's math on CPU adds its own bmm
    sdpa = sum(1 for e in list(forward) + list(backward) if e.name == "aten::bmm")
    assert gemms - sdpa == 6, gemms
    assert copies_of(forward, x.shape) == 1


class Hooked(nn.Linear):
    pass


@pytest.mark.parametrize("change", ["subclass", "hook", "pre_hook", "forward", "parametrized", "one_bias"])
def test_layers_with_their_own_forward_keep_their_calls(change):
    attn = attention().double()
    if change == "subclass":
        attn.k_proj = Hooked(D, D).double()
    elif change == "hook":
        attn.k_proj.register_forward_hook(lambda module, args, out: out * 2)
    elif change == "pre_hook":
        attn.k_proj.register_forward_pre_hook(lambda module, args: (args[0] * 2,))
    elif change == "forward":
        original = attn.k_proj.forward
        attn.k_proj.forward = lambda t: original(t) * 2
    elif change == "parametrized":
        parametrize.register_parametrization(attn.k_proj, "weight", nn.Identity())
    else:
        attn.k_proj = nn.Linear(D, D, bias=False).double()
    assert not joinable((attn.q_proj, attn.k_proj, attn.v_proj))
    x = torch.randn(2, 5, D, dtype=torch.float64, requires_grad=True)
    for a, b in zip(attn._projections(x), (attn.q_proj(x), attn.k_proj(x), attn.v_proj(x))):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_shared_input_leaves_what_autocast_leaves():
    x = torch.randn(3, D, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert shared_input(x) is x                                 # a gradient flows: autocast's casts
        with torch.no_grad():
            assert shared_input(x).dtype == torch.bfloat16
            for other in (x.detach().double(), torch.arange(3)):
                assert shared_input(other) is other
    assert shared_input(x.detach()).dtype == torch.float32          # no autocast


def test_both_forms_trace_in_one_graph():
    attn = attention(attention="softmax")
    x = torch.randn(2, 5, D)
    compiled = torch.compile(lambda t: attn(t)[0], fullgraph=True, backend="eager")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with torch.no_grad():
            assert torch.equal(compiled(x), attn(x)[0])
        assert torch.equal(compiled(x.requires_grad_()), attn(x)[0])

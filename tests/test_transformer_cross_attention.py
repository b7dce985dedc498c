"""Cross-attention of the shared `plugins.transformer.MultiHeadAttention` (Momentum Transformer,
eq. 14 over another sequence, as a decoder over its encoder; softmax cross-attention, eq. 1) against
a float64 reference built from the literal quadratic eq. 14 (`plugins.attention.naive`) or an
explicit softmax over the real keys, and the module's weights read as plain tensors: forward and
gradients, padded keys, a source row without real keys, key and value widths of their own,
lengths not multiples of the chunk, the key summary reused across calls and beams, and argument
errors."""
import pytest
import torch
from gradients import assert_same_gradients

from plugins.attention import naive_noncausal_momentum_attention
from plugins.transformer import BlockConfig, MultiHeadAttention

D, HEADS, KDIM, VDIM = 8, 2, 6, 5
KINDS = {"momentum": dict(attention="momentum", momentum=0.4, step_size=0.7),
         "linear": dict(attention="linear"), "softmax": dict(attention="softmax")}
COEFFICIENTS = {"momentum": (0.4, 0.7), "linear": (0.0, 1.0)}


def module(kind, generator):
    config = BlockConfig(D, HEADS, causal=True, chunk_size=4, **KINDS[kind])
    attn = MultiHeadAttention(config, kdim=KDIM, vdim=VDIM).double()
    with torch.no_grad():
        for p in attn.parameters():
            p.copy_(torch.randn(p.shape, generator=generator, dtype=torch.float64) * 0.5)
    return attn


def reference(params, kind, x, key, value, real):
    """o_proj(eq. 14 of heads(q_proj x) over heads(k_proj key), heads(v_proj value))."""
    def project(name, t):
        out = t @ params[f"{name}.weight"].T + params[f"{name}.bias"]
        return out.view(t.shape[0], t.shape[1], HEADS, D // HEADS).transpose(1, 2)

    q, k, v = project("q_proj", x), project("k_proj", key), project("v_proj", value)
    if kind == "softmax":
        scores = (q @ k.transpose(-1, -2)) / (D // HEADS) ** 0.5
        weights = scores.masked_fill(~real[:, None, None, :], float("-inf")).softmax(-1)
        out = torch.nan_to_num(weights, nan=0.0) @ v        # a row without real keys gets 0
    else:
        beta, gamma = COEFFICIENTS[kind]
        out = naive_noncausal_momentum_attention(q, k, v, momentum=beta, step_size=gamma, padding_mask=real)
    out = out.transpose(1, 2).reshape(x.shape[0], x.shape[1], D)
    return out @ params["o_proj.weight"].T + params["o_proj.bias"]


def padded(lengths, width):
    """Rows of real keys, the first left-padded, the others right-padded (True = real)."""
    real = torch.zeros(len(lengths), width, dtype=torch.bool)
    for row, n in enumerate(lengths):
        if row == 0:
            real[row, width - n:] = True
        else:
            real[row, :n] = True
    return real


@pytest.mark.parametrize("kind", KINDS)
def test_cross_attention_equals_eq14_forward_and_gradients(kind, make_generator):
    g = make_generator()
    attn = module(kind, g)
    x = torch.randn(3, 5, D, generator=g, dtype=torch.float64, requires_grad=True)
    key = torch.randn(3, 7, KDIM, generator=g, dtype=torch.float64, requires_grad=True)
    value = torch.randn(3, 7, VDIM, generator=g, dtype=torch.float64, requires_grad=True)
    real = padded([5, 7, 2], 7)
    got, summary = attn.cross_attention(x, key, value, padding_mask=real)
    params = {name: p.detach().clone().requires_grad_() for name, p in attn.named_parameters()}
    want = reference(params, kind, x, key, value, real)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    inputs = (x, key, value)
    assert_same_gradients(got, want, [*inputs, *attn.parameters()], g, rtol=1e-9, atol=1e-11,
                          ref_params=[*inputs, *params.values()])
    assert rows(summary) == 3


def rows(summary):
    return (summary.key if kind_of(summary) == "softmax" else summary.kv).shape[0]


def kind_of(summary):
    return "softmax" if hasattr(summary, "key") else "eq. 14"


@pytest.mark.parametrize("kind", KINDS)
def test_memory_row_without_real_keys_gives_zero(kind, make_generator):
    """A source row that is all padding gives 0 (eq. 14's empty sums), not NaN, and leaves the
    other rows as they are alone."""
    g = make_generator()
    attn = module(kind, g)
    x = torch.randn(2, 3, D, generator=g, dtype=torch.float64)
    key = torch.randn(2, 4, KDIM, generator=g, dtype=torch.float64)
    value = torch.randn(2, 4, VDIM, generator=g, dtype=torch.float64)
    real = padded([0, 3], 4)
    got, _ = attn.cross_attention(x, key, value, padding_mask=real)
    torch.testing.assert_close(got[0], attn.o_proj.bias.expand(3, D), rtol=0, atol=1e-12)
    alone, _ = attn.cross_attention(x[1:], key[1:, :3], value[1:, :3])
    torch.testing.assert_close(got[1:], alone, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", KINDS)
def test_summary_reused_across_steps_and_beams(kind, make_generator):
    """A summary computed once serves later queries (decoding steps), also after selecting
    beams, as the keys themselves would."""
    g = make_generator()
    attn = module(kind, g)
    key = torch.randn(2, 9, KDIM, generator=g, dtype=torch.float64)
    value = torch.randn(2, 9, VDIM, generator=g, dtype=torch.float64)
    real = padded([4, 9], 9)
    _, summary = attn.cross_attention(torch.randn(2, 1, D, generator=g, dtype=torch.float64), key, value,
                                      padding_mask=real)
    beams = torch.tensor([1, 1, 0])
    step = torch.randn(3, 1, D, generator=g, dtype=torch.float64)
    got, same = attn.cross_attention(step, summary=summary.reorder(beams))
    want = reference(dict(attn.named_parameters()), kind, step, key[beams], value[beams], real[beams])
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    assert rows(same) == 3


def test_value_defaults_to_key(make_generator):
    g = make_generator()
    config = BlockConfig(D, HEADS, attention="momentum", momentum=0.3)
    attn = MultiHeadAttention(config, kdim=KDIM, vdim=KDIM).double()
    x = torch.randn(2, 3, D, generator=g, dtype=torch.float64)
    memory = torch.randn(2, 4, KDIM, generator=g, dtype=torch.float64)
    torch.testing.assert_close(attn.cross_attention(x, memory)[0], attn.cross_attention(x, memory, memory)[0],
                               rtol=0, atol=0)


def test_cross_attention_argument_errors(make_generator):
    g = make_generator()
    attn = module("momentum", g)
    x = torch.randn(1, 2, D, generator=g, dtype=torch.float64)
    key = torch.randn(1, 3, KDIM, generator=g, dtype=torch.float64)
    value = torch.randn(1, 3, VDIM, generator=g, dtype=torch.float64)
    with pytest.raises(ValueError, match="needs key"):
        attn.cross_attention(x)
    _, summary = attn.cross_attention(x, key, value)
    with pytest.raises(ValueError, match="either key/value/padding_mask or a summary"):
        attn.cross_attention(x, key, value, summary=summary)
    for name in ("kdim", "vdim"):
        with pytest.raises(ValueError, match=f"{name} must be an integer >= 1"):
            MultiHeadAttention(BlockConfig(D, HEADS), **{name: 0})

"""The shared block `plugins.transformer` against plain float64 references of the blocks it
replaced (the HF native layer, the copy recipe's post-LN block, fairseq's multi-head momentum
attention): forward and gradients, causal and not, padded batches, the recurrent step, and
argument errors. The references below restate the replaced modules' math and do not call the
block; the attention equations come from the literal quadratic forms of `plugins.attention.naive`
(Momentum Transformer, eq. 13 / eq. 14)."""
import math

import pytest
import torch
import torch.nn.functional as F

from plugins.attention import naive_causal_momentum_attention, naive_noncausal_momentum_attention
from plugins.transformer import BlockConfig, TransformerBlock

ATOL = 1e-12


def linear(params, name, x):
    return x @ params[f"{name}.weight"].T + params[f"{name}.bias"]


def layer_norm(params, name, x, eps=1e-5):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * params[f"{name}.weight"] + params[f"{name}.bias"]


def reference_softmax(q, k, v, causal, real):
    """softmax(q kᵀ / √D) v over the allowed keys; causal outputs at padded queries are 0."""
    n = q.shape[2]
    allowed = real[:, None, None, :].expand(-1, 1, n, -1)
    if causal:
        allowed = allowed & torch.ones(n, n, dtype=torch.bool).tril()
        allowed = allowed | torch.eye(n, dtype=torch.bool)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    out = torch.softmax(scores.masked_fill(~allowed, -math.inf), -1) @ v
    return out * real[:, None, :, None] if causal else out


def reference_attention(params, x, spec, real):
    """Multi-head attention with q_proj / k_proj / v_proj / o_proj (no dropout)."""
    B, N, C = x.shape
    H = spec["heads"]
    q, k, v = (linear(params, f"attention.{p}_proj", x).view(B, N, H, C // H).transpose(1, 2)
               for p in "qkv")
    if spec["attention"] == "softmax":
        out = reference_softmax(q, k, v, spec["causal"], real)
    else:
        beta, gamma = (spec["momentum"], spec["step_size"]) if spec["attention"] == "momentum" else (0.0, 1.0)
        naive = naive_causal_momentum_attention if spec["causal"] else naive_noncausal_momentum_attention
        out = naive(q, k, v, momentum=beta, step_size=gamma, padding_mask=real)
    return linear(params, "attention.o_proj", out.transpose(1, 2).reshape(B, N, C))


def reference_connection(spec, x, update, state):
    """Eq. 15 (v = μ v_prev − A, x' = x − γ v) with constant μ_r or eq. 18's per-token μ_r
    (no gradient through μ_r, 0 at the first block); plain x + A without a connection."""
    kind = spec.get("connection", "none")
    if kind == "none":
        return x + update, None
    if state is None:
        v = -update
    else:
        velocity, previous = state
        if kind == "momentum":
            mu = spec["connection_momentum"]
        else:
            with torch.no_grad():
                change = (update - previous).norm(dim=-1, keepdim=True)
                mu = ((1 - torch.sqrt(change / (previous.norm(dim=-1, keepdim=True) + 1e-6))) ** 2)
                mu = mu.clamp(0.0, 1.0 - spec.get("connection_delta", 1e-3))
        v = mu * velocity - update
    return x - spec["connection_step_size"] * v, (v, update)


def reference_block(params, x, spec, real, state=None):
    """pre-LN: h = conn(x, A(LN(x))), out = h + FFN(LN(h)); post-LN: h = LN(conn(x, A(x))),
    out = LN(h + FFN(h)); FFN(h) = fc_out(act(fc_in h))."""
    act = F.relu if spec["activation"] == "relu" else F.gelu
    pre = spec["norm"] == "pre"
    update = reference_attention(params, layer_norm(params, "attn_norm", x) if pre else x, spec, real)
    h, state = reference_connection(spec, x, update, state)
    if not pre:
        h = layer_norm(params, "attn_norm", h)
    ffn_in = layer_norm(params, "mlp_norm", h) if pre else h
    out = h + linear(params, "mlp.fc_out", act(linear(params, "mlp.fc_in", ffn_in)))
    return (out if pre else layer_norm(params, "mlp_norm", out)), state


def spec_config(spec):
    keys = ("heads", "attention", "causal", "norm", "activation", "connection", "connection_momentum",
            "connection_step_size")
    kwargs = {key: spec[key] for key in keys if key in spec}
    if spec["attention"] == "momentum":
        kwargs.update(momentum=spec["momentum"], step_size=spec["step_size"])
    if kwargs.get("connection") == "adaptive":
        kwargs.pop("connection_momentum", None)
    return BlockConfig(d_model=spec["d_model"], chunk_size=4, **kwargs)


def random_params(module, generator):
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=generator, dtype=torch.float64) * 0.5)


def left_padded(batch, length):
    real = torch.ones(batch, length, dtype=torch.bool)
    real[0, :3] = False
    return real


SPECS = {
    "hf_pre_momentum": dict(attention="momentum", momentum=0.6, step_size=0.8, norm="pre", activation="gelu"),
    "hf_post_adaptive": dict(attention="momentum", momentum=0.3, step_size=1.2, norm="post",
                             activation="gelu", connection="adaptive", connection_step_size=0.9),
    "copy_softmax": dict(attention="softmax", norm="post", activation="relu"),
    "copy_linear": dict(attention="linear", norm="post", activation="relu"),
    "copy_momentum_connection": dict(attention="momentum", momentum=0.1, step_size=0.6, norm="post",
                                     activation="relu", connection="momentum", connection_momentum=0.99,
                                     connection_step_size=0.99),
}


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("name", list(SPECS))
def test_two_blocks_equal_the_reference_forward_and_backward(name, causal, make_generator):
    spec = dict(SPECS[name], d_model=8, heads=2, causal=causal)
    g = make_generator()
    blocks = [TransformerBlock(spec_config(spec)).double() for _ in range(2)]
    for block in blocks:
        random_params(block, g)
    x = torch.randn(2, 7, 8, generator=g, dtype=torch.float64, requires_grad=True)
    real = left_padded(2, 7)
    state, out = None, x
    for block in blocks:
        out, state, _ = block(out, state, padding_mask=real)
    ref_state, ref = None, x
    for block in blocks:
        ref, ref_state = reference_block(dict(block.named_parameters()), ref, spec, real, ref_state)
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=0)
    weight = torch.randn(out.shape, generator=g, dtype=torch.float64)
    params = [x, *(p for block in blocks for p in block.parameters())]
    grads = torch.autograd.grad((out * weight).sum(), params)
    ref_grads = torch.autograd.grad((ref * weight).sum(), params)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


@pytest.mark.parametrize("attention", ["linear", "momentum"])
def test_recurrent_steps_equal_the_parallel_forward(attention, make_generator):
    spec = dict(d_model=8, heads=2, attention=attention, causal=True, norm="pre", activation="gelu")
    if attention == "momentum":
        spec.update(momentum=0.5, step_size=0.7)
    g = make_generator()
    block = TransformerBlock(spec_config(spec)).double()
    random_params(block, g)
    x = torch.randn(2, 6, 8, generator=g, dtype=torch.float64)
    real = left_padded(2, 6)
    whole = block(x, padding_mask=real).hidden
    prefill, state = block(x[:, :4], padding_mask=real[:, :4], recurrent=True)[::2]
    steps = [prefill]
    for i in range(4, 6):
        out, _, state = block(x[:, i:i + 1], padding_mask=real[:, i:i + 1], attention_state=state,
                              recurrent=True)
        steps.append(out)
    torch.testing.assert_close(torch.cat(steps, 1)[real], whole[real], atol=ATOL, rtol=0)


@pytest.mark.parametrize("kwargs, match", [
    (dict(d_model=6, heads=4), "d_model \\(6\\) must be divisible by heads \\(4\\)"),
    (dict(d_model=0, heads=1), "d_model"),
    (dict(heads=0), "heads"),
    (dict(ffn_dim=0), "ffn_dim"),
    (dict(attention="cosine"), "attention"),
    (dict(attention="linear", momentum=0.5), "momentum=0.5 is not read by attention='linear'"),
    (dict(attention="softmax", step_size=2.0), "step_size"),
    (dict(momentum=1.0), "momentum must be in \\[0, 1\\)"),
    (dict(step_size=0.0), "step_size must be > 0"),
    (dict(feature_map="identity"), "feature_map"),
    (dict(causal="yes"), "causal"),
    (dict(norm="mid"), "norm"),
    (dict(activation="swish"), "activation"),
    (dict(hidden_dropout=1.0), "hidden_dropout"),
    (dict(connection="heavy"), "connection"),
    (dict(connection="momentum", connection_momentum=1.5), "connection_momentum"),
])
def test_bad_config_is_refused_naming_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        BlockConfig(**{"d_model": 8, "heads": 2, **kwargs})


def test_defaults_are_the_documented_ones():
    config = BlockConfig(d_model=8, heads=2)
    assert (config.ffn_dim, config.momentum, config.step_size, config.norm) == (32, 0.6, 1.0, "pre")
    assert (config.attention, config.feature_map, config.connection, config.causal) == (
        "momentum", "elu", "none", True)
    assert BlockConfig(d_model=8, heads=2, attention="linear").momentum is None


def test_unsupported_combinations_are_refused():
    x = torch.zeros(1, 3, 8)
    with pytest.raises(ValueError, match="attention='softmax' has no recurrent state"):
        TransformerBlock(BlockConfig(8, 2, attention="softmax"))(x, recurrent=True)
    with pytest.raises(ValueError, match="recurrent=True needs a causal block"):
        TransformerBlock(BlockConfig(8, 2, causal=False))(x, recurrent=True)
    with pytest.raises(ValueError, match="connection_state is carried only"):
        block = TransformerBlock(BlockConfig(8, 2))
        block(x, (x, x))
    with pytest.raises(ValueError, match="config must be a BlockConfig"):
        TransformerBlock({"d_model": 8})

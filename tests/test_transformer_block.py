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
from gradients import assert_same_gradients

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
    assert_same_gradients(out, ref, [x, *(p for block in blocks for p in block.parameters())], g, atol=ATOL)


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


def test_dropout_runs_while_training_only(make_generator):
    """Training with p > 0: each dropout module runs (its masks change the output, and the same
    seed gives the same output); in eval mode, or at p = 0, no dropout module is called at all
    (a decoding step pays for no call) and the output is the block's without dropout."""
    spec = dict(d_model=8, heads=2, attention="momentum", causal=True, norm="pre", activation="gelu",
                chunk_size=4)
    g = make_generator()
    block = TransformerBlock(BlockConfig(**spec, hidden_dropout=0.5, attention_dropout=0.5,
                                         activation_dropout=0.5)).double()
    random_params(block, g)
    plain = TransformerBlock(BlockConfig(**spec)).double()
    plain.load_state_dict(block.state_dict())
    x = torch.randn(2, 5, 8, generator=g, dtype=torch.float64)
    calls = []
    modules = [m for m in (*block.modules(), *plain.modules()) if isinstance(m, torch.nn.Dropout)]
    assert len(modules) == 6
    for module in modules:
        module.register_forward_pre_hook(lambda module, args: calls.append(module))
    block.eval()
    plain.train()
    reference = block(x).hidden
    torch.testing.assert_close(plain(x).hidden, reference, atol=0, rtol=0)
    assert calls == []
    block.train()
    torch.manual_seed(0)
    first = block(x).hidden
    assert len(calls) == 3
    torch.manual_seed(0)
    torch.testing.assert_close(block(x).hidden, first, atol=0, rtol=0)
    assert (first - reference).abs().max() > 1e-3


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
    softmax = TransformerBlock(BlockConfig(8, 2, attention="softmax"))
    softmax.attention.process_group = object()
    with pytest.raises(ValueError, match="attention='softmax' has no context parallelism"):
        softmax(x)
    with pytest.raises(ValueError, match="recurrent=True needs a causal block"):
        TransformerBlock(BlockConfig(8, 2, causal=False))(x, recurrent=True)
    with pytest.raises(ValueError, match="connection_state is carried only"):
        block = TransformerBlock(BlockConfig(8, 2))
        block(x, (x, x))
    with pytest.raises(ValueError, match="config must be a BlockConfig"):
        TransformerBlock({"d_model": 8})


def hf_config(**kwargs):
    from hf_momentum.configuration_momentum_transformer import MomentumTransformerConfig
    base = dict(vocab_size=11, hidden_size=8, num_attention_heads=2, intermediate_size=16, hidden_dropout=0.0,
                attention_momentum=0.6, attention_step_size=0.8)
    return MomentumTransformerConfig(**{**base, **kwargs})


@pytest.mark.parametrize("kwargs, message", [
    (dict(hidden_size=9), r"hidden_size \(9\) must be divisible by num_attention_heads \(2\)"),
    (dict(num_attention_heads=0), "num_attention_heads must be an integer >= 1"),
    (dict(intermediate_size=0), "intermediate_size must be an integer >= 1"),
    (dict(hidden_act="swish2"), "hidden_act must be one of"),
    (dict(attention_momentum=1.0), r"attention_momentum must be in \[0, 1\)"),
    (dict(attention_step_size=0), "attention_step_size must be > 0"),
    (dict(attention_feature_map="tanh"), "attention_feature_map must be one of 'elu', 'relu'"),
    (dict(is_causal="yes"), "is_causal must be True or False"),
    (dict(layer_norm="mid"), "layer_norm must be one of 'pre', 'post'"),
    (dict(layer_norm_eps=0.0), "layer_norm_eps must be > 0"),
    (dict(attention_dropout=1.0), r"attention_dropout must be in \[0, 1\)"),
    (dict(connection="heavy"), "connection must be one of 'none', 'momentum', 'adaptive'"),
    (dict(connection="momentum", connection_momentum=1.5), r"connection_momentum must be in \[0, 1\)"),
    (dict(connection="adaptive", adaptive_delta=0.0), r"adaptive_delta must be in \(0, 1\]"),
])
def test_hf_config_is_checked_by_the_block_naming_its_own_fields(kwargs, message):
    """The HF config's block fields are checked by BlockConfig (written once), and the errors name
    the HF config's fields, never the block's (d_model, heads, norm, ...)."""
    with pytest.raises(ValueError, match="^" + message):
        hf_config(**kwargs)


def test_hf_config_defaults_are_the_ones_saved_configs_hold():
    """The block defaults the HF config now takes from BlockConfig are the values it wrote
    itself before, so configs saved without a field load as they did."""
    from hf_momentum.configuration_momentum_transformer import MomentumTransformerConfig
    config = MomentumTransformerConfig()
    saved = dict(hidden_act="gelu", attention_momentum=0.6, attention_step_size=1.0,
                 attention_feature_map="elu", connection="none", connection_momentum=0.3,
                 connection_step_size=0.9, adaptive_delta=1e-3, attention_dropout=0.0, hidden_dropout=0.1,
                 layer_norm="pre", layer_norm_eps=1e-5, is_causal=True)
    assert {name: getattr(config, name) for name in saved} == saved


@pytest.mark.parametrize("layer_norm, connection, causal", [
    ("pre", "none", True), ("post", "momentum", True), ("pre", "adaptive", False), ("post", "none", False)])
def test_hf_layers_equal_the_reference(layer_norm, connection, causal, make_generator):
    """hf_momentum's MomentumTransformerLayer (its state_dict keys are the block's) with the velocity
    and previous update passed between layers as separate tensors."""
    from hf_momentum.modeling_momentum_transformer import MomentumTransformerLayer
    config = hf_config(layer_norm=layer_norm, connection=connection, is_causal=causal)
    g = make_generator()
    layers = [MomentumTransformerLayer(config, i).double() for i in range(2)]
    for layer in layers:
        random_params(layer, g)
    spec = dict(d_model=8, heads=2, attention="momentum", momentum=0.6, step_size=0.8, causal=causal,
                norm=layer_norm, activation="gelu", connection=connection, connection_momentum=0.3,
                connection_step_size=0.9)
    x = torch.randn(2, 7, 8, generator=g, dtype=torch.float64)
    real = left_padded(2, 7)
    out, velocity, update = x, None, None
    ref, state = x, None
    for layer in layers:
        out, velocity, update = layer(out, velocity, update, padding_mask=real)
        ref, state = reference_block(dict(layer.named_parameters()), ref, spec, real, state)
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=0)


OLD_COPY_NAMES = {"norm1": "attn_norm", "norm2": "mlp_norm", "ffn.0": "mlp.fc_in", "ffn.3": "mlp.fc_out",
                  "attention.out": "attention.o_proj"}


def copy_block_params(model, i):
    """Block i's parameters under the shared block's names (the copy recipe's former names mapped:
    its fused qkv projection split into q, k, v)."""
    prefix, params = f"blocks.{i}.", {}
    for name, p in model.named_parameters():
        if not name.startswith(prefix):
            continue
        name = name[len(prefix):]
        module, leaf = name.rsplit(".", 1)
        if module == "attention.qkv":
            for part, chunk in zip("qkv", p.chunk(3, 0)):
                params[f"attention.{part}_proj.{leaf}"] = chunk
            continue
        params[f"{OLD_COPY_NAMES.get(module, module)}.{leaf}"] = p
    return params


COPY_SPECS = {"softmax": "copy_softmax", "linear": "copy_linear",
              "momentum+connection": "copy_momentum_connection", "adaptive": None}


@pytest.mark.parametrize("name", list(COPY_SPECS))
def test_copy_model_equals_the_reference(name, make_generator):
    from recipes.copy.model import VARIANTS, CopyTransformer
    g = make_generator()
    model = CopyTransformer(VARIANTS[name], n_symbols=5, max_length=9, layers=2, heads=2, head_dim=4).double()
    random_params(model, g)
    tokens = torch.randint(0, 6, (2, 9), generator=g)
    spec = dict(SPECS[COPY_SPECS[name]]) if COPY_SPECS[name] else dict(
        attention="momentum", momentum=0.1, step_size=0.6, norm="post", activation="relu",
        connection="adaptive", connection_step_size=0.99)
    spec.update(d_model=8, heads=2, causal=True)
    params = dict(model.named_parameters())
    x = torch.cat([params["embed.weight"][tokens], model.positions[:9].double().expand(2, 9, -1)], -1)
    state, real = None, torch.ones(2, 9, dtype=torch.bool)
    for i in range(2):
        x, state = reference_block(copy_block_params(model, i), x, spec, real, state)
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), linear(params, "head", x), atol=ATOL, rtol=0)


def test_copy_model_initialisation_is_unchanged():
    """Same seed, same initial weights as the recipe's former block (nn.Linear defaults drawn in
    the order embed, per block fused qkv / out / FFN, head), so a run's results do not move."""
    from recipes.copy.model import VARIANTS, CopyTransformer
    torch.manual_seed(3)
    model = CopyTransformer(VARIANTS["momentum"], n_symbols=5, max_length=9, layers=2, heads=2, head_dim=4)
    torch.manual_seed(3)
    drawn = {"embed.weight": torch.nn.Embedding(6, 4).weight}
    for i in range(2):
        for module, (fan_in, fan_out) in [("attention.qkv", (8, 24)), ("attention.out", (8, 8)),
                                          ("ffn.0", (8, 32)), ("ffn.3", (32, 8))]:
            lin = torch.nn.Linear(fan_in, fan_out)
            drawn.update({f"blocks.{i}.{module}.weight": lin.weight, f"blocks.{i}.{module}.bias": lin.bias})
    head = torch.nn.Linear(8, 6)
    drawn.update({"head.weight": head.weight, "head.bias": head.bias})
    got = dict(model.named_parameters())
    for i in range(2):
        want, have = copy_block_params(_Named(drawn), i), copy_block_params(model, i)
        assert len(want) == 12 and set(want) <= set(have)
        for name in want:
            assert torch.equal(have[name], want[name]), name
    for name in ("embed.weight", "head.weight", "head.bias"):
        assert torch.equal(got[name], drawn[name]), name


class _Named:
    """named_parameters() over a plain dict, for copy_block_params."""

    def __init__(self, params):
        self.params = params

    def named_parameters(self):
        return self.params.items()


@pytest.mark.parametrize("causal", [True, False])
def test_fairseq_attention_equals_the_shared_attention(causal, make_generator):
    """fairseq's MomentumMultiheadAttention (time-first, True = PAD, out_proj) and the block's
    attention (batch-first, True = real, o_proj) on the same weights."""
    pytest.importorskip("fairseq")
    from fairseq_momentum.modules.momentum_attention import MomentumMultiheadAttention
    from plugins.transformer import MultiHeadAttention
    g = make_generator()
    old = MomentumMultiheadAttention(8, 2, causal=causal, momentum=0.4, step_size=0.7, chunk_size=4).double()
    random_params(old, g)
    config = BlockConfig(8, 2, momentum=0.4, step_size=0.7, causal=causal, chunk_size=4)
    new = MultiHeadAttention(config).double()
    new.load_state_dict({name.replace("out_proj", "o_proj"): p for name, p in old.state_dict().items()})
    x = torch.randn(2, 7, 8, generator=g, dtype=torch.float64)
    real = left_padded(2, 7)
    t = x.transpose(0, 1)
    want = old(t, t, t, key_padding_mask=~real)[0].transpose(0, 1)
    got = new(x, padding_mask=real)[0]
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)

"""Stacks whose blocks differ in attention kind (`plugins.transformer.config.layer_configs`) and
the softmax layer's layouts (`plugins.transformer.softmax_mask`): softmax attention against a
float64 loop over Momentum Transformer eq. 1 written here (padded rows, packed documents, a
sliding window, forward and gradients), a hybrid stack's packed rows against each document alone,
its cached steps against its parallel forward, and the configs' checks."""
import math

import pytest
import torch
from gradients import assert_same_gradients

from plugins.packing import Segments
from plugins.transformer import BlockConfig, MultiHeadAttention, TransformerBlock, TransformerStack
from plugins.transformer import config as config_module
from plugins.transformer.config import layer_configs

ATOL = 1e-12


def eq1_reference(q, k, v, real, document, *, causal, window):
    """Eq. 1 query by query: v̂_i = Σ_j softmax_j(q_iᵀ k_j / √D) v_j over the real j of i's
    document, j ≤ i when causal, fewer than `window` real tokens before i. Padded queries give 0."""
    B, H, N, D = q.shape
    out = torch.zeros_like(v)
    for b in range(B):
        rank = torch.cumsum(real[b].long(), 0) - 1
        for i in range(N):
            if not real[b, i]:
                continue
            keys = [j for j in range(N) if real[b, j] and document[b, j] == document[b, i]
                    and (not causal or j <= i) and (window is None or rank[i] - rank[j] < window)]
            for h in range(H):
                scores = torch.stack([q[b, h, i] @ k[b, h, j] for j in keys]) / math.sqrt(D)
                weights = torch.softmax(scores, 0)
                out[b, h, i] = sum(w * v[b, h, j] for w, j in zip(weights, keys))
    return out


def random_module(module, generator):
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=generator, dtype=torch.float64) * 0.5)
    return module


def reference_attention(module, x, real, document, *, causal, window):
    B, N, C = x.shape
    H = module.config.heads

    def heads(proj):
        return proj(x).view(B, N, H, C // H).transpose(1, 2)

    out = eq1_reference(heads(module.q_proj), heads(module.k_proj), heads(module.v_proj), real, document,
                        causal=causal, window=window)
    return module.o_proj(out.transpose(1, 2).reshape(B, N, C))


def layouts(batch, length):
    """(name, real (B, N), document (B, N), Segments): every token real; row 0 left-padded and row 1
    with a hole; documents packed in rows of 9 (3 + 4 + 2, then 5 + 4 with two padded at the end)."""
    full = torch.ones(batch, length, dtype=torch.bool)
    padded = full.clone()
    padded[0, :2] = False
    padded[1, 4] = False
    starts = torch.zeros(batch, length, dtype=torch.bool)
    starts[0, [0, 3, 7]] = True
    starts[1, [0, 5]] = True
    packed_real = full.clone()
    packed_real[1, 7:] = False
    document = torch.cumsum(starts.reshape(-1).long(), 0).reshape(batch, length)
    return [("all real", full, torch.zeros_like(document), None),
            ("padded", padded, torch.zeros_like(document), Segments.from_padding_mask(padded, batch, length)),
            ("packed", packed_real, document, Segments.from_document_starts(starts, packed_real))]


@pytest.mark.parametrize("causal, window", [(True, None), (True, 3), (False, None)])
@pytest.mark.parametrize("layout", ["all real", "padded", "packed"])
def test_softmax_layer_equals_eq1_forward_and_gradients(layout, causal, window, make_generator):
    g = make_generator()
    module = random_module(MultiHeadAttention(BlockConfig(8, 2, attention="softmax", causal=causal,
                                                          sliding_window=window)).double(), g)
    _, real, document, segments = next(item for item in layouts(2, 9) if item[0] == layout)
    x = torch.randn(2, 9, 8, generator=g, dtype=torch.float64, requires_grad=True)
    out, _ = module(x, segments=segments)
    ref = reference_attention(module, x, real, document, causal=causal, window=window)
    torch.testing.assert_close(out[real], ref[real], atol=ATOL, rtol=0)
    if causal or layout == "packed":     # padded positions are 0 before the output projection
        torch.testing.assert_close(out[~real], module.o_proj.bias.expand_as(out[~real]), atol=ATOL, rtol=0)
    weights = real[..., None].to(out.dtype)
    assert_same_gradients(out * weights, ref * weights, [x, *module.parameters()], g, atol=1e-10)


def hybrid_stack(generator, *, kinds=("momentum", "softmax", "linear", "softmax"),
                 windows=(None, 3, None, None), connection="momentum"):
    base = BlockConfig(8, 2, connection=connection, chunk_size=4)
    stack = TransformerStack(TransformerBlock(c) for c in layer_configs(base, kinds, windows))
    return random_module(stack.double(), generator)


@pytest.mark.parametrize("connection", ["none", "momentum"])
def test_hybrid_packed_rows_equal_each_document_alone(connection, make_generator):
    g = make_generator()
    stack = hybrid_stack(g, connection=connection)
    _, real, document, segments = layouts(2, 9)[2]
    x = torch.randn(2, 9, 8, generator=g, dtype=torch.float64)
    packed = stack(x, segments=segments).hidden
    for b in range(2):
        for d in document[b][real[b]].unique():
            where = (document[b] == d) & real[b]
            alone = stack(x[b, where][None]).hidden[0]
            torch.testing.assert_close(packed[b, where], alone, atol=1e-10, rtol=0)


def test_hybrid_padded_rows_equal_each_row_alone(make_generator):
    g = make_generator()
    stack = hybrid_stack(g)
    _, real, _, segments = layouts(2, 9)[1]
    x = torch.randn(2, 9, 8, generator=g, dtype=torch.float64)
    padded = stack(x, segments=segments).hidden
    for b in range(2):
        alone = stack(x[b, real[b]][None]).hidden[0]
        torch.testing.assert_close(padded[b, real[b]], alone, atol=1e-10, rtol=0)


def test_hybrid_cached_steps_equal_the_parallel_forward(make_generator):
    g = make_generator()
    stack = hybrid_stack(g, windows=(None, 2, None, None))
    _, real, _, segments = layouts(2, 9)[1]
    x = torch.randn(2, 9, 8, generator=g, dtype=torch.float64)
    whole = stack(x, segments=segments).hidden
    states, outs = [None] * len(stack), []
    for start, stop in [(0, 4), (4, 5), (5, 6), (6, 9)]:
        segments = Segments.from_padding_mask(real[:, start:stop], 2, stop - start)
        out = stack(x[:, start:stop], segments=segments, attention_states=states)
        outs.append(out.hidden)
    torch.testing.assert_close(torch.cat(outs, 1)[real], whole[real], atol=1e-10, rtol=0)


def test_layer_configs_share_one_checked_config_per_kind(monkeypatch):
    base = BlockConfig(8, 2, momentum=0.3)
    calls = []
    original = config_module.BlockConfig.__post_init__
    monkeypatch.setattr(config_module.BlockConfig, "__post_init__",
                        lambda self: (calls.append(1), original(self)))
    kinds = ["momentum", "softmax", "momentum", "softmax", "softmax", "linear"]
    configs = layer_configs(base, kinds, [None, None, None, None, 16, None])
    assert len(calls) == 3        # softmax, sliding softmax, linear; the momentum layers are base itself
    assert configs[0] is base and configs[2] is base and configs[1] is configs[3]
    assert [c.attention for c in configs] == kinds
    assert configs[4].sliding_window == 16 and configs[1].sliding_window is None
    assert configs[1].momentum is None and configs[5].step_size is None
    assert layer_configs(BlockConfig(8, 2, attention="softmax"), ["momentum"])[0].momentum == 0.6


@pytest.mark.parametrize("kinds, windows, match", [
    (["momentum", "attention"], None, "attention of layer 1 must be one of"),
    ("momentum", None, "non-empty list"),
    ([], None, "non-empty list"),
    (["momentum", "softmax"], [None], "sliding_windows has 1 entries for 2 layers"),
    (["momentum", "softmax"], [4, None], "sliding_window=4 is read by causal softmax attention only"),
    (["softmax"], [0], "sliding_window"),
])
def test_layer_configs_refuse_bad_kinds_naming_them(kinds, windows, match):
    with pytest.raises(ValueError, match=match):
        layer_configs(BlockConfig(8, 2), kinds, windows)


def test_sliding_window_is_refused_where_it_is_not_read():
    with pytest.raises(ValueError, match="sliding_window=4 is read by causal softmax attention only"):
        BlockConfig(8, 2, attention="softmax", causal=False, sliding_window=4)

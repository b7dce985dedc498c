"""The KV cache of the shared block's softmax attention (`plugins.transformer.kv_cache`): steps of
any length continued through the cache against a float64 loop over eq. 1 of the Momentum
Transformer (v̂_i = Σ_j softmax(q_iᵀ k_j / √D) v_j over the real positions j ≤ i), forward and
gradients, padded batches, the whole block, and misuse."""
import math

import pytest
import torch
from gradients import assert_same_gradients

from plugins.attention import MomentumAttentionState
from plugins.transformer import BlockConfig, KeyValueCache, MultiHeadAttention, TransformerBlock

ATOL = 1e-12
SPLITS = [(0, 3), (3, 4), (4, 5), (5, 7), (7, 8)]   # a prefill, single steps and a chunk of 2


def eq1_loop(q, k, v, real):
    """Causal eq. 1 position by position: position i over the real j ≤ i and itself; a padded
    position's output is 0."""
    B, H, N, D = q.shape
    out = torch.zeros_like(v)
    for b in range(B):
        for i in range(N):
            if not real[b, i]:
                continue
            keys = [j for j in range(i + 1) if real[b, j]]
            for h in range(H):
                scores = torch.stack([q[b, h, i] @ k[b, h, j] for j in keys]) / math.sqrt(D)
                weights = torch.softmax(scores, 0)
                out[b, h, i] = sum(w * v[b, h, j] for w, j in zip(weights, keys))
    return out


def reference_attention(module, x, real):
    B, N, C = x.shape
    H = module.config.heads

    def heads(proj):
        return proj(x).view(B, N, H, C // H).transpose(1, 2)

    out = eq1_loop(heads(module.q_proj), heads(module.k_proj), heads(module.v_proj), real)
    return module.o_proj(out.transpose(1, 2).reshape(B, N, C))


def padded_mask(batch, length):
    """Row 0 left-padded, row 1 with a hole in the middle (a padded position inside the cache)."""
    real = torch.ones(batch, length, dtype=torch.bool)
    real[0, :2] = False
    real[1, 4] = False
    return real


def random_module(module, generator):
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=generator, dtype=torch.float64) * 0.5)
    return module


def softmax_attention(**kwargs):
    return MultiHeadAttention(BlockConfig(d_model=8, heads=2, attention="softmax", **kwargs))


def stepped(module, x, real, splits=SPLITS):
    """The attention of x run through the cache over `splits`, concatenated, and the last state."""
    state, outs = None, []
    for start, stop in splits:
        out, state = module(x[:, start:stop], padding_mask=None if real is None else real[:, start:stop],
                            state=state, recurrent=True)
        outs.append(out)
    return torch.cat(outs, 1), state


@pytest.mark.parametrize("padded", [False, True])
def test_cached_steps_equal_eq1_forward_and_gradients(padded, make_generator):
    g = make_generator()
    module = random_module(softmax_attention().double(), g)
    x = torch.randn(3, 8, 8, generator=g, dtype=torch.float64, requires_grad=True)
    real = padded_mask(3, 8) if padded else torch.ones(3, 8, dtype=torch.bool)
    out, state = stepped(module, x, real if padded else None)
    ref = reference_attention(module, x, real)
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=0)
    assert isinstance(state, KeyValueCache) and state.length == 8
    assert state.real is None if not padded else torch.equal(state.real, real)
    assert_same_gradients(out, ref, [x, *module.parameters()], g, atol=ATOL)


@pytest.mark.parametrize("connection", ["none", "momentum"])
def test_block_steps_equal_the_parallel_block(connection, make_generator):
    g = make_generator()
    config = BlockConfig(d_model=8, heads=2, attention="softmax", connection=connection)
    blocks = [random_module(TransformerBlock(config).double(), g) for _ in range(2)]
    x = torch.randn(2, 7, 8, generator=g, dtype=torch.float64)
    real = padded_mask(2, 7)
    whole, conn = x, None
    for block in blocks:
        whole, conn, _ = block(whole, conn, padding_mask=real)
    states, outs = [None, None], []
    for start, stop in [(0, 4), (4, 5), (5, 7)]:
        h, conn = x[:, start:stop], None
        for i, block in enumerate(blocks):
            h, conn, states[i] = block(h, conn, padding_mask=real[:, start:stop], attention_state=states[i],
                                       recurrent=True)
        outs.append(h)
    torch.testing.assert_close(torch.cat(outs, 1)[real], whole[real], atol=ATOL, rtol=0)


def test_reorder_selects_rows(make_generator):
    g = make_generator()
    module = random_module(softmax_attention().double(), g)
    x = torch.randn(3, 5, 8, generator=g, dtype=torch.float64)
    real = padded_mask(3, 5)
    _, state = stepped(module, x[:, :4], real[:, :4], splits=[(0, 4)])
    index = torch.tensor([2, 0])
    last, _ = module(x[index, 4:], padding_mask=real[index, 4:], state=state.reorder(index), recurrent=True)
    whole, _ = module(x[index], padding_mask=real[index])
    torch.testing.assert_close(last, whole[:, 4:], atol=ATOL, rtol=0)


def test_misuse_is_refused_with_a_clear_error():
    softmax = softmax_attention()
    x = torch.zeros(2, 3, 8)
    _, state = softmax(x, recurrent=True)
    with pytest.raises(ValueError, match="state is continued only with recurrent=True"):
        softmax(x, state=state)
    with pytest.raises(TypeError, match="state of attention='softmax' must be a KeyValueCache"):
        softmax(x, state=MomentumAttentionState.zeros(2, 2, 4, 4, dtype=torch.float32, device="cpu"),
                recurrent=True)
    with pytest.raises(ValueError, match=r"state holds \(batch, heads, Dk, Dv, dtype, device\)"):
        softmax(torch.zeros(1, 1, 8), state=state, recurrent=True)
    with pytest.raises(ValueError, match="padding_mask must be a bool tensor"):
        softmax(x, padding_mask=torch.ones(2, 3), recurrent=True)
    with pytest.raises(ValueError, match="recurrent=True needs a causal block"):
        softmax_attention(causal=False)(x, recurrent=True)
    with pytest.raises(ValueError, match="state must be a MomentumAttentionState"):
        MultiHeadAttention(BlockConfig(d_model=8, heads=2))(x, state=state, recurrent=True)
    with pytest.raises(ValueError, match="state must have key"):
        KeyValueCache(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 4, 4))
    with pytest.raises(ValueError, match=r"state.real must have shape \(B, N\)"):
        KeyValueCache(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4), torch.ones(1, 4, dtype=torch.bool))

"""The core TransformerStack (plugins/transformer/stack.py) and the HF model built on it: one
block spec per model, checked once and shared by every layer."""
import pytest
import torch

from hf_momentum import MomentumTransformerConfig, MomentumTransformerForCausalLM
from plugins.transformer import BlockConfig, TransformerBlock, TransformerStack
from plugins.transformer.config import BlockConfig as CoreBlockConfig


def small_config(layers, **kwargs):
    return MomentumTransformerConfig(vocab_size=50, hidden_size=16, num_hidden_layers=layers,
                                     num_attention_heads=2, max_position_embeddings=64, **kwargs)


@pytest.mark.parametrize("layers", [1, 2, 5])
def test_building_a_model_checks_its_block_spec_once(layers, monkeypatch):
    config = small_config(layers, connection="adaptive")
    calls = []
    original = CoreBlockConfig.__post_init__

    def counted(self):
        calls.append(type(self).__name__)
        original(self)

    monkeypatch.setattr(CoreBlockConfig, "__post_init__", counted)
    model = MomentumTransformerForCausalLM(config)
    assert len(calls) == 1
    specs = {id(layer.config) for layer in model.model.layers}
    specs |= {id(layer.attention.config) for layer in model.model.layers}
    assert specs == {id(model.model.block)}


def test_a_bad_value_set_after_the_config_is_still_refused_when_the_model_is_built():
    config = small_config(2)
    config.attention_momentum = 1.5
    with pytest.raises(ValueError, match="attention_momentum"):
        MomentumTransformerForCausalLM(config)


def loop_reference(blocks, x, padding_mask, states=None):
    """The loop every integration used to write: the connection state handed on, the states
    continued when given."""
    connection, outs = None, [x]
    for i, block in enumerate(blocks):
        x, connection, state = block(x, connection, padding_mask=padding_mask,
                                     attention_state=None if states is None else states[i],
                                     recurrent=states is not None)
        if states is not None:
            states[i] = state
        outs.append(x)
    return outs, states


@pytest.mark.parametrize("connection", ["none", "momentum", "adaptive"])
def test_stack_equals_the_loop_over_its_blocks(connection, make_generator):
    torch.manual_seed(0)
    spec = BlockConfig(d_model=8, heads=2, connection=connection, hidden_dropout=0.0)
    stack = TransformerStack(TransformerBlock(spec) for _ in range(3)).double()
    g = make_generator()
    x = torch.randn(2, 11, 8, generator=g, dtype=torch.float64)
    real = torch.ones(2, 11, dtype=torch.bool)
    real[0, :4] = False
    final = torch.nn.LayerNorm(8).double()
    out = stack(x, padding_mask=real, final=final, output_hidden_states=True)
    ref, _ = loop_reference(stack, x, real)
    ref[-1] = final(ref[-1])
    torch.testing.assert_close(out.hidden, ref[-1], rtol=0, atol=0)
    assert len(out.hidden_states) == 4
    for got, want in zip(out.hidden_states, ref):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert out.attention_states is None
    assert stack(x, padding_mask=real).hidden_states is None


def test_stack_continues_the_attention_states_of_its_blocks(make_generator):
    """Recurrent: prefix then one token through the stack equals the whole sequence at once."""
    spec = BlockConfig(d_model=8, heads=2, connection="momentum", hidden_dropout=0.0)
    torch.manual_seed(1)
    stack = TransformerStack(TransformerBlock(spec) for _ in range(2)).double()
    g = make_generator()
    x = torch.randn(1, 6, 8, generator=g, dtype=torch.float64)
    whole = stack(x).hidden
    states = [None, None]
    first = stack(x[:, :5], attention_states=states)
    assert first.attention_states is states and all(s is not None for s in states)
    last = stack(x[:, 5:], attention_states=states).hidden
    torch.testing.assert_close(torch.cat([first.hidden, last], dim=1), whole, rtol=1e-10, atol=1e-10)


def test_the_hf_model_keeps_its_state_dict_keys():
    model = MomentumTransformerForCausalLM(small_config(2))
    keys = set(model.state_dict())
    assert "model.layers.1.attention.q_proj.weight" in keys
    assert "model.norm.weight" in keys
    assert not any(".stack." in key or ".block." in key for key in keys)

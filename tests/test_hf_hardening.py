"""Adversarial inputs to the native families (issue 11, items 1–5 and 8): every case is either
correct (checked against a cache-free forward of the whole sequence) or refused early with a
ValueError naming the argument."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

import hf_momentum
from hf_momentum import (
    MomentumCache,
    MomentumLSTMCache,
    MomentumLSTMForCausalLM,
    MomentumLSTMModel,
    MomentumTransformerForCausalLM,
    MomentumTransformerModel,
)
from hf_momentum.modeling_momentum_transformer import MomentumTransformerLayer
from plugins.rnn.variants import unread_hyperparameters

PAD = 0
FAMILIES = ["transformer", "lstm"]


def config(family, **kwargs):
    if family == "transformer":
        base = dict(vocab_size=60, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=32, max_position_embeddings=64, hidden_dropout=0.0,
                    attention_momentum=0.5, connection="adaptive", pad_token_id=PAD, bos_token_id=1,
                    eos_token_id=2)
        return AutoConfig.for_model("momentum_transformer", **{**base, **kwargs})
    base = dict(vocab_size=60, hidden_size=16, num_hidden_layers=2, cell="momentum", momentum=0.5,
                pad_token_id=PAD, bos_token_id=1, eos_token_id=2, initializer_range=0.5)
    if "momentum" in unread_hyperparameters(kwargs.get("cell", "momentum")):
        del base["momentum"]       # a value the cell would ignore is refused
    return AutoConfig.for_model("momentum_lstm", **{**base, **kwargs})


def causal_lm(family, **kwargs):
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config(family, **kwargs)).eval()


def left_padded(generator, lengths, total):
    ids = torch.randint(3, 60, (len(lengths), total), generator=generator)
    mask = torch.zeros(len(lengths), total, dtype=torch.long)
    for row, n in enumerate(lengths):
        mask[row, total - n:] = 1
    ids[mask == 0] = PAD
    return ids, mask


# Item 1: a mask over the new tokens only would restart positions at 0.

@pytest.mark.parametrize("family", FAMILIES)
def test_decoding_step_with_the_full_mask_equals_the_whole_sequence(family, make_generator):
    model = causal_lm(family)
    ids, mask = left_padded(make_generator(), [6, 3], 7)
    with torch.no_grad():
        whole = model(input_ids=ids, attention_mask=mask, use_cache=False).logits[:, -1]
        cache = model(input_ids=ids[:, :-1], attention_mask=mask[:, :-1], use_cache=True).past_key_values
        step = model(input_ids=ids[:, -1:], attention_mask=mask, past_key_values=cache).logits[:, -1]
    torch.testing.assert_close(step, whole, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
def test_mask_over_the_new_tokens_only_is_refused(family, make_generator):
    model = causal_lm(family)
    ids, mask = left_padded(make_generator(), [6, 3], 7)
    with torch.no_grad():
        cache = model(input_ids=ids[:, :-1], attention_mask=mask[:, :-1]).past_key_values
        with pytest.raises(ValueError, match=r"attention_mask must have shape .*\(2, 7\).* 6 cached and 1"):
            model(input_ids=ids[:, -1:], attention_mask=mask[:, -1:], past_key_values=cache)
        with pytest.raises(ValueError, match="attention_mask"):
            model(input_ids=ids[:, -1:], attention_mask=torch.ones(2, 9, dtype=torch.long),
                  past_key_values=cache)
        with pytest.raises(ValueError, match="attention_mask must be a 2D"):
            model(input_ids=ids, attention_mask=mask[:, None, None])


def test_positions_after_a_padded_prefix_need_the_mask(make_generator):
    model = causal_lm("transformer")
    ids, mask = left_padded(make_generator(), [6, 3], 7)
    with torch.no_grad():
        cache = model(input_ids=ids[:, :-1], attention_mask=mask[:, :-1]).past_key_values
        with pytest.raises(ValueError, match="attention_mask over all cached"):
            model(input_ids=ids[:, -1:], past_key_values=cache)
        unpadded = model(input_ids=ids[:1, :-1]).past_key_values
        step = model(input_ids=ids[:1, -1:], past_key_values=unpadded).logits[:, -1]
        whole = model(input_ids=ids[:1], use_cache=False).logits[:, -1]
    torch.testing.assert_close(step, whole, atol=1e-5, rtol=1e-4)


# Item 2: use_cache=False with past_key_values continues the cache.

@pytest.mark.parametrize("family", FAMILIES)
def test_use_cache_false_still_continues_a_given_cache(family, make_generator):
    model = causal_lm(family)
    ids = torch.randint(3, 60, (2, 8), generator=make_generator())
    with torch.no_grad():
        whole = model(input_ids=ids, use_cache=False).logits[:, 5:]
        cache = model(input_ids=ids[:, :5], use_cache=True).past_key_values
        out = model(input_ids=ids[:, 5:], past_key_values=cache, use_cache=False)
    torch.testing.assert_close(out.logits, whole, atol=1e-5, rtol=1e-4)
    assert out.past_key_values is cache and cache.get_seq_length() == 8


@pytest.mark.parametrize("family", FAMILIES)
def test_generate_refuses_use_cache_false_with_a_cache(family):
    model = causal_lm(family)
    ids = torch.arange(3, 9)[None]
    cache = (MomentumCache if family == "transformer" else MomentumLSTMCache)(model.config)
    with pytest.raises(ValueError, match="use_cache=False"):
        model.generate(ids, past_key_values=cache, use_cache=False, max_new_tokens=2, pad_token_id=PAD)


@pytest.mark.parametrize("family", FAMILIES)
def test_wrong_cache_type_and_checkpointed_training_with_a_cache_are_refused(family):
    model = causal_lm(family)
    ids = torch.arange(3, 9)[None]
    other = MomentumLSTMCache if family == "transformer" else MomentumCache
    with pytest.raises(ValueError, match="past_key_values must be a"):
        model(input_ids=ids, past_key_values=other(model.config))
    with pytest.raises(ValueError, match="use_cache must be True or False"):
        model(input_ids=ids, use_cache="no")
    cache = model(input_ids=ids).past_key_values
    model.activation_checkpointing_enable()
    model.train()
    with pytest.raises(ValueError, match="gradient checkpointing"):
        model(input_ids=ids, past_key_values=cache)


# Item 3: keyword overrides, non-finite numbers, bools as numbers.

@pytest.mark.parametrize("family, override, argument", [
    ("transformer", dict(connection="bogus"), "connection"),
    ("transformer", dict(layer_norm="mid"), "layer_norm"),
    ("transformer", dict(is_causal="false"), "is_causal"),
    ("transformer", dict(initializer_range=float("inf")), "initializer_range"),
    ("transformer", dict(attention_momentum=True), "attention_momentum"),
    ("transformer", dict(attention_step_size=float("nan")), "attention_step_size"),
    ("transformer", dict(attention_feature_map="identity"), "attention_feature_map"),
    ("transformer", dict(hidden_act="swish2"), "hidden_act"),
    ("lstm", dict(momentum=float("nan")), "momentum"),
    ("lstm", dict(dropout=True), "dropout"),
    ("lstm", dict(initializer_range=float("inf")), "initializer_range"),
    ("lstm", dict(step_size=-float("inf")), "step_size"),
])
def test_from_pretrained_overrides_are_validated(family, override, argument, tmp_path):
    causal_lm(family).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=argument):
        AutoModelForCausalLM.from_pretrained(tmp_path, **override)


@pytest.mark.parametrize("family, kwargs, argument", [
    ("transformer", dict(initializer_range=float("inf")), "initializer_range"),
    ("transformer", dict(connection_momentum=True), "connection_momentum"),
    ("transformer", dict(layer_norm_eps=float("nan")), "layer_norm_eps"),
    ("transformer", dict(num_attention_heads=True), "num_attention_heads"),
    ("transformer", dict(use_cache="yes"), "use_cache"),
    ("lstm", dict(eps=float("inf")), "eps"),
    ("lstm", dict(hidden_size=True), "hidden_size"),
    ("lstm", dict(beta=float("nan")), "beta"),
])
def test_configs_refuse_non_finite_numbers_and_bools(family, kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        config(family, **kwargs)


@pytest.mark.parametrize("field", ["output_hidden_states", "return_dict", "output_attentions",
                                   "is_encoder_decoder"])
@pytest.mark.parametrize("family", FAMILIES)
def test_bool_fields_refuse_strings(family, field):
    """transformers' own bool fields too: "False" is a truthy string, so return_dict="False"
    would return a dict and output_hidden_states="False" the hidden states."""
    with pytest.raises(ValueError, match=f"{field} must be True or False, got str 'False'"):
        causal_lm(family, **{field: "False"})     # the config, or at the latest the model, refuses it
    assert getattr(config(family, **{field: False}), field) is False


@pytest.mark.parametrize("cell, field, value", [
    ("lstm", "momentum", 0.9), ("lstm", "step_size", 0.5), ("lstm", "beta", 0.5), ("lstm", "eps", 1e-3),
    ("momentum", "beta", 0.5), ("momentum", "eps", 1e-3), ("rmsprop", "momentum", 0.3),
    ("nag", "momentum", 0.3), ("sr", "beta", 0.99),
])
def test_a_hyperparameter_the_cell_ignores_is_refused(cell, field, value):
    """cell="lstm" with momentum=0.9 built a plain LSTM and dropped the 0.9 silently."""
    restart = dict(restart=4) if cell == "sr" else {}
    needle = rf"{field}={value!r} is not read by cell={cell!r} and would be ignored; leave {field} at"
    with pytest.raises(ValueError, match=needle):
        config("lstm", cell=cell, **{field: value}, **restart)
    config("lstm", cell=cell, **restart)      # its default is fine
    if cell == "lstm":
        config("lstm", cell="adam", **{field: value})      # a cell that reads it takes it


@pytest.mark.parametrize("family", FAMILIES)
def test_model_init_validates_a_config_changed_after_construction(family):
    cfg = config(family)
    if family == "transformer":
        cfg.connection = "bogus"
        with pytest.raises(ValueError, match="connection"):
            MomentumTransformerForCausalLM(cfg)
    else:
        cfg.momentum = float("inf")
        with pytest.raises(ValueError, match="momentum"):
            MomentumLSTMForCausalLM(cfg)


@pytest.mark.parametrize("field, value", [("connection", "bogus"), ("layer_norm", "mid")])
def test_choice_dispatch_raises_on_unknown_values(field, value):
    cfg = config("transformer")
    setattr(cfg, field, value)
    with pytest.raises(ValueError, match=field):
        MomentumTransformerLayer(cfg, 0)


def test_post_layer_norm_keeps_no_final_norm_and_pre_keeps_it(tmp_path):
    pre = MomentumTransformerModel(config("transformer", layer_norm="pre"))
    post = MomentumTransformerModel(config("transformer", layer_norm="post"))
    assert any(k.startswith("norm.") for k in pre.state_dict())
    assert not any(k.startswith("norm.") for k in post.state_dict())


# Item 4: "identity" on raw projections would divide by negative denominators.

def test_identity_feature_map_is_refused_everywhere():
    with pytest.raises(ValueError, match="attention_feature_map 'identity'.*negative"):
        config("transformer", attention_feature_map="identity")
    with pytest.raises(ValueError, match="attention_feature_map 'identity'"):
        hf_momentum.set_momentum_attention(AutoConfig.for_model("llama"), feature_map="identity")
    stock = AutoConfig.for_model("llama", vocab_size=60, hidden_size=16, intermediate_size=32,
                                 num_hidden_layers=1, num_attention_heads=2)
    model = AutoModelForCausalLM.from_config(stock, attn_implementation="momentum").eval()
    model.config.attention_feature_map = "identity"
    with pytest.raises(ValueError, match="attention_feature_map 'identity'"):
        model(input_ids=torch.arange(3, 8)[None])


@pytest.mark.parametrize("feature_map", ["elu", "relu"])
def test_kept_feature_maps_give_bounded_outputs_on_negative_projections(feature_map, make_generator):
    """elu+1 and relu are non-negative, so eq. 12's normaliser is ≥ eps > 0 even when every q, k
    entry is negative; the output stays finite and of the order of v."""
    from hf_momentum.momentum_core import momentum_attention
    g = make_generator()
    q = -torch.rand(2, 2, 9, 4, generator=g, dtype=torch.float64) - 0.1
    k = -torch.rand(2, 2, 9, 4, generator=g, dtype=torch.float64) - 0.1
    v = torch.randn(2, 2, 9, 4, generator=g, dtype=torch.float64)
    out = momentum_attention(q, k, v, momentum=0.0, feature_map=feature_map)
    assert out.isfinite().all()
    if feature_map == "elu":
        assert out.abs().max() <= v.abs().max() * (1 + 1e-9)


# Item 5: encoders with default use_cache; empty prompts.

def test_encoder_config_with_defaults_runs_a_plain_call(make_generator):
    model = MomentumTransformerModel(config("transformer", is_causal=False)).eval()
    assert model.config.use_cache is True
    ids = torch.randint(3, 60, (2, 6), generator=make_generator())
    with torch.no_grad():
        out = model(ids)
        again = model(ids, use_cache=False)
    assert out.past_key_values is None
    torch.testing.assert_close(out.last_hidden_state, again.last_hidden_state, rtol=0, atol=0)
    with pytest.raises(ValueError, match="use_cache"):
        model(ids, use_cache=True)
    with pytest.raises(ValueError, match="past_key_values"):
        model(ids, past_key_values=MomentumCache(model.config))


@pytest.mark.parametrize("family", FAMILIES)
def test_empty_prompt_forward_then_continue(family, make_generator):
    model = causal_lm(family)
    ids = torch.randint(3, 60, (2, 4), generator=make_generator())
    empty = ids[:, :0]
    with torch.no_grad():
        out = model(input_ids=empty, attention_mask=torch.ones(2, 0, dtype=torch.long))
        assert out.logits.shape == (2, 0, 60) and out.past_key_values.get_seq_length() == 0
        cont = model(input_ids=ids, past_key_values=out.past_key_values).logits
        whole = model(input_ids=ids, use_cache=False).logits
    torch.testing.assert_close(cont, whole, atol=1e-5, rtol=1e-4)
    if family == "transformer":
        encoder = MomentumTransformerModel(config(family, is_causal=False)).eval()
        assert encoder(empty).last_hidden_state.shape == (2, 0, 16)
    with pytest.raises(ValueError, match="at least one token"):
        model.generate(empty, max_new_tokens=2, pad_token_id=PAD)


# Item 8: one mixin; logits_to_keep as an int or a tensor of positions.

@pytest.mark.parametrize("family", FAMILIES)
def test_logits_to_keep_int_and_tensor(family, make_generator):
    model = causal_lm(family)
    ids = torch.randint(3, 60, (2, 7), generator=make_generator())
    with torch.no_grad():
        full = model(input_ids=ids, use_cache=False).logits
        last2 = model(input_ids=ids, use_cache=False, logits_to_keep=2).logits
        picked = model(input_ids=ids, use_cache=False, logits_to_keep=torch.tensor([0, 4, 6])).logits
    torch.testing.assert_close(last2, full[:, -2:], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(picked, full[:, [0, 4, 6]], rtol=1e-5, atol=1e-6)
    for bad in (-1, True, torch.tensor([[0, 1]]), torch.tensor([0.5])):
        with pytest.raises(ValueError, match="logits_to_keep"):
            model(input_ids=ids, logits_to_keep=bad)


def test_causal_lm_glue_is_one_mixin():
    from hf_momentum.modeling_common import RecurrentCausalLMMixin
    for name in ("get_input_embeddings", "set_input_embeddings", "get_output_embeddings",
                 "set_output_embeddings", "causal_lm_output", "_prepare_cache_for_generation", "generate"):
        assert getattr(MomentumTransformerForCausalLM, name) is getattr(RecurrentCausalLMMixin, name)
        assert getattr(MomentumLSTMForCausalLM, name) is getattr(RecurrentCausalLMMixin, name)
    for family in FAMILIES:
        model = causal_lm(family)
        new = torch.nn.Embedding(60, 16)
        model.set_input_embeddings(new)
        assert model.get_input_embeddings() is new and model.model.embed_tokens is new
        assert model.get_output_embeddings() is model.lm_head
    assert issubclass(MomentumLSTMModel, hf_momentum.MomentumLSTMPreTrainedModel)


@pytest.mark.parametrize("connection, field, value", [
    ("none", "connection_momentum", 0.5), ("none", "connection_step_size", 0.5),
    ("none", "adaptive_delta", 0.1), ("momentum", "adaptive_delta", 0.1),
    ("adaptive", "connection_momentum", 0.5),
])
def test_connection_value_the_connection_never_reads_is_refused(connection, field, value):
    from hf_momentum import MomentumTransformerConfig

    with pytest.raises(ValueError, match=f"{field}={value} is not read by connection='{connection}'"):
        MomentumTransformerConfig(connection=connection, **{field: value})
    MomentumTransformerConfig(connection=connection)                     # the defaults stay accepted
    reader = {"connection_momentum": "momentum", "connection_step_size": "momentum",
              "adaptive_delta": "adaptive"}[field]
    assert getattr(MomentumTransformerConfig(connection=reader, **{field: value}), field) == value

"""Configs of the native families: keyword overrides of from_pretrained, non-finite numbers and
bools, hyperparameters the cell or connection never reads, unknown choices, layer-norm placement
and the refused "identity" feature map — each refused early with a ValueError naming the field."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from helpers.hf_tiny_models import FAMILIES, causal_lm, config
from transformers import AutoConfig, AutoModelForCausalLM

import hf_momentum
from hf_momentum import (
    MomentumLSTMForCausalLM,
    MomentumTransformerForCausalLM,
    MomentumTransformerModel,
)
from hf_momentum.modeling_momentum_transformer import MomentumTransformerLayer

# Keyword overrides, non-finite numbers, bools as numbers.

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
    ("transformer", dict(classifier_dropout=1.5), "classifier_dropout"),
    ("lstm", dict(classifier_dropout=-0.5), "classifier_dropout"),
    ("transformer", dict(activation_dropout=1.0), "activation_dropout"),
    ("transformer", dict(scale_embedding="yes"), "scale_embedding"),
    ("transformer", dict(embedding_layer_norm=1), "embedding_layer_norm"),
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


# "identity" on raw projections would divide by negative denominators.

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

"""Hybrid copy-task models (issue 29): --layer-types puts softmax attention in its
"full_attention" layers and keeps the variant's attention elsewhere; without it the model is
unchanged; bad lists are refused at parsing and at config construction; a tiny hybrid run
records its layer types. Also the core mapping from transformers' vocabulary."""
import json

import pytest
import torch

from plugins.transformer.config import kinds_from_layer_types
from recipes.copy import run as copy_run
from recipes.copy.config import configure
from recipes.copy.model import VARIANTS, CopyTransformer

SIZES = dict(n_symbols=5, max_length=12, layers=3, heads=2, head_dim=4)


def copy_model(name, seed=0, **overrides):
    torch.manual_seed(seed)
    return CopyTransformer(VARIANTS[name], **{**SIZES, **overrides}).double().eval()


def test_linear_attention_is_the_models_own_kind_and_full_attention_softmax():
    for own in ("softmax", "linear", "momentum"):
        assert kinds_from_layer_types(["full_attention", "linear_attention"], own) == ("softmax", own)
    with pytest.raises(ValueError, match="--layer-types: each entry must be one of linear_attention, "
                                         "full_attention, got 'sliding'"):
        kinds_from_layer_types(["linear_attention", "sliding"], "momentum", name="--layer-types")
    with pytest.raises(ValueError, match="layer_types has 1 entries but the model has 2 layers"):
        kinds_from_layer_types(["linear_attention"], "momentum", layers=2)
    with pytest.raises(ValueError, match="layer_types must be a non-empty list"):
        kinds_from_layer_types("full_attention", "momentum")


@pytest.mark.parametrize("name", ["momentum", "momentum+connection", "linear"])
def test_full_attention_layers_are_softmax_and_the_others_the_variants(name):
    variant = VARIANTS[name]
    model = copy_model(name, layer_types=["linear_attention", "full_attention", "linear_attention"])
    plain = copy_model(name)
    configs = [block.config for block in model.blocks]
    assert [c.attention for c in configs] == [variant.attention, "softmax", variant.attention]
    assert configs[0] == plain.blocks[0].config and configs[2] == plain.blocks[2].config
    assert configs[1].connection == plain.blocks[1].config.connection
    assert configs[1].momentum is None and configs[1].step_size is None


def test_a_variant_with_every_layer_full_attention_is_the_softmax_model():
    """Same seed, same weights: the momentum variant with softmax in every layer computes what the
    softmax variant computes (a wrong mapping or weight draw breaks this)."""
    tokens = torch.randint(1, 6, (2, 10), generator=torch.Generator().manual_seed(3))
    hybrid = copy_model("momentum", layer_types=["full_attention"] * 3)
    with torch.no_grad():
        torch.testing.assert_close(hybrid(tokens), copy_model("softmax")(tokens), rtol=0, atol=0)
        mixed = copy_model("momentum", layer_types=["full_attention", "linear_attention", "linear_attention"])
        assert not torch.allclose(mixed(tokens), copy_model("momentum")(tokens))


def test_without_layer_types_the_model_and_its_seeded_weights_are_unchanged():
    plain, same = copy_model("adaptive"), copy_model("adaptive", layer_types=["linear_attention"] * 3)
    assert all(block.config == plain.blocks[0].config for block in plain.blocks)
    assert plain.state_dict().keys() == same.state_dict().keys()
    for key, value in plain.state_dict().items():
        assert torch.equal(value, same.state_dict()[key]), key
    assert configure(False).layer_types is None


@pytest.mark.parametrize("text,message", [
    ("linear_attention,softmax", "--layer-types: each entry must be one of linear_attention, full_attention, "
                                 "got 'softmax'"),
    ("linear_attention,full_attention,linear_attention", "--layer-types has 3 entries but the model has 2"),
])
def test_parsing_refuses_a_bad_entry_and_a_wrong_count(text, message, capsys):
    with pytest.raises(SystemExit):
        copy_run.parse_args(["--layer-types", text])
    assert message in capsys.readouterr().err


def test_the_config_refuses_a_wrong_count():
    with pytest.raises(ValueError, match="layer_types has 1 entries but the model has 4 layers"):
        configure(True, layer_types=["full_attention"])


def test_a_tiny_hybrid_run_records_its_layer_types(tmp_path):
    copy_run.main(["--models", "momentum", "--steps", "2", "--eval-every", "1", "--max-length", "8",
                   "--layer-types", "full_attention,linear_attention", "--no-progress",
                   "--out-dir", str(tmp_path)])
    recorded = json.loads((tmp_path / "config.json").read_text())
    assert recorded["config"]["layer_types"] == ["full_attention", "linear_attention"]
    assert "layer types full_attention,linear_attention" in (tmp_path / "results.md").read_text()

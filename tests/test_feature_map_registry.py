"""A feature map added to `plugins.attention.FEATURE_MAPS` reaches every integration: the block
config, the HF config (and its model) and fairseq's --feature-map read that one table."""
import argparse

import pytest
import torch
import torch.nn.functional as F

from hf_momentum import MomentumTransformerConfig, MomentumTransformerForCausalLM
from plugins.attention import FEATURE_MAPS, momentum_attention
from plugins.transformer.config import BlockConfig, block_feature_maps


@pytest.fixture
def softplus(monkeypatch):
    monkeypatch.setitem(FEATURE_MAPS, "softplus", F.softplus)
    return "softplus"


def test_block_and_hf_config_accept_it_and_the_model_uses_it(softplus):
    assert softplus in block_feature_maps() and "identity" not in block_feature_maps()
    assert BlockConfig(d_model=8, heads=2, feature_map=softplus).feature_map == softplus
    config = MomentumTransformerConfig(vocab_size=30, hidden_size=8, num_hidden_layers=1,
                                       num_attention_heads=2, intermediate_size=16,
                                       attention_feature_map=softplus)
    torch.manual_seed(0)
    model = MomentumTransformerForCausalLM(config).eval()
    attention = model.model.layers[0].attention
    x = torch.randn(1, 5, 8)
    q, k, v = (proj(x).view(1, 5, 2, 4).transpose(1, 2) for proj in (attention.q_proj, attention.k_proj,
                                                                      attention.v_proj))
    got = attention.attend(q, k, v)[0]
    beta, gamma = config.attention_momentum, config.attention_step_size
    want = momentum_attention(q, k, v, momentum=beta, step_size=gamma, feature_map=F.softplus)
    torch.testing.assert_close(got, want)
    assert not torch.allclose(got, momentum_attention(q, k, v, momentum=beta, step_size=gamma))


def test_fairseq_offers_it(softplus):
    from fairseq_momentum.options import add_momentum_attention_args

    parser = argparse.ArgumentParser()
    add_momentum_attention_args(parser)
    assert parser.parse_args(["--feature-map", softplus]).feature_map == softplus
    with pytest.raises(SystemExit):
        parser.parse_args(["--feature-map", "identity"])

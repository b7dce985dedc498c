"""An eager decoding step trusts the states it made (issue 27 item 4: eager decoding is host-bound on
a GPU): the states the kernels return and the cache hands back are not checked again at every layer
and token, while what comes from outside still is (the cache's contents by shape and device, at the
step)."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from hf_momentum import MomentumCache
from plugins.attention import MomentumAttentionState


def model_and_cache(make_generator):
    torch.manual_seed(0)
    config = AutoConfig.for_model(
        "momentum_transformer", vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64, hidden_dropout=0.0, attention_momentum=0.5)
    model = AutoModelForCausalLM.from_config(config).eval()
    cache = MomentumCache(config)
    ids = torch.randint(3, 100, (1, 9), generator=make_generator())
    with torch.no_grad():
        token = model(input_ids=ids, past_key_values=cache, use_cache=True).logits[:, -1:].argmax(-1)
    return model, cache, token


def test_a_decoding_step_checks_no_state_it_made(make_generator, monkeypatch):
    model, cache, token = model_and_cache(make_generator)
    checked = []
    check = MomentumAttentionState.__post_init__
    monkeypatch.setattr(MomentumAttentionState, "__post_init__",
                        lambda self: checked.append(1) or check(self))
    with torch.no_grad():
        for _ in range(3):
            token = model(input_ids=token, past_key_values=cache, use_cache=True).logits[:, -1:].argmax(-1)
    assert checked == [], f"{len(checked)} state checks in 3 steps of 2 layers"
    MomentumAttentionState(s=torch.zeros(1, 4, 8, 8), z=torch.zeros(1, 4, 8), m=torch.zeros(1, 4, 8, 8))
    assert checked == [1]                       # the counter sees a state built outside


def test_a_cache_holding_a_wrong_state_is_refused_at_the_step(make_generator):
    model, cache, token = model_and_cache(make_generator)
    s, z, m = cache.get_states(1)
    cache.set_states(1, (s[:, :3], z[:, :3], m[:, :3]))          # 3 heads where the layer has 4
    with torch.no_grad(), pytest.raises(ValueError, match=r"state\.s must have shape \(1, 4, 8, 8\)"):
        model(input_ids=token, past_key_values=cache, use_cache=True)

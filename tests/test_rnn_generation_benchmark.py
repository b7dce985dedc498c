"""benchmarks/rnn_generation.py's two decode loops (the cached `step`, and the whole layer on a
length-1 input standing in for it) decode as the model does without a cache: each greedy token is
the uncached model's on the prompt and the tokens before it, and the cache ends in the state of
one uncached call over everything fed. What the benchmark times is the same decoding both ways."""
import sys
from pathlib import Path

import pytest
import torch
from helpers.hf_tiny_models import causal_lm

from hf_momentum import MomentumLSTMCache
from hf_momentum.modeling_common import CACHE_NAME

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import rnn_generation  # noqa: E402


@pytest.mark.parametrize("cell", ["momentum", "adam"])
@pytest.mark.parametrize("sequence_layer", [False, True], ids=["step", "layer"])
def test_decode_equals_the_uncached_model(cell, sequence_layer, make_generator):
    model = causal_lm("lstm", cell=cell)
    prompt = torch.randint(3, 60, (1, 7), generator=make_generator())
    cache = MomentumLSTMCache(model.config)
    _, generated = rnn_generation.decode(model, prompt, 6, cache, sequence_layer)
    generated = torch.cat(generated, dim=1)
    fed = torch.cat([prompt, generated[:, :-1]], dim=1)
    whole = MomentumLSTMCache(model.config)
    with torch.no_grad():
        logits = model(input_ids=fed, use_cache=True, **{CACHE_NAME: whole}).logits
    assert torch.equal(generated, logits[:, prompt.shape[1] - 1:].argmax(-1))
    for name, state, expected in zip(whole.get_lstm_state()._fields, cache.get_lstm_state(),
                                     whole.get_lstm_state()):
        if expected is not None:
            torch.testing.assert_close(state, expected, rtol=1e-5, atol=1e-6, msg=name)


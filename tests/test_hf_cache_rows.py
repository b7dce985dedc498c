"""The generation caches count each row's real tokens (`RecurrentCache.row_positions`), and a
decode step takes its positions from those counts: the counts must follow the rows when the
cache is reordered (beam search), repeated (num_return_sequences) or reset. Each case is
checked against a cache-free forward of the whole left-padded batch in the same row order."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from helpers.hf_tiny_models import causal_lm, left_padded

from hf_momentum import MomentumCache, StaticMomentumCache

CACHES = [MomentumCache, StaticMomentumCache]
LENGTHS = [6, 3]


def prefill(model, cache_class, ids, mask):
    cache = cache_class(model.config)
    model(input_ids=ids[:, :-1], attention_mask=mask[:, :-1], past_key_values=cache, use_cache=True)
    return cache


def last_logits(model, ids, mask):
    return model(input_ids=ids, attention_mask=mask, use_cache=False).logits[:, -1]


@pytest.mark.parametrize("cache_class", CACHES, ids=lambda c: c.__name__)
def test_reordered_rows_keep_their_positions(cache_class, make_generator):
    model = causal_lm("transformer")
    ids, mask = left_padded(make_generator(), LENGTHS, 7)
    order = torch.tensor([1, 0])
    with torch.no_grad():
        cache = prefill(model, cache_class, ids, mask)
        cache.reorder_cache(order)
        step = model(input_ids=ids[order, -1:], past_key_values=cache).logits[:, -1]
        whole = last_logits(model, ids[order], mask[order])
    assert cache.row_tokens.tolist() == [LENGTHS[1], LENGTHS[0]]
    torch.testing.assert_close(step, whole, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("cache_class", CACHES, ids=lambda c: c.__name__)
def test_repeated_rows_keep_their_positions(cache_class, make_generator):
    model = causal_lm("transformer")
    ids, mask = left_padded(make_generator(), LENGTHS, 7)
    with torch.no_grad():
        cache = prefill(model, cache_class, ids, mask)
        cache.batch_repeat_interleave(2)
        ids2, mask2 = ids.repeat_interleave(2, dim=0), mask.repeat_interleave(2, dim=0)
        step = model(input_ids=ids2[:, -1:], past_key_values=cache).logits[:, -1]
        whole = last_logits(model, ids2, mask2)
    torch.testing.assert_close(step, whole, atol=1e-5, rtol=1e-4)


def test_a_reset_cache_takes_a_new_batch(make_generator):
    model = causal_lm("transformer")
    ids, mask = left_padded(make_generator(), LENGTHS, 7)
    with torch.no_grad():
        cache = prefill(model, MomentumCache, ids, mask)
        cache.reset()
        model(input_ids=ids[1:, 4:-1], past_key_values=cache, use_cache=True)
        step = model(input_ids=ids[1:, -1:], past_key_values=cache).logits[:, -1]
        whole = last_logits(model, ids[1:, 4:], None)
    assert cache.row_tokens.tolist() == [LENGTHS[1]]
    torch.testing.assert_close(step, whole, atol=1e-5, rtol=1e-4)

"""Exact speculative decoding for the native models (issue 29): assisted decoding (a draft model)
and prompt-lookup decoding give greedy decoding's tokens, with and without left padding, and
the recurrent cache cropped back to the accepted tokens holds the states of a cache that only
ever saw them (hf_momentum.cache_history)."""
import os
import re
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from helpers.code_blocks import run_as_module
from helpers.hf_tiny_models import FAMILIES, PAD, causal_lm

from hf_momentum import StaticMomentumCache
from hf_momentum.cache_history import CroppableStatesMixin

NEW_TOKENS = 24


def target(family, **kwargs):
    """A float64 model (no argmax near-tie can tell two exact computations apart) that never
    stops early, so every run makes NEW_TOKENS tokens."""
    model = causal_lm(family, **kwargs).double()
    model.generation_config.eos_token_id = None
    return model


def draft(family, kind):
    """A copy of the target, or a smaller model of the same family with other weights."""
    if kind == "same":
        return target(family)
    torch.manual_seed(1)
    small = dict(num_hidden_layers=1, hidden_size=8) if family == "transformer" else \
        dict(num_hidden_layers=1, hidden_size=8, embedding_size=8)
    model = causal_lm(family, **small).double()
    torch.manual_seed(1)
    model.apply(model._init_weights)
    return model


def repetitive_prompt(generator, padding=0):
    """A phrase three times (prompt lookup finds its continuation), with `padding` leading pads."""
    phrase = torch.randint(3, 60, (1, 6), generator=generator)
    ids = torch.cat([torch.full((1, padding), PAD), phrase, phrase, phrase], 1)
    mask = torch.ones_like(ids)
    mask[:, :padding] = 0
    return ids, mask


def greedy(model, ids, mask):
    return model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False)


@pytest.fixture
def crops(monkeypatch):
    """Every crop's tokens_to_remove, for each cache."""
    seen = []
    crop = CroppableStatesMixin.crop

    def spy(cache, tokens_to_remove):
        seen.append(tokens_to_remove)
        return crop(cache, tokens_to_remove)

    monkeypatch.setattr(CroppableStatesMixin, "crop", spy)
    return seen


@pytest.mark.parametrize("padding", [0, 3])
@pytest.mark.parametrize("kind", ["same", "smaller"])
@pytest.mark.parametrize("family", FAMILIES)
def test_assisted_decoding_equals_greedy(family, kind, padding, make_generator, crops):
    model = target(family)
    ids, mask = repetitive_prompt(make_generator(), padding)
    expected = greedy(model, ids, mask)
    calls = []
    model.register_forward_pre_hook(lambda *args: calls.append(1))
    got = model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False,
                         assistant_model=draft(family, kind))
    assert torch.equal(got, expected)
    if kind == "same":
        assert len(calls) < NEW_TOKENS    # the copy's drafts are all accepted, several per forward
    else:
        assert any(c < 0 for c in crops)  # some drafted tokens were rejected and cropped away


@pytest.mark.parametrize("padding", [0, 3])
@pytest.mark.parametrize("family", FAMILIES)
def test_prompt_lookup_equals_greedy_and_accepts_candidates(family, padding, make_generator, crops):
    model = target(family)
    ids, mask = repetitive_prompt(make_generator(), padding)
    expected = greedy(model, ids, mask)
    calls = []
    model.register_forward_pre_hook(lambda *args: calls.append(1))
    got = model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False,
                         prompt_lookup_num_tokens=4)
    assert torch.equal(got, expected)
    assert len(calls) < NEW_TOKENS        # some forwards verified several candidates at once


@pytest.mark.parametrize("family", FAMILIES)
def test_prompt_lookup_from_random_prompts_equals_greedy(family, make_generator, crops):
    """Prompts without a repeated phrase: candidates come from the generated text's loops and are
    often wrong, so the crops go back to every position of a round."""
    model = target(family)
    generator = make_generator()
    for _ in range(3):
        ids = torch.randint(3, 60, (1, 9), generator=generator)
        expected = greedy(model, ids, None)
        got = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False, prompt_lookup_num_tokens=3)
        assert torch.equal(got, expected)
    assert any(c < 0 for c in crops)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_recorded_window_stays_one_round_long(family, make_generator):
    """The history kept for cropping is the last round's tokens, not the whole generation."""
    model = target(family)
    ids, mask = repetitive_prompt(make_generator())
    out = model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False,
                         prompt_lookup_num_tokens=4, return_dict_in_generate=True)
    history = out.past_key_values.history
    assert history.start >= ids.shape[1]
    assert history.length <= 4 + 1        # the bonus token and at most 4 candidates


def prefix_states(model, ids, mask, cut):
    """Logits and cache of `ids[:, :cut]` fed as a prompt then one token at a time up to `cut`
    (a cache that only ever saw the accepted tokens)."""
    cache = model.cache_class(model.config)
    prompt = 5
    with torch.no_grad():
        model(input_ids=ids[:, :prompt], attention_mask=mask[:, :prompt], past_key_values=cache)
        for t in range(prompt, cut):
            model(input_ids=ids[:, t:t + 1], attention_mask=mask[:, :t + 1], past_key_values=cache)
    return cache


def assert_same_states(cache, reference):
    for layer in range(len(cache.layers)):
        for got, want in zip(cache.get_states(layer), reference.get_states(layer)):
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


CASES = [("transformer", {}), ("lstm", {"cell": "momentum"}), ("lstm", {"cell": "lstm"}),
         ("lstm", {"cell": "adam"}), ("lstm", {"cell": "nag", "restart": 3})]


@pytest.mark.parametrize("family,kwargs", CASES, ids=[f"{f}-{k.get('cell', 'eq12')}" for f, k in CASES])
@pytest.mark.parametrize("keep", [5, 7, 10, 12])
def test_crop_and_refeed_equal_a_cache_that_saw_only_the_kept_tokens(family, kwargs, keep, make_generator):
    """Rows left-padded differently; a window of several forwards (a multi-token one, then single
    steps, as an assistant drafts); crop to `keep` (the window start, inside the first forward,
    inside the steps, nothing removed), then the next token: states and logits equal a cache fed
    the kept tokens only. get_seq_length() says `keep` right after the crop."""
    model = target(family, **kwargs)
    ids = torch.randint(3, 60, (2, 14), generator=make_generator())
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    ids[mask == 0] = PAD
    cache = prefix_states(model, ids, mask, 5)
    cache.activate_past_recording()
    with torch.no_grad():
        model(input_ids=ids[:, 5:10], attention_mask=mask[:, :10], past_key_values=cache)
        for t in (10, 11):
            model(input_ids=ids[:, t:t + 1], attention_mask=mask[:, :t + 1], past_key_values=cache)
        cache.crop(keep - 12)
        assert cache.get_seq_length() == keep
        nxt = torch.randint(3, 60, (2, 2), generator=make_generator("next"))
        both = torch.cat([ids[:, :keep], nxt], 1)
        full_mask = torch.cat([mask[:, :keep], torch.ones_like(nxt)], 1)
        got = model(input_ids=nxt, attention_mask=full_mask, past_key_values=cache).logits
        reference = prefix_states(model, both, full_mask, keep)
        want = model(input_ids=nxt, attention_mask=full_mask, past_key_values=reference).logits
    assert cache.get_seq_length() == reference.get_seq_length() == keep + 2
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    assert_same_states(cache, reference)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_second_crop_before_the_next_forward_and_a_crop_from_an_empty_cache(family, make_generator):
    model = target(family)
    ids = torch.randint(3, 60, (1, 12), generator=make_generator())
    mask = torch.ones_like(ids)
    cache = model.cache_class(model.config)
    cache.activate_past_recording()
    with torch.no_grad():
        model(input_ids=ids[:, :9], past_key_values=cache)      # the window starts from no state
        cache.crop(-2)
        cache.crop(-3)
        assert cache.get_seq_length() == 4
        got = model(input_ids=ids[:, 9:], attention_mask=torch.cat([mask[:, :4], mask[:, 9:]], 1),
                    past_key_values=cache).logits
        reference = model.cache_class(model.config)
        model(input_ids=ids[:, :4], past_key_values=reference)
        want = model(input_ids=ids[:, 9:], past_key_values=reference).logits
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    assert_same_states(cache, reference)


@pytest.mark.parametrize("family", FAMILIES)
def test_crops_that_cannot_be_exact_are_refused(family, make_generator):
    model = target(family)
    ids = torch.randint(3, 60, (1, 10), generator=make_generator())
    cache = model.cache_class(model.config)
    with torch.no_grad():
        model(input_ids=ids[:, :6], past_key_values=cache)
    with pytest.raises(RuntimeError, match="activate_past_recording"):
        cache.crop(-1)                                     # nothing recorded
    cache.crop(0)                                          # removing nothing is always exact
    cache.activate_past_recording()
    with torch.no_grad():
        model(input_ids=ids[:, 6:], past_key_values=cache)
    with pytest.raises(RuntimeError, match="only back to 6 tokens"):
        cache.crop(-5)
    with pytest.raises(ValueError, match="int <= 0"):
        cache.crop(3)
    assert cache.get_seq_length() == 10


@pytest.mark.parametrize("option", ["prompt_lookup_num_tokens", "assistant_model"])
@pytest.mark.parametrize("static", ["cache_implementation", "past_key_values"])
def test_the_static_cache_is_refused_before_the_first_forward(option, static, make_generator):
    model = target("transformer")
    ids = torch.randint(3, 60, (1, 8), generator=make_generator())
    calls = []
    model.model.register_forward_pre_hook(lambda *args: calls.append(1))
    extra = ({"prompt_lookup_num_tokens": 3} if option == "prompt_lookup_num_tokens"
             else {"assistant_model": model})
    extra.update({"cache_implementation": "static"} if static == "cache_implementation"
                 else {"past_key_values": StaticMomentumCache(model.config)})
    with pytest.raises(ValueError, match=f"{option}= .speculative decoding.*static cache"):
        model.generate(ids, max_new_tokens=5, do_sample=False, **extra)
    assert calls == []


def test_the_readme_example_runs():
    readme = (Path(__file__).resolve().parents[1] / "hf_momentum" / "README.md").read_text(encoding="utf-8")
    section = readme.split("### Speculative decoding", 1)[1]
    code = re.search(r"^```python\n(.*?)^```$", section, re.M | re.S).group(1)
    run_as_module(code, "hf_momentum/README.md")


@pytest.mark.parametrize("family", FAMILIES)
def test_a_window_of_embeddings_and_ids_is_replayed_as_embeddings(family, make_generator):
    """A round whose first forward gave inputs_embeds and whose next gave ids: the accepted
    tokens are re-run as embeddings (the ids' looked up), equal to a cache fed ids only."""
    model = target(family)
    ids = torch.randint(3, 60, (1, 12), generator=make_generator())
    embed = model.get_input_embeddings()
    cache = model.cache_class(model.config)
    with torch.no_grad():
        model(input_ids=ids[:, :4], past_key_values=cache)
        cache.activate_past_recording()
        model(inputs_embeds=embed(ids[:, 4:8]), past_key_values=cache)
        model(input_ids=ids[:, 8:11], past_key_values=cache)
        cache.crop(-1)
        got = model(input_ids=ids[:, 10:], past_key_values=cache).logits
        reference = model.cache_class(model.config)
        model(input_ids=ids[:, :10], past_key_values=reference)
        want = model(input_ids=ids[:, 10:], past_key_values=reference).logits
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    assert_same_states(cache, reference)


def test_position_ids_given_to_part_of_a_round_are_refused(make_generator):
    model = target("transformer")
    ids = torch.randint(3, 60, (1, 10), generator=make_generator())
    cache = model.cache_class(model.config)
    cache.activate_past_recording()
    with torch.no_grad():
        model(input_ids=ids[:, :6], position_ids=torch.arange(6)[None], past_key_values=cache)
        model(input_ids=ids[:, 6:8], past_key_values=cache)
        cache.crop(-1)
        with pytest.raises(ValueError, match="position_ids were given to some forwards"):
            model(input_ids=ids[:, 7:], past_key_values=cache)
    assert cache.get_seq_length() == 7                     # the refused forward changed nothing

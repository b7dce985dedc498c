"""Inputs of the native families' forward and generate: a mask over the new tokens only, a cache
with use_cache=False, encoders with the default use_cache, empty prompts, logits_to_keep, and the
one causal-LM mixin. Every case is either correct (checked against a cache-free forward of the
whole sequence) or refused early with a ValueError naming the argument."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from helpers.hf_tiny_models import FAMILIES, PAD, causal_lm, config, left_padded
from transformers import GenerationConfig

import hf_momentum
from hf_momentum import (
    MomentumCache,
    MomentumLSTMCache,
    MomentumLSTMForCausalLM,
    MomentumLSTMModel,
    MomentumTransformerForCausalLM,
    MomentumTransformerModel,
)
from hf_momentum.modeling_common import CACHE_NAME, CHUNKED_PREFILL_REREADS_THE_CACHE

# A mask over the new tokens only would restart positions at 0.

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


def test_positions_after_a_padded_prefix_come_from_the_cache(make_generator):
    """The cache counts each row's real tokens: a step without the mask continues each left-padded
    row where it is, as the whole masked batch and as the row alone."""
    model = causal_lm("transformer")
    ids, mask = left_padded(make_generator(), [6, 3], 7)
    with torch.no_grad():
        whole = model(input_ids=ids, attention_mask=mask, use_cache=False).logits[:, -1]
        alone = model(input_ids=ids[1:, 4:], use_cache=False).logits[:, -1]
        cache = model(input_ids=ids[:, :-1], attention_mask=mask[:, :-1]).past_key_values
        padded_step = model(input_ids=ids[:, -1:], past_key_values=cache).logits[:, -1]
        unpadded = model(input_ids=ids[:1, :-1]).past_key_values
        step = model(input_ids=ids[:1, -1:], past_key_values=unpadded).logits[:, -1]
        first = model(input_ids=ids[:1], use_cache=False).logits[:, -1]
    torch.testing.assert_close(padded_step, whole, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(padded_step[1:], alone, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(step, first, atol=1e-5, rtol=1e-4)


# use_cache=False with past_key_values continues the cache.

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
def test_training_starts_no_cache_unless_asked(family):
    """use_cache=None: the config's (True) in eval mode, none in training (as transformers' Mamba);
    use_cache=True in training still returns one, with the same logits."""
    model = causal_lm(family)
    ids = torch.arange(3, 9)[None]
    assert model.config.use_cache
    assert model.eval()(input_ids=ids).past_key_values is not None
    model.train()
    plain = model(input_ids=ids)
    cached = model(input_ids=ids, use_cache=True)
    assert plain.past_key_values is None and cached.past_key_values is not None
    torch.testing.assert_close(plain.logits, cached.logits)


@pytest.mark.parametrize("family", FAMILIES)
def test_wrong_cache_type_and_checkpointed_training_with_a_cache_are_refused(family):
    model = causal_lm(family)
    ids = torch.arange(3, 9)[None]
    other = MomentumLSTMCache if family == "transformer" else MomentumCache
    with pytest.raises(ValueError, match=f"{CACHE_NAME} must be a"):
        model(input_ids=ids, past_key_values=other(model.config))
    with pytest.raises(ValueError, match="use_cache must be True or False"):
        model(input_ids=ids, use_cache="no")
    cache = model(input_ids=ids).past_key_values
    model.activation_checkpointing_enable()
    model.train()
    with pytest.raises(ValueError, match="gradient checkpointing"):
        model(input_ids=ids, past_key_values=cache)


# Encoders with default use_cache; empty prompts.

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
    with pytest.raises(ValueError, match=CACHE_NAME):
        model(ids, past_key_values=MomentumCache(model.config))


@pytest.mark.parametrize("family", FAMILIES)
def test_empty_prompt_forward_then_continue(family, make_generator):
    model = causal_lm(family)
    ids = torch.randint(3, 60, (2, 4), generator=make_generator())
    empty = ids[:, :0]
    with torch.no_grad():
        out = model(input_ids=empty, attention_mask=torch.ones(2, 0, dtype=torch.long))
        assert out.logits.shape == (2, 0, 60) and out.past_key_values.get_seq_length() == 0
        # with position_ids too, as a context-parallel rank whose slice is empty is called
        positioned = model(input_ids=empty, position_ids=torch.zeros(2, 0, dtype=torch.long), use_cache=False)
        assert positioned.logits.shape == (2, 0, 60)
        cont = model(input_ids=ids, past_key_values=out.past_key_values).logits
        whole = model(input_ids=ids, use_cache=False).logits
    torch.testing.assert_close(cont, whole, atol=1e-5, rtol=1e-4)
    if family == "transformer":
        encoder = MomentumTransformerModel(config(family, is_causal=False)).eval()
        assert encoder(empty).last_hidden_state.shape == (2, 0, 16)
    with pytest.raises(ValueError, match="at least one token"):
        model.generate(empty, max_new_tokens=2, pad_token_id=PAD)


# A prompt given as embeddings (GenerationTesterMixin.test_generate_from_inputs_embeds and
# test_generate_continue_from_inputs_embeds).

GENERATION_MODES = {"greedy": dict(do_sample=False), "sample": dict(do_sample=True, top_k=5),
                    "beam": dict(do_sample=False, num_beams=2)}
MODELS = {"transformer": ("transformer", {}), "lstm": ("lstm", {}),
               "lstm-nag": ("lstm", dict(cell="nag")), "lstm-adam": ("lstm", dict(cell="adam")),
               "hybrid": ("transformer", dict(num_hidden_layers=3, sliding_window=3, layer_types=[
                   "linear_attention", "full_attention", "sliding_attention"]))}


def new_tokens(model, seed=0, **kwargs):
    """The tokens generate() adds (it returns only those for a prompt of embeddings alone)."""
    torch.manual_seed(seed)
    out = model.generate(max_new_tokens=4, min_new_tokens=4, pad_token_id=PAD, **kwargs)
    given = kwargs.get("input_ids")
    return out if given is None else out[:, given.shape[1]:]


@pytest.mark.parametrize("mode", GENERATION_MODES)
@pytest.mark.parametrize("family", MODELS)
def test_generate_from_inputs_embeds_equals_generate_from_the_ids(family, mode, make_generator):
    """A left-padded prompt as embeddings gives the tokens its ids give; with both, the embeddings
    are what the model reads (those of other ids give those ids' tokens)."""
    model = causal_lm(MODELS[family][0], **MODELS[family][1])
    ids, mask = left_padded(make_generator(), [6, 3], 7)
    other = torch.where(mask.bool(), (ids + 7) % 57 + 3, ids)
    embed = model.get_input_embeddings()
    with torch.no_grad():
        from_ids = new_tokens(model, input_ids=ids, attention_mask=mask, **GENERATION_MODES[mode])
        from_embeds = new_tokens(model, inputs_embeds=embed(ids), attention_mask=mask,
                                 **GENERATION_MODES[mode])
        both = new_tokens(model, input_ids=ids, inputs_embeds=embed(other), attention_mask=mask,
                          **GENERATION_MODES[mode])
        from_other = new_tokens(model, input_ids=other, attention_mask=mask, **GENERATION_MODES[mode])
    assert from_embeds.shape == (2, 4)
    assert torch.equal(from_embeds, from_ids)
    assert torch.equal(both, from_other)
    assert not torch.equal(from_other, from_ids)


@pytest.mark.parametrize("family", MODELS)
def test_generate_continues_from_inputs_embeds_and_the_returned_cache(family, make_generator):
    """Generating 3 tokens from embeddings, then 3 more from the embeddings of everything so far
    with the cache the first call returned, gives the 6 tokens of one call."""
    model = causal_lm(MODELS[family][0], **MODELS[family][1])
    ids, mask = left_padded(make_generator(), [6, 3], 7)
    embed = model.get_input_embeddings()
    kwargs = dict(do_sample=False, pad_token_id=PAD)
    with torch.no_grad():
        whole = model.generate(inputs_embeds=embed(ids), attention_mask=mask, max_new_tokens=6, **kwargs)
        first = model.generate(inputs_embeds=embed(ids), attention_mask=mask, max_new_tokens=3,
                               return_dict_in_generate=True, **kwargs)
        so_far = torch.cat([ids, first.sequences], 1)
        more_mask = torch.cat([mask, torch.ones_like(first.sequences)], 1)
        rest = model.generate(inputs_embeds=embed(so_far), attention_mask=more_mask,
                              past_key_values=first.past_key_values, max_new_tokens=3, **kwargs)
    assert torch.equal(torch.cat([first.sequences, rest], 1), whole)


# generate() drops a padding mask of ones before the prefill, keeping its width; a prompt that
# continues a filled cache must still lose the tokens the cache holds (transformers 5.24's prefill
# leaves that cut to the model wherever every layer of the cache is a linear-attention one).

@pytest.mark.parametrize("mask", ["ones", "none"])
@pytest.mark.parametrize("family", FAMILIES)
def test_generate_continues_the_returned_cache_from_an_unpadded_prompt(family, mask, make_generator):
    """3 tokens, then 3 more from everything so far with the cache the first call returned: the
    tokens and scores of one call of 6 (a prompt absorbed twice changes the scores)."""
    model = causal_lm(family).double()
    model.generation_config.eos_token_id = None
    ids = torch.randint(3, 60, (2, 5), generator=make_generator())

    def run(prompt, new_tokens, **kwargs):
        given = {"attention_mask": torch.ones_like(prompt)} if mask == "ones" else {}
        return model.generate(prompt, do_sample=False, max_new_tokens=new_tokens,
                              return_dict_in_generate=True, output_logits=True, **given, **kwargs)
    with torch.no_grad():
        whole = run(ids, 6)
        first = run(ids, 3)
        rest = run(first.sequences, 3, **{CACHE_NAME: first[CACHE_NAME]})
    assert torch.equal(rest.sequences, whole.sequences)
    torch.testing.assert_close(torch.stack(first.logits + rest.logits), torch.stack(whole.logits),
                               rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_chunked_prefill_continuing_the_returned_cache_equals_one_call(family, make_generator):
    """prefill_chunk_size with the cache a first call returned and the whole sequence so far: one
    call's tokens and scores, or, on transformers 5.24 (whose chunked prefill would feed the model the
    cache's tokens again), a refusal naming prefill_chunk_size."""
    model = causal_lm(family).double()
    model.generation_config.eos_token_id = None
    ids = torch.randint(3, 60, (2, 5), generator=make_generator())
    kwargs = dict(do_sample=False, return_dict_in_generate=True, output_logits=True)
    with torch.no_grad():
        whole = model.generate(ids, max_new_tokens=6, **kwargs)
        first = model.generate(ids, max_new_tokens=3, **kwargs)
        go_on = dict(max_new_tokens=3, prefill_chunk_size=2, **{CACHE_NAME: first[CACHE_NAME]}, **kwargs)
        if CHUNKED_PREFILL_REREADS_THE_CACHE:
            with pytest.raises(ValueError, match="prefill_chunk_size with a filled"):
                model.generate(first.sequences, **go_on)
            return
        rest = model.generate(first.sequences, **go_on)
    assert torch.equal(rest.sequences, whole.sequences)
    torch.testing.assert_close(torch.stack(first.logits + rest.logits), torch.stack(whole.logits),
                               rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_prefill_without_its_dropped_mask_cuts_the_prompt_by_the_masks_width(family, make_generator):
    """The prefill as transformers 5.24 calls it with a filled cache (no next_sequence_length, the
    mask of ones dropped, its width in generation_config._mask_length): a prompt as wide as the
    mask is the whole sequence and keeps the tokens after the cache's 4; a narrower one is the new
    tokens already and stays whole."""
    model = causal_lm(family)
    ids = torch.randint(3, 60, (2, 7), generator=make_generator())
    with torch.no_grad():
        cache = model(input_ids=ids[:, :4], use_cache=True)[CACHE_NAME]
    for prompt in (ids, ids[:, 4:]):
        generation_config = GenerationConfig()
        generation_config._mask_length = ids.shape[1]
        model_kwargs = {CACHE_NAME: cache, "use_cache": True}
        model._prepare_cache_for_generation(generation_config, model_kwargs)
        inputs = model.prepare_inputs_for_generation(prompt, None, attention_mask=None,
                                                     is_first_iteration=True, **model_kwargs)
        assert torch.equal(inputs["input_ids"], ids[:, 4:])


# A left-padded prompt in chunks (generate's prefill_chunk_size): a chunk may hold no real token
# of a row, or of any row.

@pytest.mark.parametrize("lengths", [[6, 3, 1], [3, 2]], ids=["some-rows-empty", "all-rows-empty"])
@pytest.mark.parametrize("chunk", [1, 3])
@pytest.mark.parametrize("family", MODELS)
def test_prompt_in_chunks_equals_the_prompt_at_once(family, chunk, lengths, make_generator):
    """Each chunk continues the cache: the logits of every real token, and of one step after the
    prompt, equal the prompt's at once and each row's alone."""
    model = causal_lm(MODELS[family][0], **MODELS[family][1])
    ids, mask = left_padded(make_generator(), lengths, 7)
    nxt = torch.randint(3, 60, (len(lengths), 1), generator=make_generator())
    whole_mask = torch.cat([mask, torch.ones_like(nxt)], 1)
    real = mask.bool()
    with torch.no_grad():
        at_once = model(input_ids=ids, attention_mask=mask)
        step = model(input_ids=nxt, attention_mask=whole_mask, past_key_values=at_once.past_key_values)
        cache, logits = None, []
        for start in range(0, 7, chunk):
            out = model(input_ids=ids[:, start:start + chunk], attention_mask=mask[:, :start + chunk],
                        past_key_values=cache, use_cache=True)
            cache, logits = out.past_key_values, logits + [out.logits]
        chunked_step = model(input_ids=nxt, attention_mask=whole_mask, past_key_values=cache).logits
        alone = [model(input_ids=torch.cat([row[row_mask.bool()], n])[None]).logits[0]
                 for row, row_mask, n in zip(ids, mask, nxt)]
    chunked = torch.cat(logits, 1)
    torch.testing.assert_close(chunked[real], at_once.logits[real], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(chunked_step, step.logits, atol=1e-5, rtol=1e-4)
    for row, n in enumerate(lengths):
        torch.testing.assert_close(chunked[row][real[row]], alone[row][:n], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(chunked_step[row, 0], alone[row][n], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("family", MODELS)
def test_generate_with_prefill_chunk_size_equals_generate(family, make_generator):
    model = causal_lm(MODELS[family][0], **MODELS[family][1])
    ids, mask = left_padded(make_generator(), [6, 3, 1], 7)
    with torch.no_grad():
        plain = new_tokens(model, input_ids=ids, attention_mask=mask, do_sample=False)
        chunked = new_tokens(model, input_ids=ids, attention_mask=mask, do_sample=False, prefill_chunk_size=3)
    assert torch.equal(chunked, plain)


@pytest.mark.parametrize("implementation", ["offloaded", "quantized", "offloaded_static", "sliding_window",
                                            "paged"])
@pytest.mark.parametrize("family", ["transformer", "lstm", "hybrid"])
def test_key_value_cache_implementations_are_refused_naming_the_option(family, implementation):
    """generate() builds each model's own cache: a key-value cache asked for by name would
    otherwise be silently ignored ('paged': fail inside transformers' continuous batching)."""
    model = causal_lm(MODELS[family][0], **MODELS[family][1])
    with pytest.raises(ValueError, match=f"cache_implementation='{implementation}' is one of transformers'"):
        model.generate(torch.arange(3, 9)[None], max_new_tokens=2, pad_token_id=PAD,
                       cache_implementation=implementation)
    assert torch.equal(model.generate(torch.arange(3, 9)[None], max_new_tokens=2, pad_token_id=PAD,
                                      cache_implementation="dynamic"),
                       model.generate(torch.arange(3, 9)[None], max_new_tokens=2, pad_token_id=PAD))
    if implementation == "paged":          # continuous batching's own entry points
        with pytest.raises(ValueError, match="continuous batching"):
            model.generate_batch([[3, 4, 5]], generation_config=GenerationConfig(max_new_tokens=2))
        with pytest.raises(ValueError, match="continuous batching"):
            model.init_continuous_batching()


# One mixin; logits_to_keep as an int or a tensor of positions.

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

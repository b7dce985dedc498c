"""The compiled decode step of MomentumTransformerForCausalLM with a StaticMomentumCache: one graph
(fullgraph=True raises on a graph break) compiled once for every step (a counting backend), logits
equal to a float64 reference of the whole sequence (eq. 13 in plugins' quadratic form, through
helpers.hf_transformer.reference_forward) and logits and states equal to the eager
MomentumCache step, states kept in place, left-padded rows kept apart, and
generate(cache_implementation="static") compiling the step itself and choosing the eager tokens.

Most tests use the aot_eager backend, which traces what inductor compiles (Dynamo, then
AOTAutograd) without inductor's C++ build (minutes on this machine); one runs inductor itself."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from helpers.hf_transformer import PAD, reference_forward, tiny
from torch._dynamo.testing import CompileCounterWithBackend
from torch._dynamo.utils import counters
from transformers import AutoModelForCausalLM, CompileConfig

from hf_momentum import MomentumCache, StaticMomentumCache
from hf_momentum.modeling_common import CACHE_NAME

STEPS = 5
LENGTHS = (7, 4, 2)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = tiny(connection="adaptive", connection_momentum=0.3, connection_step_size=0.9)
    return AutoModelForCausalLM.from_config(config).double().eval()


def padded_prompts(gen, lengths=LENGTHS):
    """Left-padded prompts of the given lengths (garbage token ids under the padding)."""
    width = max(lengths)
    ids = torch.randint(3, 100, (len(lengths), width), generator=gen)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for row, n in enumerate(lengths):
        mask[row, width - n:] = 1
    return ids, mask


def states(cache, layers):
    return [t for i in range(layers) for t in cache.get_states(i)]


def reference_logits(model, ids, mask):
    """lm_head of the float64 whole-sequence reference (quadratic eq. 13), every position."""
    return model.lm_head(reference_forward(model.model, ids, mask))


def decode(model, step, ids, mask, steps=STEPS):
    """Prompt eagerly into a StaticMomentumCache, then `steps` greedy tokens through `step` with
    the new token's mask only; alongside, the eager MomentumCache path on the same tokens.
    Returns both paths' step logits, their final caches, the tokens, the full mask and the
    static states' addresses after the prompt."""
    static, dynamic = StaticMomentumCache(model.config), MomentumCache(model.config)
    out_s = model(input_ids=ids, attention_mask=mask, past_key_values=static)
    out_d = model(input_ids=ids, attention_mask=mask, past_key_values=dynamic)
    addresses = [t.data_ptr() for t in states(static, model.config.num_hidden_layers)]
    logits_s, logits_d = [out_s.logits[:, -1]], [out_d.logits[:, -1]]
    for _ in range(steps):
        token = out_d.logits[:, -1:].argmax(-1)
        ids = torch.cat([ids, token], 1)
        mask = torch.cat([mask, torch.ones_like(token)], 1)
        # contiguous, as generate() passes it: a slice's stride changes with the mask's width,
        # and strides are guarded like shapes
        out_s = step(input_ids=token, attention_mask=mask[:, -1:].contiguous(), past_key_values=static)
        out_d = model(input_ids=token, attention_mask=mask, past_key_values=dynamic)
        logits_s.append(out_s.logits[:, -1])
        logits_d.append(out_d.logits[:, -1])
    return torch.stack(logits_s, 1), torch.stack(logits_d, 1), static, dynamic, ids, mask, addresses


def test_compiled_step_is_one_graph_equal_to_eager_and_to_the_reference(model, make_generator):
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    step = torch.compile(model, backend=counter, fullgraph=True, dynamic=False)
    layers = model.config.num_hidden_layers
    with torch.no_grad():
        logits_s, logits_d, static, dynamic, ids, mask, addresses = decode(
            model, step, *padded_prompts(make_generator()))
        reference = reference_logits(model, ids, mask)[:, ids.shape[1] - STEPS - 1:]
    assert counter.frame_count == 1, "a decode step was compiled again"
    torch.testing.assert_close(logits_s, logits_d, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(logits_s, reference, rtol=1e-9, atol=1e-9)
    for a, b in zip(states(static, layers), states(dynamic, layers)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert [t.data_ptr() for t in states(static, layers)] == addresses
    assert static.get_seq_length() == dynamic.get_seq_length() == max(LENGTHS) + STEPS
    assert static.row_tokens.tolist() == [n + STEPS for n in LENGTHS]


def decode_cache(model, ids, mask):
    cache = StaticMomentumCache(model.config)
    model(input_ids=ids, attention_mask=mask, past_key_values=cache)
    return cache


def test_states_stay_in_place_across_steps_reset_and_reorder(model, make_generator):
    ids, mask = padded_prompts(make_generator())
    layers = model.config.num_hidden_layers
    with torch.no_grad():
        cache = decode_cache(model, ids, mask)
        addresses = [t.data_ptr() for t in states(cache, layers)] + [cache.row_tokens.data_ptr()]
        token = ids[:, -1:]
        for _ in range(3):
            model(input_ids=token, attention_mask=torch.ones_like(token), past_key_values=cache)
        before = [t.clone() for t in states(cache, layers)] + [cache.row_tokens.clone()]
        cache.reorder_cache(torch.tensor([2, 0, 1]))
        after = states(cache, layers) + [cache.row_tokens]
        for old, new in zip(before, after):
            assert torch.equal(new, old[[2, 0, 1]])
        assert [t.data_ptr() for t in after] == addresses
        cache.reset()
        again = model(input_ids=ids, attention_mask=mask, past_key_values=cache).logits
        fresh = model(input_ids=ids, attention_mask=mask, past_key_values=MomentumCache(model.config)).logits
    assert [t.data_ptr() for t in states(cache, layers)] + [cache.row_tokens.data_ptr()] == addresses
    assert cache.get_seq_length() == ids.shape[1]
    real = mask.bool()
    torch.testing.assert_close(again[real], fresh[real], rtol=1e-12, atol=1e-12)


def compile_config(backend="aot_eager"):
    config = CompileConfig(fullgraph=True, dynamic=False, backend=backend, mode="default")
    config._compile_all_devices = True          # transformers compiles generate() on CUDA only otherwise
    return config


def greedy(model, ids, **kwargs):
    return model.generate(ids, max_new_tokens=STEPS + 1, min_new_tokens=STEPS + 1, do_sample=False,
                          pad_token_id=PAD, **kwargs)


def test_generate_compiles_the_step_once_and_picks_the_eager_tokens(model, make_generator):
    ids, mask = padded_prompts(make_generator())
    torch._dynamo.reset()
    counters.clear()
    with torch.no_grad():
        compiled = greedy(model, ids, attention_mask=mask, cache_implementation="static",
                          compile_config=compile_config())
        graphs = counters["stats"]["unique_graphs"]
        eager = greedy(model, ids, attention_mask=mask)
        alone = [greedy(model, ids[row:row + 1, ids.shape[1] - n:]) for row, n in enumerate(LENGTHS)]
    assert graphs == 1, f"generate() compiled {graphs} graphs for its decode steps"
    assert torch.equal(compiled, eager)
    for row, n in enumerate(LENGTHS):
        assert torch.equal(compiled[row, ids.shape[1]:], alone[row][0, n:])


@pytest.mark.slow
@pytest.mark.usefixtures("inductor_cpp_without_simd")
def test_inductor_step_equals_eager(make_generator):
    """Inductor's generated code (float32, as a model runs), a few steps, one compilation; one
    layer, as inductor's C++ build takes minutes on a loaded 2-core machine."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny(connection="momentum", connection_momentum=0.3,
                                                  connection_step_size=0.9, num_hidden_layers=1)).eval()
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("inductor")
    step = torch.compile(model, backend=counter, fullgraph=True, dynamic=False)
    ids, mask = padded_prompts(make_generator())
    with torch.no_grad():
        logits_s, logits_d, static, dynamic, *_ = decode(model, step, ids, mask, steps=3)
    assert counter.frame_count == 1
    torch.testing.assert_close(logits_s, logits_d, rtol=1e-5, atol=1e-5)
    for a, b in zip(states(static, 1), states(dynamic, 1)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_bad_static_cache_use_raises(model, make_generator):
    ids, mask = padded_prompts(make_generator())
    with torch.no_grad():
        with pytest.raises(ValueError, match=f"cache_implementation='static' or {CACHE_NAME}"):
            greedy(model, ids, cache_implementation="static",
                   past_key_values=StaticMomentumCache(model.config))
        cache = decode_cache(model, ids, mask)
        with pytest.raises(ValueError, match="attention_mask has 3 columns"):
            model(input_ids=ids[:, :2], attention_mask=mask[:, :3], past_key_values=cache)
        with pytest.raises(ValueError, match="holds 3 rows, got a batch of 2"):
            model(input_ids=ids[:2, -1:], past_key_values=cache)

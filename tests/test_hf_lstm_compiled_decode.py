"""The compiled decode step of MomentumLSTMForCausalLM with a StaticMomentumLSTMCache: one graph
(fullgraph=True raises on a graph break, so no host read either) compiled once for every step (a
counting backend), logits and states equal to the eager MomentumLSTMCache step (float64) and to the
whole sequence run at once, states kept in place, a padded token in a step leaving its row's state
as it was, and generate(cache_implementation="static") compiling the step itself and choosing the
eager tokens, greedy and with beams. The aot_eager backend traces what inductor compiles (Dynamo,
then AOTAutograd) without inductor's C++ build."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from helpers.hf_tiny_models import AWD, PAD, config, left_padded
from torch._dynamo.testing import CompileCounterWithBackend
from torch._dynamo.utils import counters
from transformers import AutoModelForCausalLM, CompileConfig

from hf_momentum import MomentumLSTMCache, StaticMomentumLSTMCache

STEPS = 4
LENGTHS = (7, 4, 2)
MODELS = {"momentum": dict(), "adam": dict(cell="adam"), "sr": dict(cell="sr", restart=2),
          "awd-nag": dict(cell="nag", **AWD)}


def lstm(name):
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config("lstm", **MODELS[name])).double().eval()


def fields(cache):
    return [t for t in cache.get_states(0)]


@pytest.mark.parametrize("name", MODELS)
def test_compiled_step_is_one_graph_equal_to_eager_and_to_the_whole_sequence(name, make_generator):
    model = lstm(name)
    ids, mask = left_padded(make_generator(), LENGTHS, max(LENGTHS))
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    step = torch.compile(model, backend=counter, fullgraph=True, dynamic=False)
    static, dynamic = StaticMomentumLSTMCache(model.config), MomentumLSTMCache(model.config)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask, past_key_values=static)
        out = model(input_ids=ids, attention_mask=mask, past_key_values=dynamic)
        addresses = [t.data_ptr() for t in fields(static)]
        # the second step pads row 1: its state must stay as it was
        news = [torch.ones(3, 1, dtype=torch.long) for _ in range(STEPS)]
        news[1][1] = 0
        logits_s, logits_d = [], []
        for new in news:
            token = out.logits[:, -1:].argmax(-1)
            ids, mask = torch.cat([ids, token], 1), torch.cat([mask, new], 1)
            before = fields(static)[0][1].clone()
            logits_s.append(step(input_ids=token, attention_mask=new.contiguous(),
                                 past_key_values=static).logits[:, -1])
            if not new[1]:
                assert torch.equal(fields(static)[0][1], before)
            out = model(input_ids=token, attention_mask=mask, past_key_values=dynamic)
            logits_d.append(out.logits[:, -1])
        whole = model(input_ids=ids, attention_mask=mask, use_cache=False).logits[:, -STEPS:]
    assert counter.frame_count == 1, "a decode step was compiled again"
    logits_s, logits_d = torch.stack(logits_s, 1), torch.stack(logits_d, 1)
    real = mask[:, -STEPS:].bool()
    torch.testing.assert_close(logits_s, logits_d, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(logits_s[real], whole[real], rtol=1e-10, atol=1e-10)
    for a, b in zip(fields(static), fields(dynamic)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert [t.data_ptr() for t in fields(static)] == addresses


def compile_config():
    settings = CompileConfig(fullgraph=True, dynamic=False, backend="aot_eager", mode="default")
    settings._compile_all_devices = True          # transformers compiles generate() on CUDA only otherwise
    return settings


@pytest.mark.parametrize("beams", [1, 2])
def test_generate_compiles_the_step_once_and_picks_the_eager_tokens(beams, make_generator):
    model = lstm("awd-nag")
    ids, mask = left_padded(make_generator(), LENGTHS, max(LENGTHS))
    options = dict(max_new_tokens=STEPS, min_new_tokens=STEPS, do_sample=False, num_beams=beams,
                   pad_token_id=PAD)
    torch._dynamo.reset()
    counters.clear()
    with torch.no_grad():
        compiled = model.generate(ids, attention_mask=mask, cache_implementation="static",
                                  compile_config=compile_config(), **options)
        graphs = counters["stats"]["unique_graphs"]
        eager = model.generate(ids, attention_mask=mask, **options)
    # transformers compiles the decode step of greedy search and sampling; beam search runs it eagerly,
    # reordering the static buffers in place
    assert graphs == (1 if beams == 1 else 0), f"generate() compiled {graphs} graphs for its decode steps"
    assert torch.equal(compiled, eager)


def test_bad_static_cache_use_raises(make_generator):
    model = lstm("momentum")
    ids, mask = left_padded(make_generator(), LENGTHS, max(LENGTHS))
    cache = StaticMomentumLSTMCache(model.config)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask, past_key_values=cache)
        with pytest.raises(ValueError, match="attention_mask has 3 columns"):
            model(input_ids=ids[:, :2], attention_mask=mask[:, :3], past_key_values=cache)
        with pytest.raises(ValueError, match="holds 3 rows, got a batch of 2"):
            model(input_ids=ids[:2, -1:], past_key_values=cache)
        with pytest.raises(ValueError, match="packed documents"):
            model(input_ids=ids[:, -1:], past_key_values=cache, seq_idx=torch.zeros(3, 1, dtype=torch.int32))

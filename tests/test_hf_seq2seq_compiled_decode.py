"""The compiled decode step of MomentumSeq2SeqForConditionalGeneration with a
StaticMomentumSeq2SeqCache: one graph (fullgraph=True raises on a graph break) compiled once for
every step, logits equal to the eager MomentumSeq2SeqCache step on a left-padded batch, states and
memories kept in place (also when beam search reorders them), and
generate(cache_implementation="static") compiling the step itself and choosing the eager tokens,
greedy and with beam search. The aot_eager backend traces what inductor compiles without its C++
build, as in test_hf_compiled_decode.py."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from test_hf_compiled_decode import compile_config
from test_hf_seq2seq import CROSS, EOS, model, padded, random_seqs
from torch._dynamo.testing import CompileCounterWithBackend
from torch._dynamo.utils import counters

from hf_momentum import MomentumSeq2SeqCache
from hf_momentum.modeling_common import CACHE_NAME
from hf_momentum.modeling_momentum_seq2seq import StaticMomentumSeq2SeqCache, memory_tensors

STEPS = 4


def held_tensors(cache, layers):
    """Every tensor the cache holds: each layer's states, then its memory's."""
    return [t for i in range(layers) for t in (*cache.get_states(i), *memory_tensors(cache.get_memory(i)))]


@pytest.mark.parametrize("cross", CROSS)
def test_compiled_step_is_one_graph_equal_to_eager(cross, make_generator):
    m = model(cross_attention=cross, connection="adaptive")
    src, mask = padded(random_seqs(make_generator(), [6, 3, 8]), "left")
    start = torch.full((3, 1), EOS)
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    step = torch.compile(m, backend=counter, fullgraph=True, dynamic=False)
    layers = m.config.num_hidden_layers
    with torch.no_grad():
        static, dynamic = StaticMomentumSeq2SeqCache(m.config), MomentumSeq2SeqCache(m.config)
        first = m(input_ids=src, attention_mask=mask, decoder_input_ids=start, **{CACHE_NAME: static})
        eager = m(input_ids=src, attention_mask=mask, decoder_input_ids=start, **{CACHE_NAME: dynamic})
        encoder = (first.encoder_last_hidden_state,)
        addresses = [t.data_ptr() for t in held_tensors(static, layers)]
        for _ in range(STEPS):
            token = eager.logits[:, -1:].argmax(-1)
            first = step(encoder_outputs=encoder, attention_mask=mask, decoder_input_ids=token,
                         **{CACHE_NAME: static})
            eager = m(encoder_outputs=encoder, attention_mask=mask, decoder_input_ids=token,
                      **{CACHE_NAME: dynamic})
            torch.testing.assert_close(first.logits, eager.logits, rtol=1e-12, atol=1e-12)
    assert counter.frame_count == 1, "a decode step was compiled again"
    assert [t.data_ptr() for t in held_tensors(static, layers)] == addresses
    for a, b in zip(held_tensors(static, layers), held_tensors(dynamic, layers)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_reordering_keeps_states_and_memories_in_place(make_generator):
    m = model(cross_attention="softmax")
    src, mask = padded(random_seqs(make_generator(), [5, 2, 4]), "right")
    layers = m.config.num_hidden_layers
    with torch.no_grad():
        cache = StaticMomentumSeq2SeqCache(m.config)
        m(input_ids=src, attention_mask=mask, decoder_input_ids=torch.full((3, 1), EOS),
          **{CACHE_NAME: cache})
    addresses = [t.data_ptr() for t in held_tensors(cache, layers)]
    before = [t.clone() for t in held_tensors(cache, layers)]
    cache.reorder_cache(torch.tensor([2, 0, 0]))
    for old, new in zip(before, held_tensors(cache, layers)):
        assert torch.equal(new, old[[2, 0, 0]])
    assert [t.data_ptr() for t in held_tensors(cache, layers)] == addresses


@pytest.mark.parametrize("search", [dict(), dict(num_beams=2)], ids=["greedy", "beam"])
def test_generate_compiles_the_step_once_and_picks_the_eager_tokens(search, make_generator):
    """Greedy decoding runs the compiled step (transformers 5.23 compiles greedy and sampling
    steps, not beam search's); beam search reorders the static cache in place."""
    m = model(cross_attention="momentum", connection="momentum")
    src, mask = padded(random_seqs(make_generator(), [6, 3]), "left")
    assert_static_generate_picks_the_eager_tokens(m, src, mask, search)


def assert_static_generate_picks_the_eager_tokens(m, src, mask, search):
    """generate(cache_implementation="static") compiles greedy decoding's step once and gives the
    eager tokens (beam search's too)."""
    kwargs = dict(input_ids=src, attention_mask=mask, max_new_tokens=STEPS + 1, min_new_tokens=STEPS + 1,
                  do_sample=False, **search)
    torch._dynamo.reset()
    counters.clear()
    with torch.no_grad():
        compiled = m.generate(cache_implementation="static", compile_config=compile_config(), **kwargs)
        graphs = counters["stats"]["unique_graphs"]
        eager = m.generate(**kwargs)
    if not search:
        assert graphs == 1, f"generate() compiled {graphs} graphs for its decode steps"
    assert torch.equal(compiled, eager)

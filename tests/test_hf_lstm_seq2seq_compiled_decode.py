"""The compiled decode step of MomentumLSTMSeq2SeqForConditionalGeneration with a
StaticMomentumLSTMSeq2SeqCache: one graph (fullgraph=True raises on a graph break) compiled once for
every step, logits equal to the eager MomentumLSTMSeq2SeqCache step on a left-padded batch, states and
the encoder's outputs kept in place (also when beam search reorders them), and
generate(cache_implementation="static") compiling the step itself and choosing the eager tokens,
greedy and with beam search. The aot_eager backend traces what inductor compiles without its C++
build, as in test_hf_compiled_decode.py."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from test_hf_momentum_lstm_seq2seq import CELLS, EOS, model, padded, random_seqs
from test_hf_seq2seq_compiled_decode import assert_static_generate_picks_the_eager_tokens
from torch._dynamo.testing import CompileCounterWithBackend

from hf_momentum import MomentumLSTMSeq2SeqCache
from hf_momentum.modeling_common import CACHE_NAME
from hf_momentum.modeling_momentum_lstm_seq2seq import StaticMomentumLSTMSeq2SeqCache

STEPS = 4


def held_tensors(cache):
    """Every tensor the cache holds: the states (placeholders of absent parts included), then the
    encoder's outputs and their mask."""
    return [*cache.get_states(0), *(t for t in cache.memory if t is not None)]


@pytest.mark.parametrize("cell", ["adam", "nag"])
def test_compiled_step_is_one_graph_equal_to_eager(cell, make_generator):
    m = model(**CELLS.get(cell, {}))
    src, mask = padded(random_seqs(make_generator(), [6, 3, 8]), "left")
    start = torch.full((3, 1), EOS)
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    step = torch.compile(m, backend=counter, fullgraph=True, dynamic=False)
    with torch.no_grad():
        static, dynamic = StaticMomentumLSTMSeq2SeqCache(m.config), MomentumLSTMSeq2SeqCache(m.config)
        first = m(input_ids=src, attention_mask=mask, decoder_input_ids=start, **{CACHE_NAME: static})
        eager = m(input_ids=src, attention_mask=mask, decoder_input_ids=start, **{CACHE_NAME: dynamic})
        addresses = [t.data_ptr() for t in held_tensors(static)]
        for _ in range(STEPS):
            token = eager.logits[:, -1:].argmax(-1)
            first = step(decoder_input_ids=token, **{CACHE_NAME: static})    # the source is in the cache
            eager = m(decoder_input_ids=token, **{CACHE_NAME: dynamic})
            torch.testing.assert_close(first.logits, eager.logits, rtol=1e-12, atol=1e-12)
    assert counter.frame_count == 1, "a decode step was compiled again"
    assert [t.data_ptr() for t in held_tensors(static)] == addresses
    for a, b in zip(held_tensors(static), held_tensors(dynamic)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_reordering_keeps_states_and_memory_in_place(make_generator):
    m = model()
    src, mask = padded(random_seqs(make_generator(), [5, 2, 4]), "right")
    with torch.no_grad():
        cache = StaticMomentumLSTMSeq2SeqCache(m.config)
        m(input_ids=src, attention_mask=mask, decoder_input_ids=torch.full((3, 1), EOS),
          **{CACHE_NAME: cache})
    addresses = [t.data_ptr() for t in held_tensors(cache)]
    before = [t.clone() for t in held_tensors(cache)]
    cache.reorder_cache(torch.tensor([2, 0, 0]))
    for old, new in zip(before, held_tensors(cache)):
        assert torch.equal(new, old[[2, 0, 0]])
    assert [t.data_ptr() for t in held_tensors(cache)] == addresses


@pytest.mark.parametrize("search", [dict(), dict(num_beams=2)], ids=["greedy", "beam"])
def test_generate_compiles_the_step_once_and_picks_the_eager_tokens(search, make_generator):
    """Greedy decoding runs the compiled step (transformers 5.23 compiles greedy and sampling
    steps, not beam search's); beam search reorders the static cache in place."""
    m = model()
    src, mask = padded(random_seqs(make_generator(), [6, 3]), "left")
    assert_static_generate_picks_the_eager_tokens(m, src, mask, search)

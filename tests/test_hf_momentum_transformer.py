"""Native MomentumTransformer family: config validation, forward pass against a reference built
from plugins' quadratic attention and connection modules, recurrent-cache generation (greedy,
sampling, beam) against use_cache=False, left-padded batches, classification pooling,
gradient checkpointing."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
import torch.nn.functional as F
from helpers.hf_transformer import PAD, reference_forward, tiny
from transformers import AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification

from hf_momentum import (
    MomentumCache,
    MomentumTransformerConfig,
    MomentumTransformerForCausalLM,
    MomentumTransformerForSequenceClassification,
    MomentumTransformerModel,
)


@pytest.mark.parametrize("kwargs, argument", [
    (dict(attention_momentum=1.0), "attention_momentum"),
    (dict(attention_momentum=-0.5), "attention_momentum"),
    (dict(attention_step_size=0), "attention_step_size"),
    (dict(attention_feature_map="exp"), "attention_feature_map"),
    (dict(connection="nesterov"), "connection"), (dict(connection_momentum=1.5), "connection_momentum"),
    (dict(connection_step_size=-1.0), "connection_step_size"), (dict(adaptive_delta=0.0), "adaptive_delta"),
    (dict(adaptive_delta=2.0), "adaptive_delta"), (dict(hidden_dropout=1.0), "hidden_dropout"),
    (dict(layer_norm="sandwich"), "layer_norm"), (dict(hidden_size=30), "divisible"),
    (dict(num_hidden_layers=0), "num_hidden_layers"), (dict(vocab_size=2.5), "vocab_size"),
    (dict(is_causal="yes"), "is_causal"),
])
def test_bad_config_values_raise(kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        tiny(**kwargs)


def test_auto_classes_are_registered():
    config = tiny()
    assert isinstance(config, MomentumTransformerConfig)
    assert type(AutoModel.from_config(config)) is MomentumTransformerModel
    assert type(AutoModelForCausalLM.from_config(config)) is MomentumTransformerForCausalLM
    assert type(AutoModelForSequenceClassification.from_config(tiny(is_causal=False))) \
        is MomentumTransformerForSequenceClassification
    with pytest.raises(ValueError, match="is_causal"):
        MomentumTransformerForCausalLM(tiny(is_causal=False))


@pytest.mark.parametrize("connection", ["none", "momentum", "adaptive"])
@pytest.mark.parametrize("layer_norm", ["pre", "post"])
@pytest.mark.parametrize("is_causal", [True, False])
def test_forward_matches_plugins_reference(connection, layer_norm, is_causal, make_generator):
    torch.manual_seed(0)
    config = tiny(connection=connection, layer_norm=layer_norm, is_causal=is_causal, connection_momentum=0.3,
                  connection_step_size=0.9)
    model = MomentumTransformerModel(config).eval()
    ids = torch.randint(3, 100, (2, 9), generator=make_generator())
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :4] = 0
    with torch.no_grad():
        for m in (None, mask):
            out = model(input_ids=ids, attention_mask=m, use_cache=False).last_hidden_state
            ref = reference_forward(model, ids, m)
            keep = slice(None) if m is None else m.bool()
            torch.testing.assert_close(out[keep], ref[keep], atol=2e-5, rtol=1e-4)


def generate(model, **kwargs):
    out = model.generate(max_new_tokens=6, min_new_tokens=6, output_scores=True, return_dict_in_generate=True,
                         pad_token_id=PAD, **kwargs)
    return out.sequences, torch.stack(out.scores, 1)


def finite(t):
    return torch.where(t.isfinite(), t, torch.zeros_like(t))


@pytest.mark.parametrize("mode", ["greedy", "sample", "beam"])
@pytest.mark.parametrize("connection", ["none", "adaptive"])
def test_cache_equals_no_cache(mode, connection, make_generator):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny(connection=connection)).eval()
    ids = torch.randint(3, 100, (2, 7), generator=make_generator())
    kwargs = {"greedy": dict(do_sample=False), "sample": dict(do_sample=True, top_k=0),
              "beam": dict(num_beams=3, do_sample=False, num_return_sequences=2)}[mode]
    results = []
    for use_cache in (True, False):
        torch.manual_seed(1)
        with torch.no_grad():
            results.append(generate(model, input_ids=ids, use_cache=use_cache, **kwargs))
    (seq, sc), (seq_nc, sc_nc) = results
    assert torch.equal(seq, seq_nc)
    torch.testing.assert_close(finite(sc), finite(sc_nc), atol=1e-5, rtol=1e-4)


def test_left_padded_batch_generates_each_prompt_alone(make_generator):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny(connection="momentum")).eval()
    lengths = [7, 4, 2]
    ids = torch.randint(3, 100, (3, 7), generator=make_generator())
    mask = torch.zeros(3, 7, dtype=torch.long)
    for row, n in enumerate(lengths):
        mask[row, 7 - n:] = 1
    ids[mask == 0] = PAD
    with torch.no_grad():
        seq, sc = generate(model, input_ids=ids, attention_mask=mask, do_sample=False)
        for row, n in enumerate(lengths):
            alone_seq, alone_sc = generate(model, input_ids=ids[row:row + 1, 7 - n:], do_sample=False)
            assert torch.equal(seq[row, 7:], alone_seq[0, n:])
            torch.testing.assert_close(finite(sc[row]), finite(alone_sc[0]), atol=1e-5, rtol=1e-4)


def test_generate_follows_given_position_ids(make_generator):
    """position_ids given to generate() (each row's shifted by 5) are extended and read at every
    step: the cached scores equal the uncached forward's of the whole sequence at the same positions,
    and differ from those without (which the model counts itself)."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny()).eval()
    ids = torch.randint(3, 100, (2, 5), generator=make_generator())

    def logits(**positions):
        out = model.generate(input_ids=ids, max_new_tokens=6, do_sample=False, output_logits=True,
                             return_dict_in_generate=True, pad_token_id=PAD, **positions)
        return out.sequences, torch.stack(out.logits, 1)
    with torch.no_grad():
        seq, shifted = logits(position_ids=torch.arange(5).expand(2, -1) + 5)
        whole = model(input_ids=seq, position_ids=torch.arange(seq.shape[1]).expand(2, -1) + 5).logits
        _, own = logits()
    assert seq.shape[1] > 6
    torch.testing.assert_close(shifted, whole[:, 4:-1], atol=1e-5, rtol=1e-4)
    assert (shifted - own).abs().max() > 1e-3


def test_cache_state_does_not_grow_and_reorders(make_generator):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny()).eval()
    ids = torch.randint(3, 100, (2, 5), generator=make_generator())
    cache = MomentumCache(model.config)
    sizes = []
    with torch.no_grad():
        out = model(input_ids=ids, past_key_values=cache, use_cache=True)
        for _ in range(4):
            sizes.append(sum(t.numel() for i in range(2) for t in cache.get_states(i)))
            out = model(input_ids=out.logits[:, -1:].argmax(-1), past_key_values=cache, use_cache=True)
    assert len(set(sizes)) == 1 and cache.get_seq_length() == 9
    before = cache.get_states(1)[0].clone()
    cache.reorder_cache(torch.tensor([1, 0]))
    torch.testing.assert_close(cache.get_states(1)[0], before.flip(0))
    with pytest.raises(RuntimeError):
        cache.crop(-1)


def test_state_layout_is_the_plugins_state(make_generator):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny()).eval()
    ids = torch.randint(3, 100, (1, 5), generator=make_generator())
    cache = MomentumCache(model.config)
    with torch.no_grad():
        model(input_ids=ids, past_key_values=cache, use_cache=True)
    state = cache.get_attention_state(0)
    assert state.s.shape == (1, 4, 8, 8) and state.z.shape == (1, 4, 8) and state.s.dtype == torch.float32


def test_sequence_classification_pools_real_tokens(make_generator):
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(tiny(is_causal=False, num_labels=3)).eval()
    ids = torch.randint(3, 100, (2, 8), generator=make_generator())
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 5:] = 0
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, labels=torch.tensor([0, 2]))
        alone = model(input_ids=ids[1:, :5]).logits
        hidden = model.model(input_ids=ids[1:, :5], use_cache=False).last_hidden_state
    torch.testing.assert_close(out.logits[1:], alone, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(alone, model.score(hidden.mean(1)))
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits, torch.tensor([0, 2])))


def test_bidirectional_model_refuses_cache():
    model = MomentumTransformerModel(tiny(is_causal=False))
    with pytest.raises(ValueError, match="use_cache"):
        model(input_ids=torch.ones(1, 3, dtype=torch.long), use_cache=True)


@pytest.mark.parametrize("connection", ["none", "momentum"])
def test_gradient_checkpointing_gives_the_same_gradients(connection, make_generator):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny(connection=connection)).train()
    ids = torch.randint(3, 100, (2, 9), generator=make_generator())
    grads = []
    for checkpointing in (False, True):
        if checkpointing:
            model.activation_checkpointing_enable()
        model.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert model.model.layers[0].gradient_checkpointing
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 10
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], atol=1e-6, rtol=1e-5)


def test_loss_is_next_token_cross_entropy(make_generator):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny()).eval()
    ids = torch.randint(3, 100, (2, 6), generator=make_generator())
    with torch.no_grad():
        out = model(input_ids=ids, labels=ids)
    expected = F.cross_entropy(out.logits[:, :-1].reshape(-1, 100), ids[:, 1:].reshape(-1))
    torch.testing.assert_close(out.loss, expected)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_chunked_prefill_equals_one_shot(make_generator):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny(connection="adaptive")).eval()
    ids = torch.randint(3, 100, (2, 9), generator=make_generator())
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :4] = 0
    ids[mask == 0] = PAD
    with torch.no_grad():
        seq, sc = generate(model, input_ids=ids, attention_mask=mask, do_sample=False)
        seq_chunked, sc_chunked = generate(model, input_ids=ids, attention_mask=mask, do_sample=False,
                                           prefill_chunk_size=4)
    assert torch.equal(seq, seq_chunked)
    torch.testing.assert_close(finite(sc), finite(sc_chunked), atol=1e-5, rtol=1e-4)

"""hf_momentum's registered "momentum" / "linear_attention" implementations in stock models:
kernel calls against the quadratic plugins references, padding equivalence (a padded row equals
its sequence alone), generation (dynamic and static KV cache == no cache, left-padded batch ==
each prompt alone)."""
import os
from types import SimpleNamespace

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from transformers import (
    AttentionInterface,
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForSeq2SeqLM,
)
from transformers.masking_utils import (
    AttentionMaskInterface,
    bidirectional_mask_function,
    causal_mask_function,
)

import hf_momentum
from hf_momentum import attention_interface as ai
from plugins.attention import (
    FEATURE_MAPS,
    naive_causal_momentum_attention,
    naive_noncausal_momentum_attention,
)
from plugins.transformer.config import block_feature_maps

BETA, GAMMA = 0.5, 0.8
PAD = 0


def tiny_config(model_type):
    common = dict(vocab_size=100, pad_token_id=PAD, bos_token_id=1, eos_token_id=2)
    if model_type == "gpt2":
        cfg = dict(n_embd=32, n_layer=2, n_head=4, n_positions=64)
    elif model_type == "t5":
        cfg = dict(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, decoder_start_token_id=PAD)
    elif model_type == "bart":
        cfg = dict(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                   decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                   max_position_embeddings=64, decoder_start_token_id=2)
    else:
        cfg = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                   max_position_embeddings=64)
        if model_type in ("llama", "mistral", "qwen2"):
            cfg["num_key_value_heads"] = 2
    config = AutoConfig.for_model(model_type, **common, **cfg)
    return hf_momentum.set_momentum_attention(config, momentum=BETA, step_size=GAMMA)


def padded(generator, lengths, total, side):
    ids = torch.randint(3, 100, (len(lengths), total), generator=generator)
    mask = torch.zeros(len(lengths), total, dtype=torch.long)
    for row, n in enumerate(lengths):
        if side == "left":
            mask[row, total - n:] = 1
        else:
            mask[row, :n] = 1
    ids[mask == 0] = PAD
    return ids, mask


def real(t, mask_row):
    return t[mask_row.bool()]


def test_registered_in_both_interfaces():
    for name in (hf_momentum.MOMENTUM, hf_momentum.LINEAR):
        assert name in AttentionInterface._global_mapping
        assert name in AttentionMaskInterface._global_mapping
    # every non-negative map of plugins; "identity" is refused for raw q, k projections
    assert sorted(block_feature_maps()) == sorted(set(FEATURE_MAPS) - {"identity"})


@pytest.mark.parametrize("kwargs, argument", [
    (dict(momentum=1.0), "attention_momentum"), (dict(momentum=-0.1), "attention_momentum"),
    (dict(step_size=0.0), "attention_step_size"), (dict(feature_map="softmax"), "attention_feature_map"),
])
def test_set_momentum_attention_rejects_bad_values(kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        hf_momentum.set_momentum_attention(AutoConfig.for_model("llama"), **kwargs)


def test_defaults_and_sub_configs():
    config = hf_momentum.set_momentum_attention(tiny_config("t5"), momentum=0.3)
    assert ((config.attention_momentum, config.attention_step_size, config.attention_feature_map)
            == (0.3, 1.0, "elu"))


@pytest.mark.parametrize("model_type", ["gpt_neo", "bloom", "mpt", "deberta-v2", "xlnet"])
def test_refuses_families_that_bypass_the_interface(model_type):
    with pytest.raises(ValueError, match="custom attention"):
        hf_momentum.set_momentum_attention(AutoConfig.for_model(model_type))


def module(causal):
    return SimpleNamespace(is_causal=causal, config=SimpleNamespace(
        attention_momentum=BETA, attention_step_size=GAMMA, attention_feature_map="elu"))


def test_kernel_gqa_and_padding_against_naive(make_generator):
    g = make_generator()
    q = torch.randn(2, 4, 7, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, 2, 7, 8, generator=g, dtype=torch.float64) for _ in range(2))
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[1, :3] = False
    out, weights = ai.momentum_attention_forward(module(True), q, k, v, mask)
    assert weights is None and out.shape == (2, 7, 4, 8)
    ref = naive_causal_momentum_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1),
                                          momentum=BETA, step_size=GAMMA, padding_mask=mask)
    torch.testing.assert_close(out.transpose(1, 2)[1, :, 3:], ref[1, :, 3:])
    torch.testing.assert_close(out.transpose(1, 2)[0], ref[0])


def test_kernel_with_kv_cache_queries_equal_last_rows(make_generator):
    g = make_generator()
    q, k, v = (torch.randn(1, 2, 9, 4, generator=g, dtype=torch.float64) for _ in range(3))
    full, _ = ai.momentum_attention_forward(module(True), q, k, v, None)
    last, _ = ai.momentum_attention_forward(module(True), q[:, :, -2:], k, v, None)
    torch.testing.assert_close(last, full[:, -2:])


def test_kernel_cross_attention_against_naive(make_generator):
    g = make_generator()
    q = torch.randn(2, 2, 3, 4, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, 2, 6, 4, generator=g, dtype=torch.float64) for _ in range(2))
    mask = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    out, _ = ai.momentum_attention_forward(module(False), q, k, v, mask)
    ref = naive_noncausal_momentum_attention(q, k, v, momentum=BETA, step_size=GAMMA, padding_mask=mask)
    torch.testing.assert_close(out.transpose(1, 2), ref)
    lin, _ = ai.linear_attention_forward(module(False), q, k, v, mask)
    torch.testing.assert_close(lin.transpose(1, 2), naive_noncausal_momentum_attention(
        q, k, v, momentum=0.0, step_size=1.0, padding_mask=mask))


def test_heads_that_grouped_query_attention_cannot_share_are_refused():
    """A config whose num_key_value_heads does not divide num_attention_heads (qwen2's default of
    32 key/value heads with 4 query heads) is named, where the kernel would fail on a reshape."""
    q = torch.randn(1, 4, 3, 8)
    for k, v in ((torch.randn(1, 32, 3, 8),) * 2, (torch.randn(1, 3, 3, 8),) * 2,
                 (torch.randn(1, 2, 3, 8), torch.randn(1, 4, 3, 8))):
        with pytest.raises(ValueError, match="num_attention_heads must be a multiple of num_key_value_heads"):
            ai.momentum_attention_forward(module(True), q, k, v, None)
    config = AutoConfig.for_model("qwen2", hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                  vocab_size=60, intermediate_size=64)
    hf_momentum.set_momentum_attention(config)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="momentum")
    with pytest.raises(ValueError, match=r"Qwen2Attention: 4 query heads cannot share 32 key"):
        model(torch.arange(3, 9)[None])


def test_four_d_masks_are_refused():
    q = torch.randn(1, 1, 2, 4)
    with pytest.raises(ValueError, match="2D"):
        ai.momentum_attention_forward(module(True), q, q, q, torch.ones(1, 1, 2, 2, dtype=torch.bool))


def windowed(window, model_type="mistral", head=AutoModelForCausalLM):
    config = tiny_config(model_type)
    config.sliding_window = window
    torch.manual_seed(0)
    return head.from_config(config, attn_implementation="momentum").eval()


def test_a_sliding_window_is_exact_where_it_drops_no_key_and_refused_where_it_would(make_generator):
    """Mistral's window of 4 keys: sequences of up to 4 tokens (a packed row of such documents
    too) are the windowless model's; a longer one, or generation past the window (the sliding
    cache drops keys), is refused rather than run over keys the model's own attention would not
    see."""
    g = make_generator()
    model, windowless = windowed(4), windowed(None)
    ids = torch.randint(3, 100, (1, 7), generator=g)
    with torch.no_grad():
        torch.testing.assert_close(model(ids[:, :4]).logits, windowless(ids[:, :4]).logits, rtol=0, atol=0)
        packed = model(ids[:, :7], position_ids=torch.tensor([[0, 1, 2, 3, 0, 1, 2]])).logits
        torch.testing.assert_close(packed[:, :4], windowless(ids[:, :4]).logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(packed[:, 4:], windowless(ids[:, 4:]).logits, rtol=1e-5, atol=1e-5)
        with pytest.raises(ValueError, match="sliding window of 4 keys.*5 tokens"):
            model(ids[:, :5])
        with pytest.raises(ValueError, match="sliding window of 4 keys.*5 tokens"):
            model(ids[:, :7], position_ids=torch.tensor([[0, 1, 2, 3, 4, 0, 1]]))
        greedy = dict(max_new_tokens=2, do_sample=False)
        assert torch.equal(model.generate(ids[:, :2], **greedy), windowless.generate(ids[:, :2], **greedy))
        with pytest.raises(ValueError, match="dropped the keys before position 1"):
            model.generate(ids[:, :3], max_new_tokens=3, do_sample=False)


def test_a_bidirectional_local_window_is_refused_where_it_would_drop_keys():
    """ModernBERT's local layers (sliding_window = local_attention / 2 + 1 keys either side)."""
    config = AutoConfig.for_model("modernbert", vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=4, intermediate_size=64, local_attention=4,
                                  global_attn_every_n_layers=2, pad_token_id=PAD)
    model = AutoModel.from_config(config, attn_implementation="momentum").eval()
    with torch.no_grad():
        model(torch.randint(3, 100, (1, 3)))
        with pytest.raises(ValueError, match="sliding window of 3 keys.*4 tokens"):
            model(torch.randint(3, 100, (1, 4)))


DECODERS = ["llama", "mistral", "qwen2", "gpt2", "gpt_neox"]
ENCODERS = ["bert", "roberta"]


@pytest.mark.parametrize("model_type", DECODERS + ENCODERS)
@pytest.mark.parametrize("impl", ["momentum", "linear_attention"])
def test_padded_batch_equals_sequences_alone(model_type, impl, make_generator):
    torch.manual_seed(0)
    model = AutoModel.from_config(tiny_config(model_type), attn_implementation=impl).eval()
    assert model.config._attn_implementation == impl
    side = "right" if model_type in ENCODERS else "left"
    ids, mask = padded(make_generator(), [6, 4, 2], 6, side)
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    extra = {} if model_type in ENCODERS else {"position_ids": position_ids}
    with torch.no_grad():
        batch = model(input_ids=ids, attention_mask=mask, **extra).last_hidden_state
        for row in range(3):
            alone = model(input_ids=real(ids[row], mask[row])[None]).last_hidden_state[0]
            torch.testing.assert_close(real(batch[row], mask[row]), alone, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("model_type", DECODERS)
def test_left_padding_numbered_from_the_padding_is_refused_on_rotary_models(model_type, make_generator):
    """Rotary models: a left-padded batch at the model's default positions (counting the padding)
    would not equal its rows alone under linear attention, so it is refused naming position_ids;
    right padding and positions from the mask run. GPT-2's learned absolute positions shift with
    left padding under softmax as well (transformers' behaviour), so it is not refused."""
    torch.manual_seed(0)
    model = AutoModel.from_config(tiny_config(model_type), attn_implementation="momentum").eval()
    ids, mask = padded(make_generator(), [6, 4, 2], 6, "left")
    with torch.no_grad():
        if model_type == "gpt2":
            model(input_ids=ids, attention_mask=mask)
        else:
            with pytest.raises(ValueError, match="position_ids=attention_mask.cumsum"):
                model(input_ids=ids, attention_mask=mask)
            with pytest.raises(ValueError, match="padding_side"):
                model(input_ids=ids, attention_mask=mask, position_ids=torch.arange(6).expand(3, 6))
        model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0))
        right_ids, right_mask = padded(make_generator(), [6, 4, 2], 6, "right")
        batch = model(input_ids=right_ids, attention_mask=right_mask).last_hidden_state
        alone = model(input_ids=right_ids[2:, :2]).last_hidden_state[0]
        torch.testing.assert_close(batch[2, :2], alone, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("model_type", DECODERS + ENCODERS)
def test_set_attn_implementation_switches_the_kernel(model_type, make_generator):
    torch.manual_seed(0)
    model = AutoModel.from_config(tiny_config(model_type), attn_implementation="sdpa").eval()
    ids, _ = padded(make_generator(), [5], 5, "left")
    with torch.no_grad():
        softmax = model(input_ids=ids).last_hidden_state
        model.set_attn_implementation("momentum")
        momentum = model(input_ids=ids).last_hidden_state
        reference = AutoModel.from_config(model.config, attn_implementation="momentum").eval()
        reference.load_state_dict(model.state_dict())
        torch.testing.assert_close(momentum, reference(input_ids=ids).last_hidden_state)
    assert (softmax - momentum).abs().max() > 1e-3


def scores(model, **kwargs):
    out = model.generate(max_new_tokens=5, min_new_tokens=5, do_sample=False, output_scores=True,
                         return_dict_in_generate=True, pad_token_id=PAD, **kwargs)
    return out.sequences, torch.stack(out.scores, 1)


def finite(t):
    return torch.where(t.isfinite(), t, torch.zeros_like(t))


def test_mask_function_marks_unfilled_static_cache_slots():
    padding = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    causal = ai.padding_mask_function(2, 1, 8, q_offset=3, mask_function=causal_mask_function,
                                      attention_mask=padding)
    assert causal.tolist() == [[False, True, True, True] + [False] * 4, [True] * 4 + [False] * 4]
    both = ai.padding_mask_function(2, 1, 8, q_offset=3, mask_function=bidirectional_mask_function,
                                    attention_mask=padding)
    assert both.tolist() == [[False] + [True] * 3 + [False] * 4, [True] * 4 + [False] * 4]
    assert ai.padding_mask_function(2, 4, 4, mask_function=causal_mask_function) is None


@pytest.mark.parametrize("model_type", DECODERS)
def test_generate_left_padded_and_cache_free(model_type, make_generator):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config(model_type), attn_implementation="momentum").eval()
    ids, mask = padded(make_generator(), [5, 3], 5, "left")
    with torch.no_grad():
        seq, sc = scores(model, input_ids=ids, attention_mask=mask)
        seq_nc, sc_nc = scores(model, input_ids=ids, attention_mask=mask, use_cache=False)
        torch.testing.assert_close(sc, sc_nc, atol=1e-5, rtol=1e-4)
        assert torch.equal(seq, seq_nc)
        seq_st, sc_st = scores(model, input_ids=ids, attention_mask=mask, cache_implementation="static")
        torch.testing.assert_close(finite(sc), finite(sc_st), atol=1e-5, rtol=1e-4)
        assert torch.equal(seq, seq_st)
        seq_ch, sc_ch = scores(model, input_ids=ids, attention_mask=mask, prefill_chunk_size=2)
        torch.testing.assert_close(finite(sc), finite(sc_ch), atol=1e-5, rtol=1e-4)
        for row in range(2):
            alone_seq, alone_sc = scores(model, input_ids=real(ids[row], mask[row])[None])
            torch.testing.assert_close(sc[row], alone_sc[0], atol=1e-5, rtol=1e-4)
            assert torch.equal(seq[row, -5:], alone_seq[0, -5:])


@pytest.mark.parametrize("model_type", ["t5", "bart"])
def test_encoder_decoder_generate_with_padded_sources(model_type, make_generator):
    torch.manual_seed(0)
    model = AutoModelForSeq2SeqLM.from_config(tiny_config(model_type), attn_implementation="momentum").eval()
    ids, mask = padded(make_generator(), [6, 3], 6, "right")
    with torch.no_grad():
        seq, sc = scores(model, input_ids=ids, attention_mask=mask)
        _, sc_nc = scores(model, input_ids=ids, attention_mask=mask, use_cache=False)
        torch.testing.assert_close(sc, sc_nc, atol=1e-5, rtol=1e-4)
        alone_seq, alone_sc = scores(model, input_ids=ids[1:, :3])
        torch.testing.assert_close(sc[1], alone_sc[0], atol=1e-5, rtol=1e-4)
        assert torch.equal(seq[1], alone_seq[0])
        softmax = AutoModelForSeq2SeqLM.from_config(model.config, attn_implementation="eager").eval()
        softmax.load_state_dict(model.state_dict())
        diff = scores(softmax, input_ids=ids, attention_mask=mask)[1] - sc
        assert diff[diff.isfinite()].abs().max() > 1e-3


def smoke_config(model_type):
    config = AutoConfig.for_model(model_type, vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                  intermediate_size=64, max_position_embeddings=64, pad_token_id=PAD)
    sizes = dict(d_model=32, embedding_size=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
                 decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, num_local_experts=2)
    for key, value in sizes.items():
        if hasattr(config, key):
            setattr(config, key, value)
    return hf_momentum.set_momentum_attention(config, momentum=BETA, step_size=GAMMA)


@pytest.mark.parametrize("model_type", hf_momentum.SMOKE_TESTED_MODEL_TYPES)
def test_smoke_families_use_the_kernel_and_ignore_padding(model_type, monkeypatch, make_generator):
    calls = []
    kernel = ai._forward
    monkeypatch.setattr(ai, "_forward", lambda *a: calls.append(a[4]) or kernel(*a))
    torch.manual_seed(0)
    model = AutoModel.from_config(smoke_config(model_type), attn_implementation="momentum").eval()
    run = model.get_encoder() if model.config.is_encoder_decoder else model
    ids, mask = padded(make_generator(), [6, 4], 6, "right")
    with torch.no_grad():
        batch = run(input_ids=ids, attention_mask=mask).last_hidden_state
        alone = run(input_ids=ids[1:, :4]).last_hidden_state[0]
    assert calls and any(m is not None and m.dim() == 2 for m in calls)
    torch.testing.assert_close(batch[1, :4], alone, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("model_type", ["mpt", "deberta-v2", "gptj"])
def test_check_model_refuses_instances(model_type):
    model = AutoModel.from_config(AutoConfig.for_model(model_type, vocab_size=100, hidden_size=32, d_model=32,
                                                       n_embd=32, num_hidden_layers=1, n_layer=1, n_layers=1,
                                                       num_attention_heads=4, n_head=4, n_heads=4,
                                                       intermediate_size=64))
    with pytest.raises(ValueError, match="custom attention"):
        hf_momentum.check_model(model)


def test_packed_rows_are_derived_once_per_forward_and_again_for_a_rewritten_buffer(monkeypatch,
                                                                                   make_generator):
    """Every layer gets the same position_ids tensor: the first derives the packed rows, the
    others reuse them. Rewriting that tensor in place (a reused buffer) is noticed."""
    model = AutoModel.from_config(tiny_config("llama"), attn_implementation="momentum").eval()
    calls = []
    original = ai._document_starts
    monkeypatch.setattr(ai, "_document_starts", lambda *a: calls.append(1) or original(*a))
    g = make_generator()
    ids = torch.randint(3, 100, (1, 12), generator=g)
    positions = torch.cat([torch.arange(5), torch.arange(7)])[None]
    with torch.no_grad():
        packed = model(input_ids=ids, position_ids=positions).last_hidden_state
        assert len(calls) == 1
        alone = [model(input_ids=ids[:, :5]).last_hidden_state, model(input_ids=ids[:, 5:]).last_hidden_state]
        torch.testing.assert_close(packed, torch.cat(alone, dim=1), atol=1e-5, rtol=1e-5)
        positions.copy_(torch.arange(12)[None])
        whole = model(input_ids=ids, position_ids=positions).last_hidden_state
        torch.testing.assert_close(whole, model(input_ids=ids).last_hidden_state, atol=1e-5, rtol=1e-5)

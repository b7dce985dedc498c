"""Hybrid momentum_transformer models (issue 29, item 3): `layer_types` in transformers' vocabulary
puts softmax layers ("full_attention", "sliding_attention" with `sliding_window`) among the
momentum layers ("linear_attention"). Each layer kind against a float64 reference written here
(softmax) or plugins' quadratic eq. 13 (momentum), packed rows against each document alone,
cached generation (greedy, left-padded, beams) against the uncached forward, save/load, remote
code, gradient checkpointing, and the config's checks."""
import json
import math
import os
import re
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from helpers.code_blocks import run_as_module
from transformers import AutoConfig, AutoModelForCausalLM, DataCollatorWithFlattening

import hf_momentum  # noqa: F401  (registers momentum_transformer)
from hf_momentum import MomentumTransformerConfig, MomentumTransformerForCausalLM
from hf_momentum.modeling_momentum_transformer import MomentumCache, StaticMomentumCache
from plugins.attention import naive_causal_momentum_attention
from plugins.connection import MomentumConnection

VOCAB = 60
HYBRID = ["linear_attention", "full_attention", "sliding_attention", "linear_attention"]


def hybrid_config(layer_types=HYBRID, **kwargs):
    base = dict(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=len(layer_types), num_attention_heads=2,
                intermediate_size=32, max_position_embeddings=64, hidden_dropout=0.0, pad_token_id=0,
                attention_momentum=0.5, attention_step_size=0.8, connection="momentum",
                layer_types=list(layer_types), sliding_window=3)
    if "sliding_attention" not in layer_types:
        base.pop("sliding_window")
    base.update(kwargs)
    return MomentumTransformerConfig(**base)


def hybrid_model(layer_types=HYBRID, **kwargs):
    torch.manual_seed(0)
    return MomentumTransformerForCausalLM(hybrid_config(layer_types, **kwargs)).eval()


def plain_softmax(q, k, v, real, window):
    """Causal eq. 1 in float64: scores q kᵀ/√D over the real keys j ≤ i with fewer than `window`
    real tokens between (None: any), −inf elsewhere, row-wise softmax, times v."""
    q, k, v = q.double(), k.double(), v.double()
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    rank = real.long().cumsum(-1) - 1
    n = q.shape[2]
    allowed = torch.ones(n, n, dtype=torch.bool).tril()[None] & real[:, None, :]
    if window is not None:
        allowed = allowed & (rank[:, :, None] - rank[:, None, :] < window)
    allowed = allowed | ~real[:, :, None]          # padded queries: any row; their output is dropped
    weights = torch.softmax(scores.masked_fill(~allowed[:, None], float("-inf")), -1)
    return (weights @ v) * real[:, None, :, None]


def reference_forward(model, ids, mask):
    """The hybrid written out layer by layer: plain_softmax for softmax layers, plugins' quadratic
    eq. 13 for momentum layers, the momentum connection eq. 15, pre-LN blocks, in float64."""
    model = model.double()
    config = model.config
    real = mask.bool()
    x = model.embed_tokens(ids) + model.embed_positions((mask.cumsum(-1) - 1).clamp(min=0))
    heads, dim = config.num_attention_heads, config.hidden_size // config.num_attention_heads
    connection, state = MomentumConnection(config.connection_momentum, config.connection_step_size), None
    for kind, layer in zip(config.layer_types, model.layers):
        att = layer.attention
        inp = layer.attn_norm(x)
        q, k, v = (p(inp).view(*ids.shape, heads, dim).transpose(1, 2)
                   for p in (att.q_proj, att.k_proj, att.v_proj))
        if kind == "linear_attention":
            a = naive_causal_momentum_attention(q, k, v, momentum=config.attention_momentum,
                                                step_size=config.attention_step_size, padding_mask=real)
        else:
            a = plain_softmax(q, k, v, real, config.sliding_window if kind == "sliding_attention" else None)
        h, state = connection(x, att.o_proj(a.transpose(1, 2).reshape(*ids.shape, -1)), state)
        x = h + layer.mlp(layer.mlp_norm(h))
    return model.norm(x)


def padded_batch(generator, batch=3, length=9):
    ids = torch.randint(1, VOCAB, (batch, length), generator=generator)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[1, :3] = 0     # left padding
    mask[2, :1] = 0
    return ids, mask


def test_each_layer_kind_equals_its_float64_reference(make_generator):
    model = hybrid_model()
    assert [layer.attention.config.attention for layer in model.model.layers] == [
        "momentum", "softmax", "softmax", "momentum"]
    ids, mask = padded_batch(make_generator())
    with torch.no_grad():
        got = model.model.double()(input_ids=ids, attention_mask=mask).last_hidden_state
        want = reference_forward(model.model, ids, mask)
    real = mask.bool()
    torch.testing.assert_close(got[real], want[real], atol=1e-10, rtol=0)
    all_momentum = hybrid_model(["linear_attention"] * 4).model.double()
    all_momentum.load_state_dict(model.model.state_dict())
    with torch.no_grad():
        differs = all_momentum(input_ids=ids, attention_mask=mask).last_hidden_state
    assert (differs[real] - want[real]).abs().max() > 1e-3     # the softmax layers are really built


def documents(generator, lengths=(5, 1, 8, 4)):
    return [torch.randint(1, VOCAB, (n,), generator=generator) for n in lengths]


@pytest.mark.parametrize("form", ["position_ids", "flash_attn_kwargs", "seq_idx"])
def test_packed_rows_equal_each_document_alone(form, make_generator):
    model = hybrid_model()
    docs = documents(make_generator())
    kwargs = {"flash_attn_kwargs": dict(return_flash_attn_kwargs=True),
              "seq_idx": dict(return_seq_idx=True)}.get(form, {})
    batch = DataCollatorWithFlattening(**kwargs)([{"input_ids": d.tolist()} for d in docs])
    with torch.no_grad():
        packed = model(**batch).logits[0]
        alone = torch.cat([model(input_ids=d[None]).logits[0] for d in docs])
        mixed = model(input_ids=batch["input_ids"]).logits[0]
    assert (packed - alone).abs().max() <= 1e-5
    assert (mixed - alone).abs().max() > 1e-2


def test_padded_rows_each_packed_equal_each_document_alone(make_generator):
    """Two rows, position_ids restarting within each, the shorter row right-padded."""
    model = hybrid_model()
    docs = documents(make_generator(), (4, 6, 3, 1, 2))
    rows = [docs[:2], docs[2:]]
    ids, mask, positions = (torch.zeros(2, 10, dtype=torch.long) for _ in range(3))
    for r, row in enumerate(rows):
        flat = torch.cat(row)
        ids[r, :len(flat)], mask[r, :len(flat)] = flat, 1
        positions[r, :len(flat)] = torch.cat([torch.arange(len(d)) for d in row])
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        alone = torch.cat([model(input_ids=d[None]).logits[0] for d in docs])
    assert (logits[mask.bool()] - alone).abs().max() <= 1e-5


def greedy_without_cache(model, ids, mask, steps):
    for _ in range(steps):
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits[:, -1]
        token = logits.argmax(-1, keepdim=True)
        ids, mask = torch.cat([ids, token], 1), torch.cat([mask, torch.ones_like(token)], 1)
    return ids


def test_cached_greedy_generation_of_a_left_padded_batch_equals_the_uncached_forward(make_generator):
    model = hybrid_model()
    ids, mask = padded_batch(make_generator())
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8, do_sample=False)
    assert torch.equal(out, greedy_without_cache(model, ids, mask, 8))


def test_cached_logits_equal_the_uncached_forward(make_generator):
    """Prefill then single steps through one MomentumCache (momentum states and key/values)."""
    model = hybrid_model()
    ids, mask = padded_batch(make_generator(), length=12)
    with torch.no_grad():
        whole = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        cache = MomentumCache(model.config)
        parts = []
        for start, stop in [(0, 7), (7, 8), (8, 9), (9, 12)]:
            parts.append(model(input_ids=ids[:, start:stop], attention_mask=mask[:, :stop],
                               past_key_values=cache).logits)
    real = mask.bool()
    assert (torch.cat(parts, 1)[real] - whole[real]).abs().max() <= 1e-5
    assert cache.key_value_layers == (1, 2)
    assert cache.get_key_values(1)[0].shape[2] == 12 and cache.get_states(0) is not None


def test_sliding_layers_keep_only_their_window_when_every_token_is_real(make_generator):
    """Without padding a sliding layer's cache keeps the last sliding_window − 1 positions (all
    the next position reads), the full layer every position, and greedy decoding still equals
    the uncached forward; with padding the sliding cache stays whole (the mask is not read)."""
    model = hybrid_model()
    ids = torch.randint(3, VOCAB, (2, 9), generator=make_generator())
    mask = torch.ones_like(ids)
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=7, do_sample=False,
                         return_dict_in_generate=True)
    assert torch.equal(out.sequences, greedy_without_cache(model, ids, mask, 7))
    cache = out.past_key_values
    assert cache.get_key_values(2)[0].shape[2] == model.config.sliding_window - 1
    assert cache.get_key_values(1)[0].shape[2] == 9 + 7 - 1
    ids, mask = padded_batch(make_generator())
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=3, do_sample=False,
                         return_dict_in_generate=True)
    assert out.past_key_values.get_key_values(2)[0].shape[2] == ids.shape[1] + 3 - 1


def test_beam_search_with_the_cache_equals_beam_search_without(make_generator):
    model = hybrid_model()
    ids, mask = padded_batch(make_generator())
    kwargs = dict(input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=False, num_beams=3,
                  num_return_sequences=2, return_dict_in_generate=True, output_scores=True)
    cached, uncached = model.generate(**kwargs), model.generate(**kwargs, use_cache=False)
    assert torch.equal(cached.sequences, uncached.sequences)
    torch.testing.assert_close(cached.sequences_scores, uncached.sequences_scores, atol=1e-5, rtol=0)
    assert len(set(cached.beam_indices[:, -2].tolist())) > 1      # the beams were reordered


DRAFT = ["linear_attention", "full_attention"]


@pytest.mark.parametrize("layer_types,draft_types", [
    (HYBRID, DRAFT), (["full_attention", *HYBRID[:2], "linear_attention"], DRAFT),
    (["full_attention", "sliding_attention"], DRAFT), (HYBRID, ["sliding_attention"])],
    ids=["linear-first", "softmax-first", "softmax-only", "softmax-only-draft"])
@pytest.mark.parametrize("padding", [0, 3])
def test_prompt_lookup_and_assisted_decoding_equal_greedy(padding, layer_types, draft_types):
    """Speculative decoding crops the one cache back to the accepted tokens: the softmax layers'
    key/values with the momentum states (hf_momentum.cache_history), whichever kind of layer comes
    first, and in a model of softmax layers only, as target or as draft (every layer keeps generate's
    past-recording switch; transformers' DynamicLayer has none, and such a cache refused its first
    crop)."""
    model = hybrid_model(layer_types)
    phrase = [7, 8, 9, 10, 11, 12]
    ids = torch.tensor([[0] * padding + phrase * 3])
    mask = (ids != 0).long()
    greedy = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False)
    lookup = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False,
                            prompt_lookup_num_tokens=4)
    draft = hybrid_model(draft_types)
    assisted = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False,
                              assistant_model=draft)
    assert torch.equal(lookup, greedy) and torch.equal(assisted, greedy)


def test_static_cache_is_refused_for_a_hybrid_before_generating(make_generator):
    model = hybrid_model()
    ids, mask = padded_batch(make_generator())
    with pytest.raises(ValueError, match=r"layers \[1, 2\] are softmax attention.*implementation unset"):
        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=2, cache_implementation="static")
    StaticMomentumCache(hybrid_config(["linear_attention"] * 2))     # all-momentum models keep it


def test_save_load_round_trip_is_exact(tmp_path, make_generator):
    model = hybrid_model()
    ids, mask = padded_batch(make_generator())
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert loaded.config.layer_types == HYBRID and loaded.config.sliding_window == 3
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids, attention_mask=mask).logits,
                           model(input_ids=ids, attention_mask=mask).logits)


def test_a_saved_config_without_layer_types_loads_all_momentum_bit_identically(tmp_path, make_generator):
    model = hybrid_model(["linear_attention"] * 3)
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config.pop("layer_types")
    config.pop("sliding_window", None)
    (tmp_path / "config.json").write_text(json.dumps(config))
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert loaded.config.layer_types == ["linear_attention"] * 3
    ids, mask = padded_batch(make_generator())
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids, attention_mask=mask).logits,
                           model(input_ids=ids, attention_mask=mask).logits)


def test_remote_code_builds_the_same_hybrid(tmp_path, make_generator):
    from helpers.clean_process import run_clean

    model = hybrid_model()
    ids, mask = padded_batch(make_generator())
    model.save_pretrained(tmp_path / "model")
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask).logits
    generated = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=4, do_sample=False)
    torch.save({"ids": ids, "mask": mask, "logits": expected, "generated": generated},
               tmp_path / "expected.pt")
    # the same thread count as here: SDPA's CPU kernel splits its sums by threads
    proc = run_clean(f"""
        import torch
        from transformers import AutoModelForCausalLM
        torch.set_num_threads({torch.get_num_threads()})
        model = AutoModelForCausalLM.from_pretrained("model", trust_remote_code=True).eval()
        e = torch.load("expected.pt")
        with torch.no_grad():
            assert torch.equal(model(input_ids=e["ids"], attention_mask=e["mask"]).logits, e["logits"])
        out = model.generate(input_ids=e["ids"], attention_mask=e["mask"], max_new_tokens=4, do_sample=False)
        assert torch.equal(out, e["generated"])
        print("OK", type(model).__module__)
    """, tmp_path, {"HF_HUB_OFFLINE": "1"})
    assert "OK transformers_modules" in proc.stdout


def test_gradient_checkpointing_gives_the_same_loss_and_gradients(make_generator):
    ids, mask = padded_batch(make_generator())
    labels = ids.masked_fill(mask == 0, -100)
    grads = []
    for checkpointing in (False, True):
        model = hybrid_model().train()
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        grads.append((loss.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (loss0, g0), (loss1, g1) = grads
    assert torch.equal(loss0, loss1)
    for name in g0:
        torch.testing.assert_close(g1[name], g0[name], atol=1e-6, rtol=1e-5)


def test_padded_training_forward_compiles_whole_and_equals_eager(make_generator):
    """torch.compile(fullgraph=True) of a hybrid's padded training loss: the softmax masks are
    built without a host read (aot_eager backend, as tests/test_hf_compile_training.py)."""
    model = hybrid_model().train()
    ids, mask = padded_batch(make_generator())

    def loss():
        model.zero_grad(set_to_none=True)
        value = model(input_ids=ids, attention_mask=mask, labels=ids).loss
        value.backward()
        return value.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    torch._dynamo.reset()
    eager, eager_grads = loss()
    compiled_forward = torch.compile(model.forward, fullgraph=True, backend="aot_eager")
    model.forward = compiled_forward
    compiled, compiled_grads = loss()
    del model.forward
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-6)
    for name, grad in eager_grads.items():
        torch.testing.assert_close(compiled_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("kwargs, match", [
    (dict(layer_types=["linear_attention", "bogus"]), "layer_types` entries must be in"),
    (dict(layer_types=["linear_attention", "chunked_attention"]),
     r"builds \['linear_attention', 'full_attention', 'sliding_attention'\] layers, "
     r"not \['chunked_attention'\]"),
    (dict(layer_types=["linear_attention"] * 3), r"num_hidden_layers` \(2\) must be equal"),
    (dict(layer_types=["linear_attention", "sliding_attention"]),
     r"'sliding_attention' at layers \[1\] but sliding_window is None"),
    (dict(layer_types=["linear_attention", "full_attention"], sliding_window=4),
     "sliding_window=4 is read by 'sliding_attention' layers only"),
    (dict(layer_types=["linear_attention", "sliding_attention"], sliding_window=0), "sliding_window"),
    (dict(layer_types=["linear_attention", "sliding_attention"], sliding_window=4, is_causal=False),
     "needs is_causal=True"),
])
def test_bad_layer_types_are_refused_naming_them(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MomentumTransformerConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2,
                                  num_attention_heads=2, **kwargs)


def test_layer_types_set_after_the_config_are_checked_when_the_model_is_built():
    config = hybrid_config(["linear_attention", "full_attention"])
    config.layer_types = ["linear_attention", "sliding_attention"]
    with pytest.raises(ValueError, match="sliding_window is None"):
        MomentumTransformerForCausalLM(config)


def test_default_layer_types_are_all_momentum():
    config = AutoConfig.for_model("momentum_transformer", num_hidden_layers=3)
    assert config.layer_types == ["linear_attention"] * 3 and config.sliding_window is None


def test_readme_hybrid_example_runs_as_written(capsys):
    """The example of hf_momentum/README.md ("Hybrid models") runs unchanged and its cache holds
    key/values for its one softmax layer."""
    text = (Path(__file__).resolve().parents[1] / "hf_momentum" / "README.md").read_text(encoding="utf-8")
    code = re.search(r"```python\n(.*?)```", text.split("### Hybrid models", 1)[1], re.S).group(1)
    namespace = run_as_module(code, "hf_momentum/README.md")
    assert capsys.readouterr().out.strip() == "MomentumCache (3,)"
    assert namespace["out"].shape == (2, 20)
    assert namespace["model"].model.layers[3].attention.config.attention == "softmax"

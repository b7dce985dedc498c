"""The encoder-decoder momentum transformer in transformers (`MomentumSeq2SeqForConditionalGeneration`):
float64 forward and gradients against the model written out with plugins' quadratic references
(eq. 13 for the decoder, eq. 14 for the encoder and the cross-attention, an explicit softmax for
softmax cross-attention), padded sources and targets against each pair alone, step-by-step
decoding with beam reordering against the full forward, generate() with and without the cache
(greedy, beam search) and on a padded batch against each source alone, the host reads of a
decoding step, save / load (also as remote code in a process without our packages), and
configuration errors."""
import json

import pytest
import torch
from gradients import assert_same_gradients
from helpers.clean_process import run_clean
from helpers.hf_transformer import reference_forward
from helpers.random_model_api import assert_scores_and_reloads_resized
from test_host_reads import HostReads
from transformers import AutoModelForSeq2SeqLM

from hf_momentum import MomentumSeq2SeqCache, MomentumSeq2SeqConfig, MomentumSeq2SeqForConditionalGeneration
from hf_momentum.modeling_common import CACHE_NAME
from plugins.attention import naive_noncausal_momentum_attention

PAD, EOS, VOCAB = 1, 2, 40
CROSS = ("momentum", "linear", "softmax")


def config(**kwargs):
    base = dict(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, encoder_layers=3,
                num_attention_heads=2, intermediate_size=24, max_position_embeddings=32, hidden_dropout=0.0,
                attention_momentum=0.5, attention_step_size=0.8, pad_token_id=PAD, bos_token_id=0,
                eos_token_id=EOS, decoder_start_token_id=EOS)
    base.update(kwargs)
    return MomentumSeq2SeqConfig(**base)


def model(seed=0, **kwargs):
    torch.manual_seed(seed)
    built = MomentumSeq2SeqForConditionalGeneration(config(**kwargs)).double().eval()
    with torch.no_grad():       # LayerNorms away from 1 / 0, so that a misplaced norm shows
        for name, p in built.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.3)
    return built


def padded(seqs, side, width=None):
    width = width or max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), PAD)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for i, s in enumerate(seqs):
        cols = slice(width - len(s), width) if side == "left" else slice(0, len(s))
        ids[i, cols], mask[i, cols] = s, 1
    return ids, mask


def random_seqs(generator, lengths):
    return [torch.randint(3, VOCAB, (n,), generator=generator) for n in lengths]


def cross_reference(layer, kind, config, h, memory, memory_mask):
    """The layer's cross-attention of h to the encoder's output, written out."""
    att, heads = layer.cross_attention, config.num_attention_heads

    def split(t):
        return t.view(t.shape[0], t.shape[1], heads, -1).transpose(1, 2)

    q, k, v = split(att.q_proj(h)), split(att.k_proj(memory)), split(att.v_proj(memory))
    real = memory_mask.bool()
    if kind == "softmax":
        scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
        out = scores.masked_fill(~real[:, None, None], float("-inf")).softmax(-1) @ v
    else:
        beta, gamma = (0.0, 1.0) if kind == "linear" else \
            (config.attention_momentum, config.attention_step_size)
        out = naive_noncausal_momentum_attention(q, k, v, momentum=beta, step_size=gamma, padding_mask=real)
    return att.o_proj(out.transpose(1, 2).reshape(h.shape))


def reference(model, src, src_mask, tgt, tgt_mask):
    """Logits of the model written out: the encoder and the decoder's self-attention by
    `reference_forward`, the cross-attention by `cross_reference` after each self-attention."""
    config = model.config
    memory = reference_forward(model.model.encoder, src, src_mask)

    def cross(layer, h):
        inp = layer.cross_norm(h) if config.layer_norm == "pre" else h
        c = h + cross_reference(layer, config.cross_attention, config, inp, memory, src_mask)
        return c if config.layer_norm == "pre" else layer.cross_norm(c)

    return model.lm_head(reference_forward(model.model.decoder, tgt, tgt_mask, after_attention=cross))


HYBRID = dict(layer_types=["full_attention", "linear_attention"],
              encoder_layer_types=["linear_attention", "full_attention", "linear_attention"])
VARIANTS = {"pre": dict(), "post-momentum-connection": dict(layer_norm="post", connection="momentum"),
            "adaptive-scaled": dict(connection="adaptive", scale_embedding=True, embedding_layer_norm=True)}


@pytest.mark.parametrize("cross", CROSS)
@pytest.mark.parametrize("variant", VARIANTS.values(), ids=VARIANTS.keys())
def test_forward_and_gradients_equal_the_written_out_model(cross, variant, make_generator):
    g = make_generator()
    m = model(cross_attention=cross, **variant)
    src, src_mask = padded(random_seqs(g, [5, 9, 2]), "left")
    tgt, tgt_mask = padded(random_seqs(g, [4, 7, 1]), "right")
    got = m(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt,
            decoder_attention_mask=tgt_mask).logits
    want = reference(m, src, src_mask, tgt, tgt_mask)
    real = tgt_mask.bool()
    torch.testing.assert_close(got[real], want[real], rtol=1e-9, atol=1e-10)
    weights = real[..., None].double()
    assert_same_gradients(got * weights, want * weights, list(m.parameters()), g, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("cross", CROSS)
@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("hybrid", [False, True], ids=["momentum", "hybrid"])
def test_padded_pairs_equal_each_pair_alone(cross, side, hybrid, make_generator):
    """Logits at real target positions and the loss of each row equal those of its pair alone;
    the loss of the batch is the mean over its real labels (transformers computes it in float32)."""
    g = make_generator()
    m = model(cross_attention=cross, connection="momentum", **(HYBRID if hybrid else {}))
    sources, targets = random_seqs(g, [6, 3, 8]), random_seqs(g, [5, 2, 4])
    src, src_mask = padded(sources, side)
    labels, tgt_mask = padded(targets, "right")
    labels = labels.masked_fill(tgt_mask == 0, -100)
    out = m(input_ids=src, attention_mask=src_mask, labels=labels,
            decoder_attention_mask=tgt_mask)
    total, count = 0.0, 0
    for i, (s, t) in enumerate(zip(sources, targets)):
        alone = m(input_ids=s[None], labels=t[None])
        torch.testing.assert_close(out.logits[i, :len(t)], alone.logits[0], rtol=1e-9, atol=1e-10)
        total, count = total + alone.loss * len(t), count + len(t)
    torch.testing.assert_close(out.loss, total / count, rtol=1e-6, atol=0)


@pytest.mark.parametrize("cross", CROSS)
@pytest.mark.parametrize("hybrid", [False, True], ids=["momentum", "hybrid"])
def test_step_by_step_decoding_with_beam_reordering_equals_the_full_forward(cross, hybrid, make_generator):
    g = make_generator()
    m = model(cross_attention=cross, connection="adaptive", **(HYBRID if hybrid else {}))
    src, src_mask = padded(random_seqs(g, [7, 4, 6]), "left")
    tgt = torch.randint(3, VOCAB, (3, 6), generator=g)
    encoder = m.get_encoder()(input_ids=src, attention_mask=src_mask)
    cache, rows = None, torch.arange(3)
    reorders = {2: torch.tensor([2, 2, 0]), 4: torch.tensor([1, 0, 0])}
    for t in range(tgt.shape[1]):
        if t in reorders:
            cache.reorder_cache(reorders[t])
            rows = rows[reorders[t]]
        out = m(encoder_outputs=encoder if t == 0 else None, attention_mask=src_mask[rows],
                decoder_input_ids=tgt[rows, t:t + 1], **{CACHE_NAME: cache}, use_cache=True)
        cache = getattr(out, CACHE_NAME)
        assert isinstance(cache, MomentumSeq2SeqCache) and cache.memories is not None
        full = m(input_ids=src[rows], attention_mask=src_mask[rows], decoder_input_ids=tgt[rows, :t + 1])
        torch.testing.assert_close(out.logits[:, -1], full.logits[:, -1], rtol=1e-9, atol=1e-10)


def generate(m, src, mask, **kwargs):
    return m.generate(input_ids=src, attention_mask=mask, max_new_tokens=6, min_new_tokens=6, do_sample=False,
                      **kwargs)


@pytest.mark.parametrize("cross", CROSS)
@pytest.mark.parametrize("search", [dict(), dict(num_beams=3, num_return_sequences=2)],
                         ids=["greedy", "beam"])
def test_generate_with_the_cache_equals_generate_without(cross, search, make_generator):
    """The cache (states, memories, their reordering by beam search) changes nothing: without one,
    every step re-reads the source and the whole target."""
    g = make_generator()
    m = model(cross_attention=cross, connection="momentum")
    src, mask = padded(random_seqs(g, [5, 8]), "left")
    with_cache = generate(m, src, mask, **search)
    assert with_cache.shape == (2 * search.get("num_return_sequences", 1), 7)
    torch.testing.assert_close(with_cache, generate(m, src, mask, use_cache=False, **search), rtol=0, atol=0)
    assert (with_cache[:, 0] == EOS).all()                  # decoder_start_token_id


@pytest.mark.parametrize("cross", CROSS)
def test_generate_on_a_padded_batch_equals_each_source_alone(cross, make_generator):
    g = make_generator()
    m = model(cross_attention=cross)
    sources = random_seqs(g, [3, 9, 5])
    for side in ("left", "right"):
        src, mask = padded(sources, side)
        batch = generate(m, src, mask)
        for i, s in enumerate(sources):
            torch.testing.assert_close(batch[i], generate(m, s[None], None)[0], rtol=0, atol=0)


def generate_in_two_calls(m, src, mask):
    """(tokens, logits) of one greedy call of 6 tokens, and of 3 tokens then 3 more from the whole
    target so far, given with a decoder_attention_mask as wide and the cache the first call returned
    (transformers' way to continue a cache; 5.24's prefill leaves the cut to the model)."""
    kwargs = dict(input_ids=src, attention_mask=mask, do_sample=False, return_dict_in_generate=True,
                  output_logits=True)
    with torch.no_grad():
        whole = m.generate(max_new_tokens=6, min_new_tokens=6, **kwargs)
        first = m.generate(max_new_tokens=3, min_new_tokens=3, **kwargs)
        rest = m.generate(decoder_input_ids=first.sequences,
                          decoder_attention_mask=torch.ones_like(first.sequences), max_new_tokens=3,
                          min_new_tokens=3, **{CACHE_NAME: first[CACHE_NAME]}, **kwargs)
    return ((whole.sequences, torch.stack(whole.logits)),
            (rest.sequences, torch.stack(first.logits + rest.logits)))


@pytest.mark.parametrize("cross", CROSS)
def test_generate_continues_the_returned_cache_from_the_whole_target(cross, make_generator):
    m = model(cross_attention=cross, connection="momentum")
    src, mask = padded(random_seqs(make_generator(), [5, 8]), "left")
    (tokens, logits), (continued_tokens, continued_logits) = generate_in_two_calls(m, src, mask)
    assert torch.equal(continued_tokens, tokens)
    torch.testing.assert_close(continued_logits, logits, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("speculation", ["prompt_lookup", "assistant", "softmax_decoder_assistant"])
def test_speculative_decoding_gives_the_greedy_tokens(speculation, make_generator):
    """Prompt lookup and an assistant model propose tokens that the model checks in one forward;
    the cache is cropped back to the accepted ones (states restored, memories kept): the greedy
    tokens come out. An assistant whose decoder has softmax layers only keeps no momentum state,
    and its cache is cropped all the same."""
    g = make_generator()
    m = model(cross_attention="momentum", connection="momentum")
    src, mask = padded(random_seqs(g, [6, 9]), "left")
    softmax = dict(layer_types=["full_attention"] * 2) if speculation == "softmax_decoder_assistant" else {}
    option = dict(prompt_lookup_num_tokens=3) if speculation == "prompt_lookup" else \
        dict(assistant_model=model(seed=1, cross_attention="softmax", **softmax))
    greedy = generate(m, src[:1], mask[:1])
    torch.testing.assert_close(generate(m, src[:1], mask[:1], **option), greedy, rtol=0, atol=0)


def drafted_decoder_ids(m, source, recording):
    """The decoder ids of an assistant's next forward as transformers 5.25 asks for them: its cache
    holds 3 decoder tokens, generate passes all 5 and no decoder mask (`recording`: the cache records
    its past, as generate makes an assistant's)."""
    ids = torch.cat([torch.full((1, 1), EOS), source[:, :4]], 1)
    with torch.no_grad():
        out = m(input_ids=source, decoder_input_ids=ids[:, :3], use_cache=True)
    cache = getattr(out, CACHE_NAME)
    if recording:
        cache.activate_past_recording()
    inputs = m.prepare_inputs_for_generation(ids, encoder_outputs=(out.encoder_last_hidden_state,),
                                             **{CACHE_NAME: cache})
    return ids, inputs["decoder_input_ids"]


def test_an_assistants_cache_gets_only_the_decoder_ids_it_has_not_absorbed(make_generator):
    """Without it, an encoder-decoder assistant under transformers 5.25 re-absorbed every decoder id
    of each round (its cache held 1, 3, 6, 10 ... tokens) and drafted from wrong states, until a
    position passed max_position_embeddings. A cache that records no past keeps transformers' rule
    (the decoder mask decides; without one every id is fed)."""
    m = model(cross_attention="momentum", connection="momentum")
    source = torch.randint(3, VOCAB, (1, 6), generator=make_generator())
    ids, fed = drafted_decoder_ids(m, source, recording=True)
    assert torch.equal(fed, ids[:, 3:])
    ids, fed = drafted_decoder_ids(m, source, recording=False)
    assert torch.equal(fed, ids)


def decode_step_reads(m):
    """Host reads of the second decoding step of a left-padded batch of two sources."""
    src, mask = padded([torch.arange(3, 10), torch.arange(3, 6)], "left")
    start = torch.full((2, 1), EOS)
    with torch.no_grad():
        out = m(input_ids=src, attention_mask=mask, decoder_input_ids=start, use_cache=True)
        reads = HostReads()
        with reads:
            m(encoder_outputs=(out.encoder_last_hidden_state,), attention_mask=mask,
              decoder_input_ids=out.logits.argmax(-1), **{CACHE_NAME: getattr(out, CACHE_NAME)},
              use_cache=True)
    return reads.count


def bart(layers):
    from transformers import BartConfig, BartForConditionalGeneration
    config = BartConfig(vocab_size=VOCAB, d_model=16, encoder_layers=layers, decoder_layers=layers,
                        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=24,
                        decoder_ffn_dim=24, max_position_embeddings=32, pad_token_id=PAD, eos_token_id=EOS,
                        bos_token_id=0, decoder_start_token_id=EOS, attn_implementation="sdpa")
    return BartForConditionalGeneration(config).eval()


@pytest.mark.parametrize("cross", CROSS)
def test_a_decoding_step_reads_the_device_as_often_at_any_depth_and_no_more_than_bart(cross):
    """No layer reads the device: a step reads as often with 2 layers as with 4 (reads at the
    model's edge only), and no more often than BART with SDPA does."""
    counts = [decode_step_reads(model(num_hidden_layers=n, encoder_layers=n, cross_attention=cross))
              for n in (2, 4)]
    assert counts[0] == counts[1] <= decode_step_reads(bart(4)), counts


# embedding layouts: the config's fields, and which of (encoder, decoder, LM head) are one matrix
LAYOUTS = {
    "one-matrix": (dict(), [0, 0, 0]),
    "decoder-is-head": (dict(share_encoder_decoder_embeddings=False), [0, 1, 1]),
    "three-matrices": (dict(tie_word_embeddings=False), [0, 1, 2]),
    "two-vocabularies": (dict(share_encoder_decoder_embeddings=False, decoder_vocab_size=VOCAB - 9),
                         [0, 1, 1]),
}


def assert_layout(m, groups):
    """(encoder, decoder, LM head) embeddings are one matrix exactly where `groups` agree."""
    weights = [m.model.encoder.embed_tokens.weight, m.model.decoder.embed_tokens.weight, m.lm_head.weight]
    assert [[a is b for b in weights] for a in weights] == [[x == y for y in groups] for x in groups]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_embedding_layouts_save_and_load_exactly(layout, tmp_path, make_generator):
    """Each layout ties what it says (also after loading), and save / load is exact; two
    vocabularies give the target's size to the decoder's embedding and the LM head, and generate()
    keeps to it."""
    g = make_generator()
    fields, groups = LAYOUTS[layout]
    m = model(cross_attention="softmax", **fields)
    assert_layout(m, groups)
    m.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).double().eval()
    assert type(loaded) is MomentumSeq2SeqForConditionalGeneration
    assert_layout(loaded, groups)
    target_vocabulary = m.config.decoder_vocab_size
    assert m.lm_head.weight.shape[0] == m.model.decoder.embed_tokens.weight.shape[0] == target_vocabulary
    src, mask = padded(random_seqs(g, [4, 6]), "left")
    tgt = torch.randint(3, target_vocabulary, (2, 3), generator=g)
    inputs = dict(input_ids=src, attention_mask=mask, decoder_input_ids=tgt)
    for name, tensor in m.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], tensor, rtol=0, atol=0)
    # the same weights, but stored in the safetensors file's buffer, 8-byte aligned: BLAS may sum
    # in another order for such operands (1e-17 apart in float64 on an AMD EPYC, 2026-12-04)
    torch.testing.assert_close(loaded(**inputs).logits, m(**inputs).logits, rtol=1e-12, atol=1e-14)
    tokens = generate(loaded, src, mask, num_beams=2)
    assert tokens.max() < target_vocabulary
    uncached = generate(loaded, src, mask, num_beams=2, use_cache=False)
    torch.testing.assert_close(tokens, uncached, rtol=0, atol=0)


def test_remote_code_loads_and_generates_in_a_clean_process(tmp_path, make_generator):
    g = make_generator()
    m = model(cross_attention="softmax", **HYBRID).float()
    m.save_pretrained(tmp_path / "model")
    saved = json.loads((tmp_path / "model" / "config.json").read_text())
    assert set(saved["auto_map"]) == {"AutoConfig", "AutoModel", "AutoModelForSeq2SeqLM"}
    card = (tmp_path / "model" / "README.md").read_text()
    assert "pipeline_tag: translation" in card and "(3 encoder and 2 decoder layers" in card
    src, mask = padded(random_seqs(g, [4, 7]), "left")
    expected = {"src": src, "mask": mask, "tokens": generate(m, src, mask, num_beams=2),
                "logits": m(input_ids=src, attention_mask=mask, decoder_input_ids=src).logits}
    torch.save(expected, tmp_path / "expected.pt")
    proc = run_clean("""
        import torch
        from transformers import AutoModelForSeq2SeqLM
        model = AutoModelForSeq2SeqLM.from_pretrained("model", trust_remote_code=True).eval()
        assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
        e = torch.load("expected.pt")
        with torch.no_grad():
            logits = model(input_ids=e["src"], attention_mask=e["mask"], decoder_input_ids=e["src"]).logits
            tokens = model.generate(input_ids=e["src"], attention_mask=e["mask"], max_new_tokens=6,
                                    min_new_tokens=6, do_sample=False, num_beams=2)
        torch.testing.assert_close(logits, e["logits"], rtol=0, atol=0)
        assert torch.equal(tokens, e["tokens"])
        print("OK", type(model).__name__)
    """, tmp_path, {"HF_HUB_OFFLINE": "1"})
    assert "OK MomentumSeq2SeqForConditionalGeneration" in proc.stdout


@pytest.mark.parametrize("reentrant", [False, True])
def test_gradient_checkpointing_gives_the_same_gradients(reentrant, make_generator):
    """The memories reach the checkpointed layers as keyword arguments: the encoder must still get
    its gradients through them, also with the reentrant checkpoint (which sees positional tensors
    only)."""
    g = make_generator()
    src, mask = padded(random_seqs(g, [5, 3]), "left")
    labels = torch.randint(3, VOCAB, (2, 4), generator=g)
    grads = []
    for checkpointing in (False, True):
        m = model(cross_attention="momentum").train()
        if checkpointing:
            m.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": reentrant})
        m(input_ids=src, attention_mask=mask, labels=labels).loss.backward()
        grads.append({name: p.grad for name, p in m.named_parameters()})
    assert grads[0]["model.encoder.layers.0.attention.q_proj.weight"].abs().sum() > 0
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-10, atol=1e-12, msg=name)


@pytest.mark.parametrize("tied", [True, False])
def test_resizing_the_vocabulary_resizes_the_three_matrices_and_keeps_the_outputs(tied, make_generator):
    """resize_token_embeddings: the encoder's, the decoder's and the LM head's rows (one matrix when
    tied), the embedding scale kept, the logits of the kept tokens unchanged, the loss over the new
    vocabulary, and the resized model saved and loaded."""
    g = make_generator()
    m = model(scale_embedding=True, tie_word_embeddings=tied)
    src, mask = padded(random_seqs(g, [5, 3]), "left")
    tgt = torch.randint(3, VOCAB, (2, 4), generator=g)
    before = m(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
    m.resize_token_embeddings(VOCAB + 8)
    matrices = [m.model.encoder.embed_tokens, m.model.decoder.embed_tokens, m.lm_head]
    assert [e.weight.shape[0] for e in matrices] == [VOCAB + 8] * 3 == [m.config.vocab_size] * 3
    assert m.model.encoder.embed_tokens.embed_scale == m.model.decoder.embed_tokens.embed_scale == 4.0
    assert all(e.weight is matrices[0].weight for e in matrices) == tied
    after = m(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
    torch.testing.assert_close(after[..., :VOCAB], before, rtol=1e-12, atol=1e-12)
    assert m.config.decoder_vocab_size == VOCAB + 8
    assert_scores_and_reloads_resized(m, dict(input_ids=src, attention_mask=mask, decoder_input_ids=tgt), {},
                                      VOCAB, "transformer encoder-decoder", g)


def test_hidden_states_of_both_stacks_and_frozen_embeddings_under_checkpointing(make_generator):
    """output_hidden_states gives the encoder's embeddings and layers (encoder_layers + 1) and the
    decoder's (num_hidden_layers + 1), the last of each its stack's output; with frozen embeddings
    and enable_input_require_grads (PEFT's setup), gradient checkpointing still trains the layers."""
    g = make_generator()
    m = model()
    src, mask = padded(random_seqs(g, [5, 3]), "left")
    labels = torch.randint(3, VOCAB, (2, 4), generator=g)
    out = m(input_ids=src, attention_mask=mask, labels=labels, output_hidden_states=True)
    assert (len(out.encoder_hidden_states), len(out.decoder_hidden_states)) == (4, 3)
    torch.testing.assert_close(out.encoder_hidden_states[-1], out.encoder_last_hidden_state, rtol=0, atol=0)
    m.train().activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": True})
    m.get_input_embeddings().weight.requires_grad_(False)
    m.enable_input_require_grads()
    m(input_ids=src, attention_mask=mask, labels=labels).loss.backward()
    for stack in ("encoder", "decoder"):
        assert m.get_submodule(f"model.{stack}.layers.0.attention.q_proj").weight.grad.abs().sum() > 0


@pytest.mark.usefixtures("inductor_cpp_without_simd")
def test_training_forward_and_backward_compile_whole(make_generator):
    """torch.compile(fullgraph=True) of a training step on padded sources: no graph break (no host
    read), and the loss and gradients of eager mode."""
    g = make_generator()
    src, mask = padded(random_seqs(g, [7, 4]), "left")
    labels = torch.randint(3, VOCAB, (2, 5), generator=g)
    losses, grads = [], []
    for compiled in (False, True):
        m = model(num_hidden_layers=1, encoder_layers=1, connection="adaptive").float().train()

        def step(src, mask, labels):
            return m(input_ids=src, attention_mask=mask, labels=labels).loss

        loss = (torch.compile(step, fullgraph=True) if compiled else step)(src, mask, labels)
        loss.backward()
        losses.append(loss.detach())
        grads.append([p.grad for p in m.parameters()])
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-6)
    for compiled_grad, eager_grad in zip(grads[1], grads[0]):
        torch.testing.assert_close(compiled_grad, eager_grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("overrides, match", [
    (dict(is_causal=False), "is_causal=False: is_causal is the decoder's"),
    (dict(cross_attention="dot"), "cross_attention"),
    (dict(encoder_layers=0), "encoder_layers must be an integer >= 1"),
    (dict(encoder_layer_types=["full_attention"]), r"encoder_layer_types=.* per encoder layer \(3\)"),
    (dict(encoder_layer_types=["sliding_attention"] * 3), "encoder_layer_types="),
    (dict(decoder_start_token_id=VOCAB), r"decoder_start_token_id must be an integer in \[0, 39\]"),
    (dict(decoder_vocab_size=VOCAB - 1), "share_encoder_decoder_embeddings=True needs one vocabulary"),
    (dict(decoder_vocab_size=0, share_encoder_decoder_embeddings=False), "decoder_vocab_size must be an"),
])
def test_bad_configuration_is_refused_naming_the_field(overrides, match):
    with pytest.raises(ValueError, match=match):
        config(**overrides)


def test_bad_calls_are_refused(make_generator):
    g = make_generator()
    m = model()
    src = torch.randint(3, VOCAB, (1, 4), generator=g)
    with pytest.raises(ValueError, match="encoder_hidden_states"):
        m.get_decoder()(input_ids=src)
    with pytest.raises(ValueError, match="StaticMomentumSeq2SeqCache .* holds fixed-size states only"):
        model(**HYBRID).generate(input_ids=src, max_new_tokens=2, cache_implementation="static")
    with pytest.raises(ValueError, match="packed documents"):
        m(input_ids=src, decoder_input_ids=src, cu_seq_lens_q=torch.tensor([0, 2, 4]))
    with pytest.raises(ValueError, match="position_ids restart"):
        m(input_ids=src, decoder_input_ids=src, decoder_position_ids=torch.tensor([[0, 1, 0, 1]]))
    with pytest.raises(ValueError, match="resize_token_embeddings resizes one vocabulary"):
        model(**LAYOUTS["two-vocabularies"][0]).resize_token_embeddings(VOCAB + 8)
    unstartable = model(decoder_start_token_id=None)
    with pytest.raises(ValueError, match="decoder_start_token_id"):
        unstartable(input_ids=src, labels=src)

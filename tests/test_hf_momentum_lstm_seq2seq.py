"""The attentional MomentumLSTM encoder-decoder in transformers
(`MomentumLSTMSeq2SeqForConditionalGeneration`): float64 forward and gradients against the model
written out step by step from `plugins.rnn`'s one-layer cells, padded sources (either side) and
targets against each pair alone, step-by-step decoding with beam reordering against the full
forward, generate() with and without the cache (greedy, beam search) and on a padded batch against
each source alone, speculative decoding, the host reads of a decoding step, save / load of every
embedding layout, the loss, resizing, and configuration and call errors. (fairseq's own model is
the reference in test_fairseq_lstm_translation_to_hf.py.)"""
import pytest
import torch
from helpers.random_model_api import assert_scores_and_reloads_resized
from test_hf_seq2seq import PAD, generate, generate_in_two_calls, padded
from test_host_reads import HostReads
from test_host_reads_lstm import HostReads as DeviceReads
from torch.nn import functional as F

from hf_momentum import (
    MomentumLSTMSeq2SeqCache,
    MomentumLSTMSeq2SeqConfig,
    MomentumLSTMSeq2SeqForConditionalGeneration,
)
from hf_momentum.modeling_common import CACHE_NAME
from hf_momentum.modeling_momentum_lstm import MomentumLSTMCache
from plugins.rnn import MomentumLSTM

EOS, VOCAB = 2, 30
DEFAULT_BETA = MomentumLSTMSeq2SeqConfig.beta
DEFAULT_MOMENTUM = MomentumLSTMSeq2SeqConfig.momentum
# cells other than the default adam, with the hyperparameters each reads
CELLS = {"momentum": dict(cell="momentum", beta=DEFAULT_BETA),
         "nag": dict(cell="nag", momentum=DEFAULT_MOMENTUM, beta=DEFAULT_BETA, restart=2),
         "rmsprop": dict(cell="rmsprop", momentum=DEFAULT_MOMENTUM)}


def config(**kwargs):
    base = dict(vocab_size=VOCAB, encoder_embedding_size=6, encoder_hidden_size=5, decoder_embedding_size=7,
                hidden_size=8, decoder_output_size=7, num_hidden_layers=2, encoder_bidirectional=True,
                cell="adam", momentum=0.6, step_size=0.7, beta=0.8, encoder_dropout_in=0.0,
                encoder_dropout_out=0.0, decoder_dropout_in=0.0, decoder_dropout_out=0.0,
                tie_word_embeddings=True, share_encoder_decoder_embeddings=False, pad_token_id=PAD,
                bos_token_id=0, eos_token_id=EOS, decoder_start_token_id=EOS)
    base.update(kwargs)
    return MomentumLSTMSeq2SeqConfig(**base)


def model(seed=0, **kwargs):
    torch.manual_seed(seed)
    built = MomentumLSTMSeq2SeqForConditionalGeneration(config(**kwargs)).double().eval()
    with torch.no_grad():       # every weight away from its initialisation, so that a misplaced one shows
        for p in built.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return built


def random_seqs(generator, lengths):
    return [torch.randint(3, VOCAB, (n,), generator=generator) for n in lengths]


def one_layer(stack: MomentumLSTM, k: int, reverse: bool = False, copies=None) -> MomentumLSTM:
    """Layer k (its backward direction with `reverse`) of `stack` as a stack of its own, whose
    parameters are copies (put in `copies` under the stack's names)."""
    layer = MomentumLSTM(1, 1, 1, cell=stack.cell, restart=stack.restart,
                         **{n: getattr(stack, n) for n in ("momentum", "step_size", "beta", "eps")
                            if getattr(stack, n) is not None})
    suffix = f"_l{k}" + ("_reverse" if reverse else "")
    weights = {f"{name}_l0": getattr(stack, name + suffix) for name in ("weight_ih", "weight_hh", "bias_ih",
                                                                         "bias_hh")}
    layer.input_size, layer.hidden_size = weights["weight_ih_l0"].shape[1], stack.hidden_size
    for name, weight in weights.items():
        setattr(layer, name, torch.nn.Parameter(weight.detach().clone()))
        if copies is not None:
            copies[name[:-len("_l0")] + suffix] = getattr(layer, name)
    return layer


def reference(m, src, tgt, copies=None):
    """Logits of one pair (no padding) written out: each encoder layer and direction as a one-layer
    stack over the sequence, the decoder token by token through one-layer stacks, with the attention,
    input feeding and projections spelled out. The layers' weights are copies, put in `copies`
    under the model's names."""
    cfg, encoder, decoder = m.config, m.model.encoder, m.model.decoder
    copies = {} if copies is None else copies
    x = encoder.embed_tokens(src)[None]
    finals_h, finals_c = [], []
    for k in range(cfg.num_hidden_layers):
        directions = []
        for reverse in ([False, True] if cfg.encoder_bidirectional else [False]):
            inputs = x.flip(1) if reverse else x
            layer = one_layer(encoder.lstm, k, reverse, copies.setdefault("model.encoder.lstm", {}))
            out, state = layer(inputs.transpose(0, 1))
            directions.append((out.transpose(0, 1).flip(1) if reverse else out.transpose(0, 1), state))
        x = torch.cat([out for out, _ in directions], -1)
        finals_h.append(torch.cat([s.h[0] for _, s in directions], -1))
        finals_c.append(torch.cat([s.c[0] for _, s in directions], -1))
    source = x[0]
    layers = [one_layer(decoder.lstm, k, copies=copies.setdefault("model.decoder.lstm", {}))
              for k in range(cfg.num_hidden_layers)]
    hs = [decoder.encoder_hidden_proj(h) for h in finals_h]
    cs = [decoder.encoder_cell_proj(c) for c in finals_c]
    states = [(h, c) for h, c in zip(hs, cs)]
    feed = torch.zeros(1, cfg.hidden_size, dtype=x.dtype)
    outs, fresh = [], set(range(len(layers)))      # a fresh state is (h, c) without the layer dimension
    for token in tgt:
        inp = torch.cat([decoder.embed_tokens(token[None]), feed], -1)
        for k, layer in enumerate(layers):
            out, state = layer(inp[None], tuple(t[None] for t in states[k]) if k in fresh else states[k])
            fresh.discard(k)
            states[k] = state
            inp = out[0]
        h = inp
        attention = decoder.attention
        scores = source @ attention.input_proj(h)[0]
        context = (scores.softmax(0)[:, None] * source).sum(0, keepdim=True)
        feed = torch.tanh(attention.output_proj(torch.cat([context, h], -1)))
        outs.append(feed)
    hidden = decoder.additional_fc(torch.cat(outs))
    return F.linear(hidden, m.lm_head.weight)


def test_forward_and_gradients_equal_the_written_out_model(make_generator):
    """Bidirectional encoder, projected final states, adam cells (v and m), attention, additional_fc,
    tied head: the logits and every parameter's gradient equal the written-out model's (its layers are
    copies, whose gradients are mapped back by name)."""
    g = make_generator()
    m = model()
    src, tgt = random_seqs(g, [6])[0], random_seqs(g, [5])[0]
    weights = torch.randn(5, VOCAB, generator=g, dtype=torch.float64)
    logits = m(input_ids=src[None], decoder_input_ids=tgt[None]).logits[0]
    expected = reference(m, src, tgt)
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-10)
    assert expected.std() > 0.1
    grads = torch.autograd.grad((logits * weights).sum(), list(m.parameters()))
    m.zero_grad()
    (expected * weights).sum().backward()
    for (name, p), grad in zip(m.named_parameters(), grads):
        if p.grad is not None:        # the parameters the reference uses directly (not the copies)
            torch.testing.assert_close(grad, p.grad, rtol=0, atol=1e-10, msg=name)


def test_lstm_gradients_equal_the_written_out_models(make_generator):
    """The stacks' weights, which the reference copies: their gradients equal the copies'."""
    g = make_generator()
    m = model()
    src, tgt = random_seqs(g, [4])[0], random_seqs(g, [3])[0]
    logits = m(input_ids=src[None], decoder_input_ids=tgt[None]).logits[0]
    params = {n: p for n, p in m.named_parameters() if ".lstm." in n}
    grads = dict(zip(params, torch.autograd.grad(logits.sum(), list(params.values()))))
    copies = {}
    reference(m, src, tgt, copies).sum().backward()
    copied = {f"{stack}.{name}": p for stack, layers in copies.items() for name, p in layers.items()}
    assert set(copied) == set(params)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, copied[name].grad, rtol=0, atol=1e-10, msg=name)
        assert grad.abs().sum() > 0, name


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("cell", ["momentum", "nag"])
def test_padded_pairs_equal_each_pair_alone(side, cell, make_generator):
    """Logits at real target positions, the cross-attention weights and the loss of each row equal
    those of its pair alone; padded target positions give zero outputs."""
    g = make_generator()
    m = model(**CELLS[cell])
    sources, targets = random_seqs(g, [6, 3, 8]), random_seqs(g, [5, 2, 4])
    src, src_mask = padded(sources, side)
    labels, tgt_mask = padded(targets, "right")
    labels = labels.masked_fill(tgt_mask == 0, -100)
    out = m(input_ids=src, attention_mask=src_mask, labels=labels, decoder_attention_mask=tgt_mask,
            output_attentions=True)
    total, count = 0.0, 0
    for i, (s, t) in enumerate(zip(sources, targets)):
        alone = m(input_ids=s[None], labels=t[None], output_attentions=True)
        torch.testing.assert_close(out.logits[i, :len(t)], alone.logits[0], rtol=1e-9, atol=1e-10)
        cols = slice(src.shape[1] - len(s), None) if side == "left" else slice(0, len(s))
        torch.testing.assert_close(out.cross_attentions[0][i, :len(t), cols], alone.cross_attentions[0][0],
                                   rtol=1e-9, atol=1e-12)
        total, count = total + alone.loss * len(t), count + len(t)
    torch.testing.assert_close(out.loss, total / count, rtol=1e-6, atol=0)




def test_a_padded_target_token_leaves_the_state_as_it_was(make_generator):
    """A left-padded target (decoder_attention_mask 0 at the front) gives the outputs of its tokens
    alone, and zero outputs at the padding."""
    g = make_generator()
    m = model()
    src = random_seqs(g, [5])[0][None]
    tgt = random_seqs(g, [4])[0]
    ids, mask = padded([tgt], "left", width=7)
    out = m(input_ids=src, decoder_input_ids=ids, decoder_attention_mask=mask, output_hidden_states=True)
    alone = m(input_ids=src, decoder_input_ids=tgt[None])
    torch.testing.assert_close(out.logits[0, 3:], alone.logits[0], rtol=1e-9, atol=1e-10)
    assert not out.decoder_hidden_states[-1][0, :3].any()


def test_step_by_step_decoding_with_beam_reordering_equals_the_full_forward(make_generator):
    g = make_generator()
    m = model(**CELLS["rmsprop"])
    src, src_mask = padded(random_seqs(g, [7, 4, 6]), "left")
    tgt = torch.randint(3, VOCAB, (3, 6), generator=g)
    encoder = m.get_encoder()(input_ids=src, attention_mask=src_mask)
    cache, rows = None, torch.arange(3)
    reorders = {2: torch.tensor([2, 2, 0]), 4: torch.tensor([1, 0, 0])}
    for t in range(tgt.shape[1]):
        if t in reorders:
            cache.reorder_cache(reorders[t])
            rows = rows[reorders[t]]
        encoded = type(encoder)(**{name: value[rows] for name, value in encoder.items()})
        out = m(encoder_outputs=encoded, attention_mask=src_mask[rows], decoder_input_ids=tgt[rows, t:t + 1],
                **{CACHE_NAME: cache}, use_cache=True)
        cache = getattr(out, CACHE_NAME)
        assert isinstance(cache, MomentumLSTMSeq2SeqCache) and cache.get_seq_length() == t + 1
        full = m(input_ids=src[rows], attention_mask=src_mask[rows], decoder_input_ids=tgt[rows, :t + 1])
        torch.testing.assert_close(out.logits[:, -1], full.logits[:, -1], rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("search", [dict(), dict(num_beams=3, num_return_sequences=2)],
                         ids=["greedy", "beam"])
def test_generate_with_the_cache_equals_generate_without(search, make_generator):
    """The cache (the decoder's state and fed-back output, their reordering by beam search) changes
    nothing: without one, every step re-reads the source and the whole target."""
    g = make_generator()
    m = model()
    src, mask = padded(random_seqs(g, [5, 8]), "left")
    with_cache = generate(m, src, mask, **search)
    assert with_cache.shape == (2 * search.get("num_return_sequences", 1), 7)
    torch.testing.assert_close(with_cache, generate(m, src, mask, use_cache=False, **search), rtol=0, atol=0)
    assert (with_cache[:, 0] == EOS).all()                  # decoder_start_token_id


def test_generate_on_a_padded_batch_equals_each_source_alone(make_generator):
    g = make_generator()
    m = model()
    sources = random_seqs(g, [3, 9, 5])
    for side in ("left", "right"):
        src, mask = padded(sources, side)
        batch = generate(m, src, mask)
        for i, s in enumerate(sources):
            torch.testing.assert_close(batch[i], generate(m, s[None], None)[0], rtol=0, atol=0)


def test_generate_continues_the_returned_cache_from_the_whole_target(make_generator):
    src, mask = padded(random_seqs(make_generator(), [5, 8]), "left")
    (tokens, logits), (continued_tokens, continued_logits) = generate_in_two_calls(model(), src, mask)
    assert torch.equal(continued_tokens, tokens)
    torch.testing.assert_close(continued_logits, logits, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("speculation", ["prompt_lookup", "assistant"])
def test_speculative_decoding_gives_the_greedy_tokens(speculation, make_generator):
    """Prompt lookup and an assistant model propose tokens that the model checks in one forward; the
    cache is cropped back to the accepted ones: the greedy tokens come out."""
    g = make_generator()
    m = model()
    src, mask = padded(random_seqs(g, [9]), "left")
    option = dict(prompt_lookup_num_tokens=3) if speculation == "prompt_lookup" else \
        dict(assistant_model=model(seed=1, **CELLS["momentum"]))
    greedy = generate(m, src, mask)
    torch.testing.assert_close(generate(m, src, mask, **option), greedy, rtol=0, atol=0)


def decode_step_reads(m):
    """Host reads of the second decoding step of a left-padded batch of two sources."""
    src, mask = padded([torch.arange(3, 10), torch.arange(3, 6)], "left")
    start = torch.full((2, 1), EOS)
    with torch.no_grad():
        encoder = m.get_encoder()(input_ids=src, attention_mask=mask)
        out = m(encoder_outputs=encoder, attention_mask=mask, decoder_input_ids=start, use_cache=True)
        reads = HostReads()
        with reads:
            m(encoder_outputs=encoder, attention_mask=mask, decoder_input_ids=out.logits.argmax(-1),
              **{CACHE_NAME: getattr(out, CACHE_NAME)}, use_cache=True)
    return reads.count


def test_a_decoding_step_reads_nothing_from_the_device():
    assert decode_step_reads(model()) == 0
    assert decode_step_reads(model(num_hidden_layers=4)) == 0


@pytest.mark.parametrize("side", ["left", "right"])
def test_a_padded_training_step_reads_the_device_once(side, make_generator):
    """Forward and backward of a padded batch with labels: at most one copy to the host (the sources'
    lengths, to pack the encoder's input; on a CPU-only run none is counted), at any depth; no scalar
    read, no nonzero. (Counted without test_host_reads' `.cpu()` of host tensors: a PackedSequence's
    batch_sizes live on the host on any device.)"""
    g = make_generator()
    src, mask = padded(random_seqs(g, [6, 3, 8]), side)
    labels, tgt_mask = padded(random_seqs(g, [5, 2, 4]), "right")
    labels = labels.masked_fill(tgt_mask == 0, -100)
    for layers in (2, 4):
        m = model(num_hidden_layers=layers).train()
        reads = DeviceReads()
        with reads:
            loss = m(input_ids=src, attention_mask=mask, labels=labels, decoder_attention_mask=tgt_mask).loss
            loss.backward()
        assert set(reads.counts) <= {"device_to_host"} and reads.counts["device_to_host"] <= 1, reads.counts


LAYOUTS = {
    "one-matrix": (dict(decoder_embedding_size=6, decoder_output_size=6,
                        share_encoder_decoder_embeddings=True), [0, 0, 0]),
    "decoder-is-head": (dict(), [0, 1, 1]),
    "three-matrices": (dict(tie_word_embeddings=False), [0, 1, 2]),
    "two-vocabularies": (dict(decoder_vocab_size=VOCAB - 9), [0, 1, 1]),
}


def assert_layout(m, groups):
    """(encoder, decoder, LM head) embeddings are one matrix exactly where `groups` agree."""
    weights = [m.model.encoder.embed_tokens.weight, m.model.decoder.embed_tokens.weight, m.lm_head.weight]
    assert [[a is b for b in weights] for a in weights] == [[x == y for y in groups] for x in groups]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_embedding_layouts_save_and_load_exactly(layout, tmp_path, make_generator):
    g = make_generator()
    fields, groups = LAYOUTS[layout]
    m = model(**fields)
    assert_layout(m, groups)
    assert (m.lm_head.bias is None) == m.config.tie_word_embeddings
    src, mask = padded(random_seqs(g, [4, 6]), "right")
    tgt = torch.randint(3, m.config.decoder_vocab_size, (2, 5), generator=g)
    m.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    loaded = MomentumLSTMSeq2SeqForConditionalGeneration.from_pretrained(tmp_path).eval()
    assert_layout(loaded, groups)
    for name, p in m.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], p), name
    # the same weights in the safetensors file's buffer: BLAS may sum in another order (1e-16 apart
    # in float64 on an AMD EPYC)
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits,
                                   m(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits,
                                   rtol=1e-12, atol=1e-14)
    assert generate(loaded, src, mask).max() < m.config.decoder_vocab_size


def test_labels_train_the_model(make_generator):
    """The loss is the cross-entropy of the labels under the decoder fed the labels shifted right
    after decoder_start_token_id, and a few Adam steps on one pair lower it (training-mode dropout
    included)."""
    g = make_generator()
    m = model(**{f"{side}_dropout_{at}": 0.1 for side in ("encoder", "decoder") for at in ("in", "out")})
    src, labels = random_seqs(g, [6])[0][None], random_seqs(g, [5])[0][None]
    out = m(input_ids=src, labels=labels)
    shifted = torch.cat([torch.full((1, 1), EOS), labels[:, :-1]], 1)
    logits = m(input_ids=src, decoder_input_ids=shifted).logits
    # transformers computes the loss in float32
    torch.testing.assert_close(out.loss, F.cross_entropy(logits[0].float(), labels[0]), rtol=1e-6, atol=0)
    m.train()
    optimizer = torch.optim.Adam(m.parameters(), lr=0.01)
    first = None
    for _ in range(30):
        loss = m(input_ids=src, labels=labels).loss
        first = loss.item() if first is None else first
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    m.eval()
    assert m(input_ids=src, labels=labels).loss.item() < 0.5 * first


@pytest.mark.parametrize("tied", [False, True])
def test_resizing_the_vocabulary_resizes_the_three_matrices_and_keeps_the_outputs(tied, make_generator):
    """As test_hf_seq2seq's: the encoder's, decoder's and LM head's rows, the kept tokens' logits,
    the loss over the new vocabulary, and the resized model saved and loaded."""
    g = make_generator()
    m = model(tie_word_embeddings=tied)
    src, tgt = random_seqs(g, [5])[0][None], random_seqs(g, [4])[0][None]
    before = m(input_ids=src, decoder_input_ids=tgt).logits
    m.resize_token_embeddings(VOCAB + 6)
    assert [t.shape[0] for t in (m.model.encoder.embed_tokens.weight, m.model.decoder.embed_tokens.weight,
                                 m.lm_head.weight)] == [VOCAB + 6] * 3
    assert (m.lm_head.weight is m.model.decoder.embed_tokens.weight) == tied
    after = m(input_ids=src, decoder_input_ids=tgt).logits
    # a larger LM head: BLAS may sum the kept rows in another order (1e-16 apart on an AMD EPYC)
    torch.testing.assert_close(after[..., :VOCAB], before, rtol=1e-12, atol=1e-14)
    assert m.config.decoder_vocab_size == VOCAB + 6
    assert_scores_and_reloads_resized(m, dict(input_ids=src, decoder_input_ids=tgt), {}, VOCAB,
                                      "LSTM encoder-decoder", g)


@pytest.mark.parametrize("overrides, match", [
    (dict(momentum=1.0), r"momentum must be .*\[0, 1\)"),
    (dict(cell="lstm"), "=0.[67] is not read by cell='lstm'"),
    (dict(cell="sr", beta=DEFAULT_BETA), "restart"),
    (dict(decoder_dropout_out=1.0), "decoder_dropout_out"),
    (dict(hidden_size=0), "hidden_size must be an"),
    (dict(decoder_output_size=9), r"tie_word_embeddings needs decoder_embedding_size \(7\) == "),
    (dict(share_encoder_decoder_embeddings=True), "share_encoder_decoder_embeddings=True needs one "),
    (dict(share_encoder_decoder_embeddings=True, tie_word_embeddings=False), "needs tie_word_embeddings"),
    (dict(decoder_start_token_id=VOCAB), r"decoder_start_token_id must be an integer in \[0, 29\]"),
    (dict(encoder_bidirectional=1), "encoder_bidirectional"),
])
def test_bad_configuration_is_refused_naming_the_field(overrides, match):
    with pytest.raises(ValueError, match=match):
        config(**overrides)


def test_bad_calls_are_refused(make_generator):
    g = make_generator()
    m = model()
    src = torch.randint(3, VOCAB, (2, 4), generator=g)
    with pytest.raises(ValueError, match="source rows \\[1\\] hold no real token"):
        m(input_ids=src, attention_mask=torch.tensor([[1, 1, 1, 1], [0, 0, 0, 0]]), decoder_input_ids=src)
    with pytest.raises(ValueError, match="the decoder starts from the encoder's final states"):
        m(decoder_input_ids=src)
    with pytest.raises(ValueError, match="encoder_outputs must be the encoder's output"):
        m(encoder_outputs=(src.double(),), decoder_input_ids=src)
    with pytest.raises(ValueError, match="packed documents"):
        m(input_ids=src, decoder_input_ids=src, cu_seq_lens_q=torch.tensor([0, 2, 4]))
    with pytest.raises(ValueError, match="attention_mask must have shape"):
        m(input_ids=src, attention_mask=torch.ones(2, 3), decoder_input_ids=src)
    with pytest.raises(ValueError, match="must be a MomentumLSTMSeq2SeqCache, got MomentumLSTMCache"):
        m(input_ids=src, decoder_input_ids=src, **{CACHE_NAME: MomentumLSTMCache(m.config)})
    with pytest.raises(ValueError, match="prompt_lookup_num_tokens= .* a static cache"):
        m.generate(input_ids=src, max_new_tokens=2, cache_implementation="static", prompt_lookup_num_tokens=2)
    with pytest.raises(ValueError, match="resize_token_embeddings resizes one vocabulary"):
        model(decoder_vocab_size=VOCAB - 1).resize_token_embeddings(VOCAB + 8)
    with pytest.raises(ValueError, match="decoder_start_token_id"):
        model(decoder_start_token_id=None)(input_ids=src, labels=src)

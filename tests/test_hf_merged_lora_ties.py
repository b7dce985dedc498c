"""A LoRA-merged encoder-decoder whose LM head is the decoder's embedding saves and loads as the
model it is. peft's merge_and_unload (0.21 and 0.22) sets `config.tie_word_embeddings = False` when
`get_input_embeddings()` (an encoder-decoder's: the encoder's embedding) is not the head's weight,
although the head still is the decoder's embedding. transformers then saved the head as a tied copy
(left out of the file) and loaded an untied head that the file lacked: another model, silently.
The flag is also set by hand after the merge, so that the test does not depend on peft's version."""
import pytest
import test_hf_momentum_lstm_seq2seq as lstm_seq2seq
import test_hf_seq2seq as seq2seq
import torch
from transformers import AutoModelForSeq2SeqLM

peft = pytest.importorskip("peft")
from peft import LoraConfig, get_peft_model  # noqa: E402

FAMILIES = {
    "transformer": (lambda **kw: seq2seq.model(cross_attention="softmax",
                                              share_encoder_decoder_embeddings=False, **kw),
                    "all-linear", seq2seq),
    "lstm": (lambda **kw: lstm_seq2seq.model(**kw), ["input_proj", "output_proj"], lstm_seq2seq),
}
VOCABULARIES = {"one": {}, "two": dict(decoder_vocab_size=lstm_seq2seq.VOCAB - 9)}


def inputs(module, vocabulary, generator):
    src, mask = module.padded(module.random_seqs(generator, [5, 3]), "left")
    return dict(input_ids=src, attention_mask=mask,
                decoder_input_ids=torch.randint(3, vocabulary, (2, 4), generator=generator))


@pytest.mark.parametrize("vocabularies", VOCABULARIES)
@pytest.mark.parametrize("family", FAMILIES)
def test_merged_model_with_the_head_on_the_decoder_embedding_reloads_as_it_is(family, vocabularies, tmp_path,
                                                                              make_generator):
    build, targets, module = FAMILIES[family]
    base = build(**VOCABULARIES[vocabularies])
    assert base.lm_head.weight is base.get_decoder().embed_tokens.weight
    assert base.get_input_embeddings().weight is not base.lm_head.weight
    torch.manual_seed(1)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=targets, init_lora_weights=False)
    lora = get_peft_model(base, config)
    batch = inputs(module, base.config.decoder_vocab_size, make_generator())
    with torch.no_grad():
        adapted = lora(**batch).logits
        merged = lora.merge_and_unload()
        merged.config.tie_word_embeddings = False
        merged.save_pretrained(tmp_path)
        loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path, dtype=torch.float64).eval()
        assert loaded.lm_head.weight is loaded.get_decoder().embed_tokens.weight
        assert loaded.config.tie_word_embeddings
        assert loaded.state_dict().keys() == merged.state_dict().keys()
        for name, tensor in merged.state_dict().items():
            assert torch.equal(loaded.state_dict()[name], tensor), name
        torch.testing.assert_close(loaded(**batch).logits, adapted, rtol=1e-12, atol=1e-12)


def test_a_head_untied_since_its_build_is_saved_untied(tmp_path):
    m = FAMILIES["transformer"][0](tie_word_embeddings=False)
    m.save_pretrained(tmp_path)
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path, dtype=torch.float64)
    assert not loaded.config.tie_word_embeddings
    assert loaded.lm_head.weight is not loaded.get_decoder().embed_tokens.weight

"""The tokenizer convert_to_hf saves for a model trained on sentencepiece pieces
(hf_momentum.tokenization_fairseq_sentencepiece): its ids equal fairseq's own encoding (its
SentencepieceBPE, then Dictionary.encode_line), `<unk>` for pieces the dictionary lacks included,
in each wrapping (translation source, LM prompt, masked LM); decoding is fairseq's
`--post-process sentencepiece`; a dictionary of subword pieces without a sentencepiece model gets
no tokenizer (a word-level one would read raw words as <unk>); and through the CLIs, recipes/iwslt's
path: sentencepiece before fairseq-preprocess, fairseq-train, the converter with
--sentencepiece-model, then transformers alone translating raw text as fairseq does."""
import itertools
import logging
import random

import pytest
import torch
from helpers.fairseq_cli import write_parallel_text
from helpers.fairseq_decoding import (
    assert_translates_alone,
    assert_two_dictionaries,
    greedy_hypothesis,
    translation_checkpoint,
)
from test_fairseq_to_hf import PYTHON_WHITESPACE
from test_fairseq_translation_to_hf import train_and_convert

from fairseq_momentum.convert_to_hf import (
    dictionary_tokenizer,
    saved_tokenizer,
    sentencepiece_tokenizer,
)
from hf_momentum.tokenization_fairseq_dictionary import wrap_layout
from hf_momentum.tokenization_fairseq_sentencepiece import SPACE, FairseqSentencePieceTokenizer

LINES = ["the cat sees a small dog", "a big red fox chases the old bird", "zebras quack xylophones!"]


def train_sentencepiece(text, folder):
    """A sentencepiece BPE model of 70 pieces trained on a parallel text's training pairs, and its
    processor."""
    import sentencepiece
    sentencepiece.SentencePieceTrainer.train(
        input=[str(text / "train.src"), str(text / "train.tgt")], model_prefix=str(folder / "spm"),
        vocab_size=70, model_type="bpe", character_coverage=1.0, minloglevel=2)
    model = folder / "spm.model"
    return model, sentencepiece.SentencePieceProcessor(model_file=str(model))


@pytest.fixture(scope="module")
def pieces(tmp_path_factory):
    """A sentencepiece BPE model trained on generated text, and a fairseq dictionary of the pieces of
    part of that text (so that some pieces are missing from it, as in real data)."""
    from fairseq.data import Dictionary
    folder = tmp_path_factory.mktemp("spm")
    text = write_parallel_text(folder / "text", seed=3)
    model, processor = train_sentencepiece(text, folder)
    dictionary = Dictionary()
    for line in (text / "train.src").read_text().splitlines()[:40]:
        for piece in processor.encode(line, out_type=str):
            dictionary.add_symbol(piece)
    dictionary.finalize()
    return model, dictionary


def fairseq_ids(model, dictionary, line, append_eos):
    from fairseq.data.encoders.sentencepiece_bpe import SentencepieceBPE, SentencepieceConfig
    bpe = SentencepieceBPE(SentencepieceConfig(sentencepiece_model=str(model)))
    return dictionary.encode_line(bpe.encode(line), add_if_not_exist=False, append_eos=append_eos).tolist()


@pytest.mark.parametrize("pattern", ["eos", "none", "bos_eos"])
def test_ids_are_fairseqs_and_decoding_is_its_post_processing(pieces, pattern, tmp_path):
    from fairseq.data.data_utils import post_process
    model, dictionary = pieces
    tokenizer = sentencepiece_tokenizer(dictionary, model, pattern, 64)
    tokenizer.save_pretrained(tmp_path)
    tokenizer = type(tokenizer).from_pretrained(tmp_path)
    unknown = 0
    for line in LINES:
        ids = fairseq_ids(model, dictionary, line, append_eos=pattern != "none")
        if pattern == "bos_eos":
            ids = [dictionary.bos()] + ids
        assert tokenizer(line)["input_ids"] == ids
        unknown += ids.count(dictionary.unk())
        if dictionary.unk() not in ids:
            expected = post_process(dictionary.string(torch.tensor(ids)), "sentencepiece")
            assert tokenizer.decode(ids, skip_special_tokens=True) == expected
    assert unknown > 0, "no line met a piece missing from the dictionary"
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id, len(tokenizer)) == \
        (dictionary.pad(), dictionary.eos(), len(dictionary))


MIXED = ["Élise's café: 42 oranges, then more", "emoji 🎉 and ünïcödé ×2", "ＦＵＬＬ width　ｔｅｘｔ ①",
         "tab\there  two  spaces", "  leading and trailing  ", "", "unknown ÿ ĳ ∮ ok", " a", "\t",
         "\u2581a b", "a\u2581", "\u3000\u2581a", "a\n b", "a \nb", "\x1d"]
SENTENCEPIECE_OPTIONS = [
    ("unigram", {}), ("bpe", {}), ("bpe", {"normalization_rule_name": "nfkc"}),
    ("bpe", {"remove_extra_whitespaces": False}),
    ("unigram", {"normalization_rule_name": "identity", "remove_extra_whitespaces": False})]


@pytest.fixture(scope="module", params=SENTENCEPIECE_OPTIONS, ids=lambda option: f"{option[0]}{option[1]}")
def all_pieces(request, tmp_path_factory):
    """A sentencepiece model (unigram or BPE, its normalization and whitespace rules) trained on
    text with accents, emoji, full-width characters and runs of spaces, and a dictionary of every
    one of its pieces in an order of its own (as XLM-R's dict.txt), with padding words and
    `<mask>`."""
    import sentencepiece
    from fairseq.data import Dictionary
    folder = tmp_path_factory.mktemp("spm_all")
    text = write_parallel_text(folder / "text", seed=5)
    (text / "mixed.txt").write_text("\n".join(MIXED[:4] * 5) + "\n")
    sentencepiece.SentencePieceTrainer.train(
        input=[str(text / "train.src"), str(text / "train.tgt"), str(text / "mixed.txt")],
        model_prefix=str(folder / "spm"), vocab_size=90, model_type=request.param[0],
        character_coverage=0.999, minloglevel=2, **request.param[1])
    processor = sentencepiece.SentencePieceProcessor(model_file=str(folder / "spm.model"))
    symbols = [processor.id_to_piece(i) for i in range(processor.get_piece_size())
               if not (processor.is_control(i) or processor.is_unknown(i))]
    random.Random(2).shuffle(symbols)
    dictionary = Dictionary()
    for symbol in symbols + ["madeupword0000", "<mask>"]:
        dictionary.add_symbol(symbol)
    return folder / "spm.model", dictionary


@pytest.mark.parametrize("pattern", ["none", "eos", "bos_eos", "bos_eos_sep"])
def test_a_dictionary_of_every_piece_gets_a_fast_tokenizer(all_pieces, pattern, tmp_path):
    """Its ids (single texts and pairs) are fairseq's, unknown characters, spaces and a literal ▁
    included, decoding is the slow tokenizer's (fairseq's), offsets cover each piece's characters,
    and words given one by one are encoded as inside a sentence."""
    from transformers import AutoTokenizer
    model, dictionary = all_pieces
    saved = sentencepiece_tokenizer(dictionary, model, pattern, 64)
    assert type(saved).__name__ == "FairseqSentencePieceTokenizerFast"
    saved.save_pretrained(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path, trust_remote_code=True)
    assert tokenizer.is_fast
    slow = dictionary_tokenizer(FairseqSentencePieceTokenizer, [model], dictionary, pattern, 64)
    assert (len(tokenizer), tokenizer.mask_token_id) == (len(dictionary), dictionary.index("<mask>"))
    lead, ends, separated = wrap_layout(pattern)
    unknown = 0
    for line, pair in zip(LINES + MIXED, MIXED + LINES):
        ids = ([dictionary.bos()] if lead else []) + fairseq_ids(model, dictionary, line, append_eos=ends)
        assert tokenizer(line)["input_ids"] == ids, line
        unknown += ids.count(dictionary.unk())
        if pair:            # transformers drops an empty second text (its `if text_pair`)
            pair_ids = ids + ([dictionary.eos()] if separated else []) + \
                fairseq_ids(model, dictionary, pair, append_eos=ends)
            assert tokenizer(line, pair)["input_ids"] == pair_ids, (line, pair)
        assert tokenizer.decode(ids, skip_special_tokens=True) == slow.decode(ids, skip_special_tokens=True)
        assert tokenizer.decode(ids[1:], skip_special_tokens=True) == \
            slow.decode(ids[1:], skip_special_tokens=True)
    assert unknown > 0, "no line met a character the model does not know"
    for line in LINES:
        encoded = tokenizer(line, return_offsets_mapping=True)
        for token, (start, end) in zip(encoded.tokens(), encoded["offset_mapping"]):
            text = token.replace(SPACE, " ")
            # a word's first piece covers the space before it, its ▁ (as tokenizers' Metaspace has
            # it); a lone ▁ holds no character of the text
            if token not in (dictionary.bos_word, dictionary.eos_word, dictionary.unk_word) and text.strip():
                assert line[start:end] in (text, text.lstrip(" ")), (line, token, start, end)
        words = line.split()
        split = tokenizer(words, is_split_into_words=True)
        assert split["input_ids"] == encoded["input_ids"]
        tokens = [(word, token) for word, token in zip(split.word_ids(), split.tokens()) if word is not None]
        for word, group in itertools.groupby(tokens, key=lambda token: token[0]):
            assert [token for _, token in group] == tokenizer.tokenize(words[word])


@pytest.mark.parametrize("option", ["byte_fallback", "user_defined_symbols"])
def test_a_model_the_fast_tokenizer_does_not_rebuild_keeps_the_slow_one(option, tmp_path):
    """Byte fallback (unknown characters as byte pieces) and user-defined symbols are sentencepiece's
    own: such a model keeps the slow tokenizer, whose ids are fairseq's."""
    import sentencepiece
    from fairseq.data import Dictionary
    text = write_parallel_text(tmp_path / "text", seed=6)
    options = {"byte_fallback": True} if option == "byte_fallback" else \
        {"user_defined_symbols": ["cat"]}
    sentencepiece.SentencePieceTrainer.train(
        input=str(text / "train.src"), model_prefix=str(tmp_path / "spm"),
        vocab_size=290 if option == "byte_fallback" else 40, minloglevel=2, **options)
    processor = sentencepiece.SentencePieceProcessor(model_file=str(tmp_path / "spm.model"))
    dictionary = Dictionary()
    for i in range(processor.get_piece_size()):
        if not (processor.is_control(i) or processor.is_unknown(i)):
            dictionary.add_symbol(processor.id_to_piece(i))
    tokenizer = sentencepiece_tokenizer(dictionary, tmp_path / "spm.model", "eos", 64)
    assert type(tokenizer).__name__ == "FairseqSentencePieceTokenizer"
    for line in LINES + ["ünïcödé cat"]:
        assert tokenizer(line)["input_ids"] == fairseq_ids(tmp_path / "spm.model", dictionary, line, True)


def test_pieces_holding_pythons_whitespace_are_split_as_fairseq_splits_them(pieces, all_pieces):
    """A piece sentencepiece keeps with a character Python counts as whitespace (U+0085, U+001C)
    is split there by encode_line, and by either tokenizer: the ids stay fairseq's for every such
    character."""
    for model, dictionary in (pieces, all_pieces):
        tokenizer = sentencepiece_tokenizer(dictionary, model, "eos", 256)
        for space in PYTHON_WHITESPACE:
            line = f"the cat{space}sees a{space}{space}dog{space}"
            expected = fairseq_ids(model, dictionary, line, append_eos=True)
            assert tokenizer(line)["input_ids"] == expected, (type(tokenizer).__name__, repr(space))


def test_which_tokenizer_is_saved(pieces, caplog):
    """The task's --bpe sentencepiece model is used by itself, a translation model's two dictionaries
    included; subword symbols without one get no tokenizer, with a warning naming
    --sentencepiece-model; another --bpe with a sentencepiece model is refused."""
    from fairseq.data import Dictionary
    from transformers import AutoConfig, PreTrainedTokenizerFast
    model, dictionary = pieces
    config = AutoConfig.for_model("momentum_transformer", vocab_size=len(dictionary),
                                  max_position_embeddings=32)
    task_bpe = {"_name": "sentencepiece", "sentencepiece_model": str(model)}
    found = saved_tokenizer(dictionary, config, task_bpe, None)
    assert type(found).__name__ == "FairseqSentencePieceTokenizer"
    with caplog.at_level(logging.WARNING, logger="fairseq_momentum.convert_to_hf"):
        assert saved_tokenizer(dictionary, config, None, None) is None
    assert "--sentencepiece-model" in caplog.text
    words = Dictionary()
    for word in LINES[0].split():
        words.add_symbol(word)
    assert isinstance(saved_tokenizer(words, config, None, None), PreTrainedTokenizerFast)
    seq2seq = AutoConfig.for_model("momentum_seq2seq", vocab_size=len(dictionary), max_position_embeddings=32)
    both = saved_tokenizer(dictionary, seq2seq, task_bpe, None, target_dictionary=words)
    assert type(both).__name__ == "FairseqSentencePieceTokenizer" and both.target_vocab_file is not None
    with pytest.raises(ValueError, match="--sentencepiece-model: the task used --bpe gpt2"):
        saved_tokenizer(dictionary, config, {"_name": "gpt2"}, model)
    with pytest.raises(ValueError, match="--sentencepiece-model: no file"):
        saved_tokenizer(dictionary, config, None, model.with_name("missing.model"))


def test_cli_converts_a_translation_model_trained_on_sentencepiece_pieces(tmp_path):
    """recipes/iwslt's path: text segmented by sentencepiece, fairseq-preprocess --joined-dictionary,
    fairseq-train; the converted model with its tokenizer, in a process without our packages,
    encodes a raw line as fairseq does and translates it as fairseq's greedy search does."""
    from fairseq.data.data_utils import post_process
    text = write_parallel_text(tmp_path / "text", seed=7)
    model, processor = train_sentencepiece(text, tmp_path)
    for split in ("train", "valid"):
        for lang in ("src", "tgt"):
            lines = (text / f"{split}.{lang}").read_text().splitlines()
            (text / f"{split}.bpe.{lang}").write_text(
                "".join(" ".join(processor.encode(line, out_type=str)) + "\n" for line in lines))
    checkpoint, out = train_and_convert(text, tmp_path, "--sentencepiece-model", model)

    line = "the old fox sees a green river"
    fairseq_model, dictionary = translation_checkpoint(checkpoint)
    ids = fairseq_ids(model, dictionary, line, append_eos=True)
    hypothesis = greedy_hypothesis(fairseq_model, dictionary, ids)
    translation = post_process(dictionary.string(hypothesis), "sentencepiece")
    assert translation, "fairseq's hypothesis is empty: nothing to compare"
    assert_translates_alone(out, line, ids, translation, tmp_path)


def test_two_dictionaries_encode_sources_and_targets_each_with_its_own(pieces, tmp_path):
    """A translation model of two dictionaries (no --joined-dictionary): sources take the source
    dictionary's ids, `text_target=` the target's, and decoding reads the target's, as fairseq encodes
    and post-processes each side."""
    import sentencepiece
    from fairseq.data import Dictionary
    from fairseq.data.data_utils import post_process
    model, source = pieces
    processor = sentencepiece.SentencePieceProcessor(model_file=str(model))
    target = Dictionary()
    for line in reversed(LINES + ["cats and dogs", "small birds sing"]):
        for piece in processor.encode(line, out_type=str):
            target.add_symbol(piece)
    target.finalize()
    assert target.symbols != source.symbols
    tokenizer = sentencepiece_tokenizer(source, model, "eos", 64, target_dictionary=target)
    dictionaries = {"source": source, "target": target}
    assert_two_dictionaries(tokenizer, tmp_path, LINES,
                            lambda side, line: fairseq_ids(model, dictionaries[side], line, append_eos=True),
                            lambda ids: post_process(target.string(torch.tensor(ids)), "sentencepiece"))

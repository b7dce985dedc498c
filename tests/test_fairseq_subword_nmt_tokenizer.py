"""The tokenizer convert_to_hf saves for a model trained on subword-nmt's BPE, with or without Moses
first (hf_momentum.tokenization_fairseq_subword_nmt): its ids equal fairseq's own encoding (its
MosesTokenizer, SubwordNMTBPE, then Dictionary.encode_line), `<unk>` for pieces the dictionary lacks
included, in each wrapping, with Moses' options and another separator; decoding is fairseq's
(SubwordNMTBPE.decode, then Moses' detokenizer); which tokenizer the converter saves for which task
and flags; and through the CLIs, the path of fairseq's translation examples: Moses and subword-nmt
before fairseq-preprocess, fairseq-train, the converter with --tokenizer moses --bpe-codes, then
transformers alone translating raw text as fairseq does."""
import io
import logging

import pytest
import torch
from helpers.fairseq_cli import write_parallel_text
from helpers.fairseq_decoding import (
    assert_translates_alone,
    assert_two_dictionaries,
    greedy_hypothesis,
    translation_checkpoint,
)
from test_fairseq_translation_to_hf import train_and_convert

from fairseq_momentum.convert_to_hf import Moses, SubwordNMT, saved_tokenizer, subword_nmt_tokenizer

pytest.importorskip("sacremoses")
pytest.importorskip("subword_nmt")

LINES = ["The cat sees a well-known dog, doesn't it?", "a big red fox chases the old bird & its friend!",
         "Zebras quack xylophones' songs..."]


def punctuated(lines):
    """The generated words as prose Moses has work on: capitals, commas, apostrophes, dashes, `&`."""
    out = []
    for i, line in enumerate(lines):
        words = line.split()
        if i % 3 == 0:
            words[0] = words[0].capitalize()
        if i % 4 == 1 and len(words) > 2:
            words[1] += ","
        if i % 5 == 2:
            words.insert(1, "well-known")
        if i % 7 == 3:
            words.insert(-1, "&")
        if i % 2:
            words[-1] += "'s"
        out.append(" ".join(words) + ("!" if i % 6 == 5 else "."))
    return out


def moses_encode(lines, lang="en", **options):
    from fairseq.data.encoders.moses_tokenizer import MosesTokenizer, MosesTokenizerConfig
    moses = MosesTokenizer(MosesTokenizerConfig(source_lang=lang, target_lang=lang, **options))
    return [moses.encode(line) for line in lines]


def learn_codes(lines, path, merges=120):
    from subword_nmt.learn_bpe import learn_bpe
    with open(path, "w", encoding="utf-8") as codes:
        learn_bpe(io.StringIO("".join(line + "\n" for line in lines)), codes, merges)
    return path


def fairseq_encoders(codes, separator, moses):
    """fairseq's own encoders for these settings (its --bpe subword_nmt and --tokenizer moses)."""
    from fairseq.data.encoders.moses_tokenizer import MosesTokenizer, MosesTokenizerConfig
    from fairseq.data.encoders.subword_nmt_bpe import SubwordNMTBPE, SubwordNMTBPEConfig
    bpe = SubwordNMTBPE(SubwordNMTBPEConfig(bpe_codes=str(codes), bpe_separator=separator))
    tokenizer = None if moses is None else MosesTokenizer(MosesTokenizerConfig(
        source_lang=moses.source_lang, target_lang=moses.target_lang,
        moses_no_dash_splits=not moses.dash_splits, moses_no_escape=not moses.escape))
    return bpe, tokenizer


def fairseq_ids(encoders, dictionary, line, append_eos):
    bpe, tokenizer = encoders
    text = line if tokenizer is None else tokenizer.encode(line)
    return dictionary.encode_line(bpe.encode(text), add_if_not_exist=False, append_eos=append_eos).tolist()


def fairseq_text(encoders, dictionary, ids):
    bpe, tokenizer = encoders
    text = bpe.decode(dictionary.string(torch.tensor(ids)))
    return text if tokenizer is None else tokenizer.decode(text)


@pytest.fixture(scope="module")
def prose(tmp_path_factory):
    """Punctuated generated text, Moses-tokenized (English rules), and BPE codes learned on it."""
    folder = tmp_path_factory.mktemp("subword_nmt")
    text = write_parallel_text(folder / "text", sizes=(("train", 200),), seed=3)
    lines = punctuated((text / "train.src").read_text().splitlines())
    return lines, learn_codes(moses_encode(lines), folder / "codes")


def dictionary_of(encoders, lines):
    """A fairseq dictionary of the pieces of part of the text (some pieces missing, as in real data)."""
    from fairseq.data import Dictionary
    bpe, tokenizer = encoders
    dictionary = Dictionary()
    for line in lines[:40]:
        for piece in bpe.encode(line if tokenizer is None else tokenizer.encode(line)).split():
            dictionary.add_symbol(piece)
    dictionary.finalize()
    return dictionary


VARIANTS = {"bpe": (None, "@@"), "moses+bpe": (Moses("en", "en"), "@@"),
            "moses-raw+bpe": (Moses("en", "en", dash_splits=False, escape=False), "++")}


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("pattern", ["eos", "none", "bos_eos"])
def test_ids_are_fairseqs_and_decoding_is_its_post_processing(prose, variant, pattern, tmp_path):
    lines, codes = prose
    moses, separator = VARIANTS[variant]
    encoders = fairseq_encoders(codes, separator, moses)
    dictionary = dictionary_of(encoders, lines)
    tokenizer = subword_nmt_tokenizer(dictionary, SubwordNMT(codes, separator), moses, pattern, 64)
    tokenizer.save_pretrained(tmp_path)
    tokenizer = type(tokenizer).from_pretrained(tmp_path)
    unknown = decoded = escaped = 0
    for line in LINES + lines[150:160]:
        ids = fairseq_ids(encoders, dictionary, line, append_eos=pattern != "none")
        if pattern == "bos_eos":
            ids = [dictionary.bos()] + ids
        assert tokenizer(line)["input_ids"] == ids, line
        unknown += ids.count(dictionary.unk())
        escaped += any("&apos;" in dictionary[i] for i in ids)
        if dictionary.unk() not in ids:
            assert tokenizer.decode(ids, skip_special_tokens=True) == fairseq_text(encoders, dictionary, ids)
            decoded += 1
    assert unknown > 0 and decoded > 3, (unknown, decoded)
    assert bool(escaped) == (moses is not None and moses.escape)      # Moses' escapes, where it makes them


def test_two_dictionaries_encode_sources_and_targets_each_with_its_own(prose, tmp_path):
    """Sources take the source dictionary's ids, `text_target=` the target's, each side Moses-tokenized
    in its own language (as fairseq's translation examples prepare the two sides), and decoding reads
    the target's and detokenizes in the target language."""
    lines, codes = prose
    moses = Moses("en", "fr")
    encoders = {"source": fairseq_encoders(codes, "@@", moses),
                "target": fairseq_encoders(codes, "@@", Moses("fr", "fr"))}
    source = dictionary_of(encoders["source"], lines)
    target = dictionary_of(encoders["target"], list(reversed(lines)))
    assert target.symbols != source.symbols
    tokenizer = subword_nmt_tokenizer(source, SubwordNMT(codes), moses, "eos", 64,
                                      target_dictionary=target)

    def encode(side, line):
        return fairseq_ids(encoders[side], {"source": source, "target": target}[side], line, append_eos=True)
    # the last lines' pieces are all in the target dictionary (made from them), LINES' are not
    assert_two_dictionaries(tokenizer, tmp_path, LINES + lines[-3:], encode,
                            lambda ids: fairseq_text(encoders["target"], target, ids))
    english_target = [fairseq_ids(encoders["source"], target, line, append_eos=True) for line in LINES]
    assert english_target != [encode("target", line) for line in LINES], "no line tells the languages apart"


def test_one_dictionary_tokenizes_targets_in_the_target_language(prose):
    """A joined dictionary: `text_target=` takes the same ids, but Moses' French rules (`doesn' t`,
    where English gives `doesn 't`), and a later call is a source again."""
    lines, codes = prose
    moses = Moses("en", "fr")
    english, french = fairseq_encoders(codes, "@@", moses), fairseq_encoders(codes, "@@", Moses("fr", "fr"))
    from fairseq.data import Dictionary
    dictionary = Dictionary()
    for line in LINES + lines[:40]:
        for encoders in (english, french):
            for piece in encoders[0].encode(encoders[1].encode(line)).split():
                dictionary.add_symbol(piece)
    dictionary.finalize()
    tokenizer = subword_nmt_tokenizer(dictionary, SubwordNMT(codes), moses, "eos", 64)
    batch = tokenizer(LINES, text_target=LINES)
    for line, ids, labels in zip(LINES, batch["input_ids"], batch["labels"]):
        assert ids == fairseq_ids(english, dictionary, line, append_eos=True), line
        assert labels == fairseq_ids(french, dictionary, line, append_eos=True), line
    assert batch["input_ids"] != batch["labels"]
    assert tokenizer(LINES)["input_ids"] == batch["input_ids"]


def test_which_tokenizer_is_saved(prose, caplog):
    """The task's --bpe subword_nmt codes and --tokenizer moses are found by themselves; --bpe-codes
    and --tokenizer moses given; Moses on a dictionary of words; what cannot be reproduced gets no
    tokenizer with a warning, and contradicting flags are refused by name."""
    from fairseq.data import Dictionary
    from transformers import AutoConfig, PreTrainedTokenizerFast
    lines, codes = prose
    encoders = fairseq_encoders(codes, "@@", Moses("en", "en"))
    dictionary = dictionary_of(encoders, lines)
    config = AutoConfig.for_model("momentum_transformer", vocab_size=len(dictionary),
                                  max_position_embeddings=32)
    task_bpe = {"_name": "subword_nmt", "bpe_codes": str(codes), "bpe_separator": "@@"}
    task_moses = {"_name": "moses", "source_lang": "de", "target_lang": "en", "moses_no_dash_splits": True,
                  "moses_no_escape": False}

    found = saved_tokenizer(dictionary, config, task_bpe, None)
    assert type(found).__name__ == "FairseqSubwordNMTTokenizer" and found.moses_tokenizer is None
    found = saved_tokenizer(dictionary, config, task_bpe, None, task_tokenizer=task_moses)
    assert found.moses_tokenizer is not None and found.init_kwargs["moses_source_lang"] == "de" and \
        found.init_kwargs["moses_target_lang"] == "en" and found.moses_dash_splits is False
    unnamed = dict(task_moses, source_lang=None, target_lang=None)     # a language pair left to inference
    found = saved_tokenizer(dictionary, config, task_bpe, None, task_tokenizer=unnamed)
    unnamed_encoders = fairseq_encoders(codes, "@@", Moses(None, None, dash_splits=False))
    assert found.moses_tokenizer is not None and found(LINES[0])["input_ids"] == fairseq_ids(
        unnamed_encoders, dictionary, LINES[0], append_eos=False)
    found = saved_tokenizer(dictionary, config, None, None, subword_nmt=SubwordNMT(codes),
                            moses=Moses("en", "en"))
    assert found.bpe is not None and found.moses_tokenizer is not None
    assert found(LINES[0])["input_ids"] == fairseq_ids(encoders, dictionary, LINES[0], append_eos=False)

    words = Dictionary()
    for line in moses_encode(lines):
        for word in line.split():
            words.add_symbol(word)
    found = saved_tokenizer(words, config, None, None, moses=Moses("en", "en"))
    assert found.bpe is None and found(LINES[1])["input_ids"] == words.encode_line(
        moses_encode([LINES[1]])[0], add_if_not_exist=False, append_eos=False).tolist()
    assert isinstance(saved_tokenizer(words, config, None, None), PreTrainedTokenizerFast)

    for task_tokenizer, bpe in [({"_name": "nltk"}, task_bpe),
                                (task_moses, {"_name": "sentencepiece", "sentencepiece_model": "x"}),
                                (None, None)]:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="fairseq_momentum.convert_to_hf"):
            assert saved_tokenizer(dictionary, config, bpe, None, task_tokenizer=task_tokenizer) is None
        assert "no tokenizer is saved" in caplog.text
    assert "--bpe-codes" in caplog.text             # the subword dictionary's warning names the flag

    refused = [
        (dict(sentencepiece_model=codes, subword_nmt=SubwordNMT(codes)), "the data had one BPE"),
        (dict(sentencepiece_model=codes, moses=Moses("en", "en")), "--tokenizer moses: the saved tokenizer"),
        (dict(bpe={"_name": "gpt2"}, subword_nmt=SubwordNMT(codes)), "--bpe-codes: the task used --bpe gpt2"),
        (dict(subword_nmt=SubwordNMT(codes.with_name("missing"))), "--bpe-codes: no file"),
    ]
    for arguments, message in refused:
        arguments = {"bpe": None, "sentencepiece_model": None, **arguments}
        with pytest.raises(ValueError, match=message):
            saved_tokenizer(dictionary, config, **arguments)


def test_moses_takes_the_translation_tasks_languages_unless_given():
    task = {"source_lang": "de", "target_lang": "en"}
    assert Moses().with_task_languages(task) == Moses("de", "en")
    assert Moses("fr").with_task_languages(task) == Moses("fr", "en")
    assert Moses().with_task_languages(None) == Moses("en", "en")
    assert Moses().with_task_languages({"source_lang": None, "target_lang": None}) == Moses("en", "en")


def test_moses_options_without_the_tokenizer_are_refused(tmp_path, capsys):
    from fairseq_momentum.convert_to_hf import main
    checkpoint = tmp_path / "checkpoint.pt"
    checkpoint.write_bytes(b"")
    with pytest.raises(SystemExit):
        main([str(checkpoint), str(tmp_path / "out"), "--moses-no-escape"])
    assert "options of --tokenizer moses, which is not given" in capsys.readouterr().err


def test_cli_converts_a_translation_model_trained_on_moses_and_subword_nmt(tmp_path):
    """fairseq's translation examples' path: Moses, then subword-nmt's BPE before fairseq-preprocess,
    fairseq-train; the converted model with its tokenizer, in a process without our packages, encodes a
    raw line as fairseq's --tokenizer moses --bpe subword_nmt does and translates it as fairseq's
    greedy search, post-processed and detokenized, does."""
    from subword_nmt.apply_bpe import BPE
    text = write_parallel_text(tmp_path / "text", sizes=(("train", 300), ("valid", 30)), seed=7)
    sides = {(split, lang): moses_encode(punctuated((text / f"{split}.{lang}").read_text().splitlines()))
             for split in ("train", "valid") for lang in ("src", "tgt")}
    codes = learn_codes(sides["train", "src"] + sides["train", "tgt"], tmp_path / "codes")
    with open(codes, encoding="utf-8") as handle:
        bpe = BPE(handle)
    for (split, lang), lines in sides.items():
        (text / f"{split}.bpe.{lang}").write_text("".join(bpe.process_line(line) + "\n" for line in lines))
    checkpoint, out = train_and_convert(text, tmp_path, "--tokenizer", "moses", "--moses-source-lang", "en",
                                        "--moses-target-lang", "en", "--bpe-codes", codes)

    line = "The old fox sees a well-known river, and the dog's house!"
    model, dictionary = translation_checkpoint(checkpoint)
    encoders = fairseq_encoders(codes, "@@", Moses("en", "en"))
    ids = fairseq_ids(encoders, dictionary, line, append_eos=True)
    assert dictionary.unk() not in ids and len(ids) > len(line.split()) + 1     # split by Moses and BPE
    translation = fairseq_text(encoders, dictionary, greedy_hypothesis(model, dictionary, ids).tolist())
    assert translation, "fairseq's hypothesis is empty: nothing to compare"
    assert_translates_alone(out, line, ids, translation, tmp_path)

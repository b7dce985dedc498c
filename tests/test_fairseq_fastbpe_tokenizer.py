"""The tokenizer convert_to_hf saves for a model trained on fastBPE's codes (fairseq's `--bpe fastbpe`,
as its WMT'19 models are; or text segmented by fastBPE before fairseq-preprocess, `--fastbpe-codes`):
subword-nmt on the same merges (convert_to_hf.SubwordNMT.of_fastbpe). Its ids equal fairseq's own
encoding through the real fastBPE (fairseq's fastBPE encoder, Moses first or not, then
Dictionary.encode_line) on punctuated prose and on random words of accented, CJK and single
characters; decoding is fairseq's; codes that are not fastBPE's are refused by line; and through the
CLIs: fairseq-train with `--bpe fastbpe`, the converter finding the codes in the checkpoint, then
transformers alone translating raw text as fairseq does."""
import random

import pytest
from helpers.fairseq_cli import preprocess, train, write_parallel_text
from helpers.fairseq_decoding import assert_translates_alone, greedy_hypothesis, translation_checkpoint
from test_fairseq_subword_nmt_tokenizer import LINES, fairseq_text, learn_codes, moses_encode, punctuated
from test_fairseq_subword_nmt_tokenizer import fairseq_ids as fairseq_ids_of
from test_fairseq_to_hf import run_converter
from test_fairseq_translation_to_hf import SIZES, TASK

from fairseq_momentum.convert_to_hf import Moses, SubwordNMT, saved_tokenizer

pytest.importorskip("fastBPE")
pytest.importorskip("sacremoses")
pytest.importorskip("subword_nmt")

CHARACTERS = "abcdeéèfghijklmnopqrstuvwxyzßüø日本語'-.,0123"


def fastbpe_codes(lines, path, merges=150):
    """Codes in fastBPE's format (`left right count` a line, in merge order): subword-nmt learns the
    merges, and each line gets a count, falling as fastBPE's do (neither applier reads it)."""
    pairs = [line for line in learn_codes(lines, path.with_suffix(".subword_nmt"), merges)
             .read_text(encoding="utf-8").splitlines() if not line.startswith("#")]
    counted = (f"{pair} {10 * len(pairs) - i}\n" for i, pair in enumerate(pairs))
    path.write_text("".join(counted), encoding="utf-8")
    return path


def random_lines(count, seed):
    """Lines of random words over CHARACTERS, one-character words among them."""
    rng = random.Random(seed)
    return [" ".join("".join(rng.choice(CHARACTERS) for _ in range(rng.randint(1, 9)))
                     for _ in range(rng.randint(1, 10))) for _ in range(count)]


def fairseq_encoders(codes, moses):
    """fairseq's own encoders: its --bpe fastbpe (the fastBPE package) and --tokenizer moses."""
    from fairseq.data.encoders.fastbpe import fastBPE, fastBPEConfig
    from fairseq.data.encoders.moses_tokenizer import MosesTokenizer, MosesTokenizerConfig
    tokenizer = None if moses is None else MosesTokenizer(MosesTokenizerConfig(
        source_lang=moses.source_lang, target_lang=moses.target_lang))
    return fastBPE(fastBPEConfig(bpe_codes=str(codes))), tokenizer


def fairseq_ids(encoders, dictionary, line):
    """fairseq's ids of a translation source (`</s>` appended) through `encoders`."""
    return fairseq_ids_of(encoders, dictionary, line, append_eos=True)


def dictionary_of(encoders, lines):
    """A fairseq dictionary of the pieces of part of the text (some pieces missing, as in real data)."""
    from fairseq.data import Dictionary
    bpe, tokenizer = encoders
    dictionary = Dictionary()
    for line in lines:
        for piece in bpe.encode(line if tokenizer is None else tokenizer.encode(line)).split():
            dictionary.add_symbol(piece)
    dictionary.finalize()
    return dictionary


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Punctuated generated prose and random words, and fastBPE codes learned on both (Moses-tokenized)."""
    folder = tmp_path_factory.mktemp("fastbpe")
    text = write_parallel_text(folder / "text", sizes=(("train", 200),), seed=3)
    lines = punctuated((text / "train.src").read_text().splitlines()) + random_lines(200, seed=0)
    return lines, fastbpe_codes(moses_encode(lines), folder / "codes")


@pytest.mark.parametrize("moses", [None, Moses("en", "en")], ids=["fastbpe", "moses+fastbpe"])
def test_ids_are_fairseqs_fastbpe_and_decoding_is_its_post_processing(corpus, moses, tmp_path):
    """The task's --bpe fastbpe (and --tokenizer moses) found in its config: the saved tokenizer,
    loaded again, gives fairseq's ids on lines it learned from and on lines of new random words
    (pieces the dictionary lacks become `<unk>` in both), and decodes as fairseq does."""
    from transformers import AutoConfig
    lines, codes = corpus
    encoders = fairseq_encoders(codes, moses)
    dictionary = dictionary_of(encoders, lines[:60] + lines[200:260])
    config = AutoConfig.for_model("momentum_seq2seq", vocab_size=len(dictionary))   # a source ends in </s>
    task_tokenizer = None if moses is None else {"_name": "moses", "source_lang": "en", "target_lang": "en"}
    tokenizer = saved_tokenizer(dictionary, config, {"_name": "fastbpe", "bpe_codes": str(codes)}, None,
                                task_tokenizer=task_tokenizer)
    tokenizer.save_pretrained(tmp_path)
    tokenizer = type(tokenizer).from_pretrained(tmp_path)
    assert (tmp_path / "bpecodes").read_text(encoding="utf-8").startswith("#version: 0.2\n")
    unknown = decoded = split = 0
    for line in LINES + lines[150:170] + lines[250:270] + random_lines(60, seed=1):
        ids = fairseq_ids(encoders, dictionary, line)
        assert tokenizer(line)["input_ids"] == ids, line
        unknown += ids.count(dictionary.unk())
        split += len(ids) - 1 > len(line.split())
        if dictionary.unk() not in ids:
            assert tokenizer.decode(ids, skip_special_tokens=True) == fairseq_text(encoders, dictionary, ids)
            decoded += 1
    assert unknown > 0 and decoded > 10 and split > 10, (unknown, decoded, split)


def test_codes_given_by_flag_and_what_is_refused(corpus, tmp_path):
    """--fastbpe-codes for text segmented before fairseq-preprocess; a line without its count, codes in
    subword-nmt's format and a missing file are refused with the file and line, and so is
    --fastbpe-codes against a task that used another BPE."""
    from transformers import AutoConfig
    lines, codes = corpus
    encoders = fairseq_encoders(codes, None)
    dictionary = dictionary_of(encoders, lines[:60])
    config = AutoConfig.for_model("momentum_seq2seq", vocab_size=len(dictionary))   # a source ends in </s>
    given = saved_tokenizer(dictionary, config, None, None, subword_nmt=SubwordNMT.of_fastbpe(codes))
    assert given(lines[3])["input_ids"] == fairseq_ids(encoders, dictionary, lines[3])

    subword_nmt_format = codes.with_suffix(".subword_nmt")
    uncounted = tmp_path / "uncounted"
    uncounted.write_text("t h 9\nth e\n", encoding="utf-8")
    for path, message in [(subword_nmt_format, r"line 1: '#version: 0.2' is not fastBPE's"),
                          (uncounted, r"uncounted, line 2: 'th e' is not fastBPE's 'left right count'"),
                          (tmp_path / "missing", "--fastbpe-codes: no file")]:
        with pytest.raises(ValueError, match=message):
            SubwordNMT.of_fastbpe(path)
    with pytest.raises(ValueError, match="--fastbpe-codes: the task used --bpe subword_nmt, not fastbpe"):
        saved_tokenizer(dictionary, config, {"_name": "subword_nmt"}, None,
                        subword_nmt=SubwordNMT.of_fastbpe(codes))
    with pytest.raises(ValueError, match="the data had one BPE; pass one"):
        saved_tokenizer(dictionary, config, None, codes, subword_nmt=SubwordNMT.of_fastbpe(codes))


def test_cli_refuses_both_bpe_flags_and_a_separator_for_fastbpe(corpus, tmp_path, capsys):
    from fairseq_momentum.convert_to_hf import main
    _, codes = corpus
    checkpoint = tmp_path / "checkpoint.pt"
    checkpoint.write_bytes(b"")
    for flags, message in [(["--bpe-codes", str(codes), "--fastbpe-codes", str(codes)], "pass one"),
                           (["--fastbpe-codes", str(codes), "--bpe-separator", "++"],
                            "--bpe-separator: an option of --bpe-codes")]:
        with pytest.raises(SystemExit):
            main([str(checkpoint), str(tmp_path / "out"), *flags])
        assert message in capsys.readouterr().err


def test_cli_converts_a_translation_model_trained_with_bpe_fastbpe(tmp_path):
    """Text segmented by fastBPE before fairseq-preprocess, fairseq-train told `--bpe fastbpe
    --bpe-codes` (as fairseq's WMT'19 models were), the converter with no BPE flag: the converted
    folder, in a process without our packages, encodes a raw line as fairseq's fastBPE does and
    translates it as fairseq's greedy search, post-processed, does."""
    text = write_parallel_text(tmp_path / "text", sizes=(("train", 300), ("valid", 30)), seed=7)
    sides = {(split, lang): (text / f"{split}.{lang}").read_text().splitlines()
             for split in ("train", "valid") for lang in ("src", "tgt")}
    codes = fastbpe_codes(sides["train", "src"] + sides["train", "tgt"], tmp_path / "codes", merges=20)
    bpe, _ = fairseq_encoders(codes, None)
    for (split, lang), lines in sides.items():
        (text / f"{split}.bpe.{lang}").write_text("".join(bpe.encode(line) + "\n" for line in lines))
    data, save, out = tmp_path / "bin", tmp_path / "ckpt", tmp_path / "hf"
    preprocess("--source-lang", "src", "--target-lang", "tgt", "--trainpref", text / "train.bpe",
               "--validpref", text / "valid.bpe", "--destdir", data, "--workers", "1", "--joined-dictionary")
    train(data, save, *TASK, "--arch", "momentum_transformer", *SIZES, "--share-all-embeddings",
          "--batch-size", "16", "--max-update", "6", "--optimizer", "adam", "--lr", "0.003",
          "--bpe", "fastbpe", "--bpe-codes", codes)
    checkpoint = save / "checkpoint_last.pt"
    assert run_converter(checkpoint, out)["model_type"] == "momentum_seq2seq"
    assert (out / "bpecodes").is_file()

    line = sides["valid", "src"][0]
    model, dictionary = translation_checkpoint(checkpoint)
    encoders = (bpe, None)
    ids = fairseq_ids(encoders, dictionary, line)
    assert dictionary.unk() not in ids and len(ids) > len(line.split()) + 1, ids     # split by the BPE
    translation = fairseq_text(encoders, dictionary, greedy_hypothesis(model, dictionary, ids).tolist())
    assert translation, "fairseq's hypothesis is empty: nothing to compare"
    assert_translates_alone(out, line, ids, translation, tmp_path)

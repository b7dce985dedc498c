"""The tokenizer convert_to_hf saves for a model trained on GPT-2 byte-level BPE
(hf_momentum.tokenization_fairseq_gpt2): its ids equal fairseq's own encoding (its GPT2BPE, then
Dictionary.encode_line), `<unk>` for GPT-2 ids the dictionary lacks included, on text with accents,
emoji, digits and runs of whitespace, in each wrapping (LM prompt, masked LM); decoding is fairseq's
GPT2BPE.decode; a dictionary of GPT-2 ids without the BPE files gets no tokenizer (a word-level one
would read raw words as <unk>); and through the CLIs, RoBERTa's path: text encoded with GPT-2's BPE,
fairseq-preprocess, fairseq-train --task masked_lm --bpe gpt2, the converter finding the task's
BPE files, then transformers alone tokenizing raw text and giving fairseq's logits."""
import itertools
import json
import logging
import random

import pytest
import torch
from helpers.clean_process import run_clean
from helpers.fairseq_cli import WORDS, preprocess, train
from test_fairseq_to_hf import clean_load_and_compare, run_converter

from fairseq_momentum.convert_to_hf import dictionary_tokenizer, gpt2_tokenizer, saved_tokenizer
from hf_momentum.tokenization_fairseq_dictionary import wrap_layout

LINES = ["the cat sees a small dog", "  Élise's café: 42 oranges,\tthen\n\nmore  ", "emoji 🎉 and ünïcödé ×2",
         "which was the very best"]


def corpus(seed, n):
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12))) for _ in range(n)]


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    """GPT-2-style BPE files (encoder.json, vocab.bpe) trained on generated text, fairseq's GPT2BPE of
    them, and a fairseq dictionary of the ids of part of that text (some GPT-2 ids are missing from
    it, as in real data)."""
    from fairseq.data import Dictionary
    from fairseq.data.encoders.gpt2_bpe import GPT2BPE, GPT2BPEConfig
    from tokenizers import ByteLevelBPETokenizer
    folder = tmp_path_factory.mktemp("gpt2")
    (folder / "corpus.txt").write_text("\n".join(corpus(0, 300)) + "\n")
    trainer = ByteLevelBPETokenizer()
    trainer.train([str(folder / "corpus.txt")], vocab_size=320, min_frequency=2, show_progress=False)
    trainer.save_model(str(folder))
    files = (folder / "vocab.json", folder / "merges.txt")
    assert (folder / "merges.txt").read_text().startswith("#version")   # the header fairseq skips
    bpe = GPT2BPE(GPT2BPEConfig(gpt2_encoder_json=str(files[0]), gpt2_vocab_bpe=str(files[1])))
    dictionary = Dictionary()
    for line in corpus(0, 300)[:60]:
        for symbol in bpe.encode(line).split():
            dictionary.add_symbol(symbol)
    dictionary.finalize()
    return files, bpe, dictionary


@pytest.fixture(scope="module")
def whole_dictionary(gpt2):
    """A dictionary of every GPT-2 id, in an order of its own (RoBERTa's dict.txt, given to
    fairseq-preprocess as --srcdict), with RoBERTa's padding words and `<mask>`."""
    from fairseq.data import Dictionary
    files, _, _ = gpt2
    gpt2_ids = list(json.loads(files[0].read_text()).values())
    random.Random(1).shuffle(gpt2_ids)
    dictionary = Dictionary()
    for symbol in [str(i) for i in gpt2_ids] + ["madeupword0000", "madeupword0001", "<mask>"]:
        dictionary.add_symbol(symbol)
    return dictionary


def fairseq_ids(bpe, dictionary, pattern, line, pair=None):
    """fairseq's ids of a line (and a pair's second line) wrapped as its tasks wrap them."""
    lead, ends, separated = wrap_layout(pattern)
    ids = [dictionary.bos()] if lead else []
    for i, text in enumerate([line] if pair is None else [line, pair]):
        if i and separated:
            ids.append(dictionary.eos())
        ids += dictionary.encode_line(bpe.encode(text), add_if_not_exist=False, append_eos=ends).tolist()
    return ids


@pytest.mark.parametrize("pattern", ["none", "eos", "bos_eos", "bos_eos_sep"])
def test_a_dictionary_of_every_gpt2_token_gets_a_fast_tokenizer(gpt2, whole_dictionary, pattern, tmp_path):
    """Its ids (single texts and pairs) are fairseq's, decoding is fairseq's, each token's offsets
    cover the text it came from, and words given one by one are encoded as inside a sentence, once
    the tokenizer is loaded with add_prefix_space=True."""
    from transformers import AutoTokenizer
    files, bpe, _ = gpt2
    dictionary = whole_dictionary
    saved = gpt2_tokenizer(dictionary, files, pattern, 64)
    assert type(saved).__name__ == "FairseqGPT2TokenizerFast"
    saved.save_pretrained(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path, trust_remote_code=True)
    assert tokenizer.is_fast and type(tokenizer).__name__ == "FairseqGPT2TokenizerFast"
    assert (len(tokenizer), tokenizer.pad_token_id, tokenizer.mask_token_id) == \
        (len(dictionary), dictionary.pad(), dictionary.index("<mask>"))
    for line, pair in zip(LINES, LINES[1:] + LINES[:1]):
        ids = fairseq_ids(bpe, dictionary, pattern, line)
        encoded = tokenizer(line, return_offsets_mapping=True)
        assert encoded["input_ids"] == ids, line
        assert tokenizer(line, pair)["input_ids"] == fairseq_ids(bpe, dictionary, pattern, line, pair)
        assert tokenizer.decode(ids, skip_special_tokens=True) == line
        # the bytes of one character may be two tokens, which then share its offsets
        tokens = zip(encoded.tokens(), encoded["offset_mapping"])
        for (start, end), group in itertools.groupby(tokens, key=lambda token: token[1]):
            text = tokenizer.convert_tokens_to_string([token for token, _ in group])
            if text not in (dictionary.bos_word, dictionary.eos_word):
                # byte-level offsets leave a leading space out
                covered = line[start:end]
                assert text.endswith(covered) and covered.strip() == text.strip(), (line, text, start, end)
    spaced = AutoTokenizer.from_pretrained(tmp_path, trust_remote_code=True, add_prefix_space=True)
    words = LINES[0].split()
    encoded = spaced(words, is_split_into_words=True, return_offsets_mapping=True)
    pieces = [word for word in encoded.word_ids() if word is not None]
    assert pieces == sorted(pieces) and set(pieces) == set(range(len(words)))
    for word, (start, end) in zip(encoded.word_ids(), encoded["offset_mapping"]):
        assert word is None or words[word][start:end] and end <= len(words[word])


@pytest.mark.parametrize("kind", ["slow", "fast"])
def test_words_given_one_by_one_need_a_prefix_space(gpt2, whole_dictionary, kind, tmp_path):
    """Words given one by one (`is_split_into_words=True`, transformers' token-classification
    scripts) are encoded as inside a sentence where the tokenizer is loaded with
    add_prefix_space=True, and refused without (each would be read as a text's first word); the
    slow and fast tokenizers add the space alike."""
    from transformers import AutoTokenizer

    from hf_momentum.tokenization_fairseq_gpt2 import FairseqGPT2Tokenizer
    files, bpe, dictionary = gpt2[0], gpt2[1], whole_dictionary
    if kind == "fast":
        gpt2_tokenizer(dictionary, files, "bos_eos", 64).save_pretrained(tmp_path)
        load = AutoTokenizer.from_pretrained
    else:
        dictionary_tokenizer(FairseqGPT2Tokenizer, files, dictionary, "bos_eos", 64).save_pretrained(tmp_path)
        load = FairseqGPT2Tokenizer.from_pretrained
    words = LINES[0].split()
    with pytest.raises(ValueError, match="add_prefix_space=True"):
        load(tmp_path, trust_remote_code=True)(words, is_split_into_words=True)
    spaced = load(tmp_path, trust_remote_code=True, add_prefix_space=True)
    assert spaced(words, is_split_into_words=True)["input_ids"] == \
        fairseq_ids(bpe, dictionary, "bos_eos", " " + LINES[0])
    for line in LINES + ["", "\tthen"]:
        expected = line if line.startswith(" ") or not line else " " + line
        assert spaced(line)["input_ids"] == fairseq_ids(bpe, dictionary, "bos_eos", expected), line


def test_the_fast_tokenizer_loads_where_only_transformers_is_installed(gpt2, whole_dictionary, tmp_path):
    """Its code travels with it: a process without our packages loads it, with offsets."""
    files, bpe, dictionary = gpt2[0], gpt2[1], whole_dictionary
    gpt2_tokenizer(dictionary, files, "bos_eos", 64).save_pretrained(tmp_path / "tok")
    line = LINES[0]
    proc = run_clean(f"""
        import json
        from transformers import AutoTokenizer
        tokenizer = AutoTokenizer.from_pretrained({str(tmp_path / "tok")!r}, trust_remote_code=True)
        encoded = tokenizer({line!r}, return_offsets_mapping=True)
        print(json.dumps([type(tokenizer).__module__, encoded["input_ids"], encoded["offset_mapping"]]))
    """, tmp_path, {"HF_HUB_OFFLINE": "1"})
    module, ids, offsets = json.loads(proc.stdout.strip().splitlines()[-1])
    assert module.startswith("transformers_modules")
    assert ids == fairseq_ids(bpe, dictionary, "bos_eos", line)
    assert "".join(line[start:end] for start, end in offsets) == line.replace(" ", "")   # each letter once


def test_ids_of_a_dictionary_without_every_gpt2_token_are_fairseqs(gpt2, whole_dictionary):
    """A dictionary that lacks a GPT-2 token (read as <unk>) or a translation model's second one gets
    the slow tokenizer; one of every token, the fast one."""
    from transformers import AutoConfig
    files, _, partial = gpt2
    config = AutoConfig.for_model("momentum_transformer", vocab_size=len(partial), max_position_embeddings=32)
    task_bpe = {"_name": "gpt2", "gpt2_encoder_json": str(files[0]), "gpt2_vocab_bpe": str(files[1])}
    assert type(saved_tokenizer(partial, config, task_bpe, None)).__name__ == "FairseqGPT2Tokenizer"
    assert type(saved_tokenizer(whole_dictionary, config, task_bpe, None)).__name__ == \
        "FairseqGPT2TokenizerFast"
    assert type(saved_tokenizer(whole_dictionary, config, task_bpe, None, partial)).__name__ == \
        "FairseqGPT2Tokenizer"


@pytest.mark.parametrize("pattern", ["none", "bos_eos"])
def test_ids_are_fairseqs_and_decoding_is_its_gpt2_decode(gpt2, pattern, tmp_path):
    files, bpe, dictionary = gpt2
    tokenizer = gpt2_tokenizer(dictionary, files, pattern, 64)
    tokenizer.save_pretrained(tmp_path)
    tokenizer = type(tokenizer).from_pretrained(tmp_path)
    unknown = 0
    for line in LINES:
        ids = dictionary.encode_line(bpe.encode(line), add_if_not_exist=False,
                                     append_eos=pattern == "bos_eos").tolist()
        if pattern == "bos_eos":
            ids = [dictionary.bos()] + ids
        assert tokenizer(line)["input_ids"] == ids, line
        unknown += ids.count(dictionary.unk())
        assert tokenizer.decode(ids, skip_special_tokens=True) == \
            bpe.decode(dictionary.string(torch.tensor(ids), extra_symbols_to_ignore={dictionary.unk()})), line
        if dictionary.unk() not in ids:
            assert tokenizer.decode(ids, skip_special_tokens=True) == line
    assert unknown > 0, "no line met a GPT-2 id missing from the dictionary"
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id, len(tokenizer)) == \
        (dictionary.pad(), dictionary.eos(), len(dictionary))


def test_which_tokenizer_is_saved(gpt2, caplog):
    """The task's --bpe gpt2 files are used by themselves, or given ones; GPT-2 ids without them get
    no tokenizer, with a warning naming the options; conflicting or missing files are refused."""
    from transformers import AutoConfig
    files, _, dictionary = gpt2
    config = AutoConfig.for_model("momentum_transformer", vocab_size=len(dictionary),
                                  max_position_embeddings=32)
    task_bpe = {"_name": "gpt2", "gpt2_encoder_json": str(files[0]), "gpt2_vocab_bpe": str(files[1])}
    assert type(saved_tokenizer(dictionary, config, task_bpe, None)).__name__ == "FairseqGPT2Tokenizer"
    assert type(saved_tokenizer(dictionary, config, None, None, gpt2_files=files)).__name__ == \
        "FairseqGPT2Tokenizer"
    with caplog.at_level(logging.WARNING, logger="fairseq_momentum.convert_to_hf"):
        assert saved_tokenizer(dictionary, config, None, None) is None
    assert "GPT-2 BPE ids" in caplog.text and "--gpt2-encoder-json" in caplog.text
    with pytest.raises(ValueError, match="the data had one BPE; pass one"):
        saved_tokenizer(dictionary, config, None, files[0], gpt2_files=files)
    with pytest.raises(ValueError, match="--gpt2-encoder-json: the task used --bpe sentencepiece"):
        saved_tokenizer(dictionary, config, {"_name": "sentencepiece"}, None, gpt2_files=files)
    with pytest.raises(ValueError, match="--gpt2-vocab-bpe: no file"):
        saved_tokenizer(dictionary, config, None, None, gpt2_files=(files[0], files[1].with_name("none.bpe")))


def test_cli_converts_a_roberta_trained_on_gpt2_bpe(gpt2, tmp_path):
    """RoBERTa's path: raw text encoded with GPT-2's BPE (as its multiprocessing_bpe_encoder does),
    fairseq-preprocess, fairseq-train --task masked_lm --bpe gpt2 with the BPE files; the converter
    finds them in the checkpoint, and transformers alone turns a raw line into fairseq's ids and
    logits, and fills a mask."""
    files, bpe, _ = gpt2
    text = tmp_path / "text"
    text.mkdir()
    for split, seed, n in (("train", 1, 300), ("valid", 2, 30)):
        (text / f"{split}.bpe").write_text("".join(bpe.encode(line) + "\n" for line in corpus(seed, n)))
    data = tmp_path / "bin"
    preprocess("--only-source", "--trainpref", text / "train.bpe", "--validpref", text / "valid.bpe",
               "--destdir", data, "--workers", "1")
    save = tmp_path / "ckpt"
    train(data, save, "--task", "masked_lm", "--arch", "momentum_roberta", "--encoder-layers", "2",
          "--encoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2",
          "--tokens-per-sample", "32", "--batch-size", "8", "--max-update", "3", "--optimizer", "adam",
          "--lr", "0.001", "--bpe", "gpt2", "--gpt2-encoder-json", files[0], "--gpt2-vocab-bpe", files[1])
    out = tmp_path / "hf"
    assert run_converter(save / "checkpoint_last.pt", out)["model_type"] == "momentum_transformer"
    assert json.loads((out / "tokenizer_config.json").read_text())["auto_map"]["AutoTokenizer"][0] == \
        "tokenization_fairseq_gpt2.FairseqGPT2Tokenizer"

    from fairseq import checkpoint_utils
    [model], _, task = checkpoint_utils.load_model_ensemble_and_task([str(save / "checkpoint_last.pt")])
    dictionary = task.source_dictionary
    line = "the cat sees a small dog"
    ids = torch.cat([torch.tensor([dictionary.bos()]),
                     dictionary.encode_line(bpe.encode(line), add_if_not_exist=False).long()])
    with torch.no_grad():
        torch.save({"ids": ids[None], "logits": model.eval()(ids[None])[0]}, tmp_path / "expected.pt")
    proc = run_clean(clean_load_and_compare("AutoModelForMaskedLM", out, tmp_path / "expected.pt", line) + """
        filled = pipeline("fill-mask", model=model, tokenizer=tokenizer)("the cat<mask> a small dog")
        assert len(filled) == 5 and all(guess["sequence"].startswith("the cat") for guess in filled), filled
        print("OK", type(tokenizer).__module__)
    """, tmp_path, {"HF_HUB_OFFLINE": "1"})
    assert "OK transformers_modules" in proc.stdout

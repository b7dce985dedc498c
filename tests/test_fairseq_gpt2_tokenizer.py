"""The tokenizer convert_to_hf saves for a model trained on GPT-2 byte-level BPE
(hf_momentum.tokenization_fairseq_gpt2): its ids equal fairseq's own encoding (its GPT2BPE, then
Dictionary.encode_line), `<unk>` for GPT-2 ids the dictionary lacks included, on text with accents,
emoji, digits and runs of whitespace, in each wrapping (LM prompt, masked LM); decoding is fairseq's
GPT2BPE.decode; a dictionary of GPT-2 ids without the BPE files gets no tokenizer (a word-level one
would read raw words as <unk>); and through the CLIs, RoBERTa's path: text encoded with GPT-2's BPE,
fairseq-preprocess, fairseq-train --task masked_lm --bpe gpt2, the converter finding the task's
BPE files, then transformers alone tokenizing raw text and giving fairseq's logits."""
import json
import logging
import random

import pytest
import torch
from helpers.clean_process import run_clean
from helpers.fairseq_cli import WORDS, preprocess, train
from test_fairseq_to_hf import clean_load_and_compare, run_converter

from fairseq_momentum.convert_to_hf import gpt2_tokenizer, saved_tokenizer

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

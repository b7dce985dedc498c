"""The offline LM corpora: PTB-style tokenisation, chapter splits, the R lazy-load reader."""
from pathlib import Path

import pytest

from recipes.common.corpora import (
    CorpusUnavailable,
    assign_split,
    austen_documents,
    build_lm_corpus,
    paragraphs,
    ptb_tokenize,
    sentences,
    split_chapters,
)


def test_ptb_tokenize():
    assert ptb_tokenize("It is a truth, universally acknowledged -- in 1813!") == \
        ["it", "is", "a", "truth", "universally", "acknowledged", "in", "N"]
    assert ptb_tokenize("Mr. Darcy's house wasn't far; £10,000 a year.") == \
        ["mr", "darcy", "'s", "house", "was", "n't", "far", "N", "a", "year"]
    assert ptb_tokenize("She said \u2019tis Emma\u2019s") == ["she", "said", "tis", "emma", "'s"]


def test_sentences_and_paragraphs():
    lines = ["It was late.  She left!", "Was he there?", "", "", "New paragraph"]
    paras = paragraphs(lines)
    assert paras == ["It was late.  She left! Was he there?", "New paragraph"]
    assert sentences(paras[0]) == ["It was late.", "She left!", "Was he there?"]


def test_split_chapters_drops_front_matter():
    lines = ["TITLE", "by someone", "CHAPTER I", "one", "", "Chapter 2", "two a", "two b", "CHAPTER III"]
    assert split_chapters(lines) == [["one", ""], ["two a", "two b"]]


def test_assign_split_proportions():
    splits = [assign_split(i) for i in range(1400)]
    assert splits.count("valid") == 100 and splits.count("test") == 100


def test_build_lm_corpus_caps_vocabulary_and_keeps_chapters_apart(tmp_path):
    docs = [("book", i, [f"Chapter text number{i} alpha beta{i % 3}. Second sentence here."])
            for i in range(28)]
    paths = build_lm_corpus(docs, tmp_path, vocab_size=6)
    train = paths["train"].read_text().split()
    vocab = set(train)
    assert len(vocab - {"<unk>"}) <= 5 and "<unk>" in vocab
    valid_lines = paths["valid"].read_text().splitlines()
    assert len(valid_lines) == 4                     # chapters 6 and 20, two sentences each
    for split in ("valid", "test"):
        assert set(paths[split].read_text().split()) <= vocab


def test_austen_corpus_from_debian(tmp_path_factory):
    """Reads the real novels from Debian's r-cran-janeaustenr, without R."""
    cache = Path.home() / ".cache" / "momentum_plugins"
    try:
        docs = austen_documents(cache)
    except CorpusUnavailable as err:
        pytest.fail(f"Debian's r-cran-janeaustenr could not be fetched: {err}")
    books = {b for b, _, _ in docs}
    assert books == {"sensesensibility", "prideprejudice", "mansfieldpark", "emma", "northangerabbey",
                     "persuasion"}
    pride = [lines for b, _, lines in docs if b == "prideprejudice"]
    assert len(pride) == 61
    assert "It is a truth universally acknowledged" in " ".join(pride[0])

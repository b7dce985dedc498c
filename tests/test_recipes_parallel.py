"""Offline parallel text for the translation recipe."""
from pathlib import Path

import pytest

from recipes.common.corpora import CorpusUnavailable
from recipes.common.parallel import (
    TEST_BOOKS,
    VALID_BOOKS,
    _read_bible_pairs,
    clean_verse,
    split_by_book,
    write_parallel,
)


def test_clean_verse():
    assert clean_verse("  \u00b6 For God so loved\n the world ") == "For God so loved the world"


def test_split_by_book_holds_out_whole_books(tmp_path):
    pairs = [("Genesis", "a", "b"), ("Ruth", "c", "d"), ("Mark", "e", "f"), ("Ruth", "g", "h")]
    splits = split_by_book(pairs)
    assert splits == {"train": [("a", "b")], "valid": [("c", "d"), ("g", "h")], "test": [("e", "f")]}
    assert not VALID_BOOKS & TEST_BOOKS
    prefixes = write_parallel(splits, tmp_path, "en", "es")
    assert Path(f"{prefixes['valid']}.en").read_text() == "c\ng\n"
    assert Path(f"{prefixes['valid']}.es").read_text() == "d\nh\n"


def test_bible_verses_align_across_translations():
    """The real KJV / Reina-Valera modules from Debian, one short book."""
    cache = Path.home() / ".cache" / "momentum_plugins"
    try:
        pairs = _read_bible_pairs(cache, "en", "es", books={"Ruth"})
    except CorpusUnavailable as err:
        pytest.fail(f"Debian's SWORD modules could not be fetched: {err}")
    assert len(pairs) == 85                                   # Ruth has 85 verses
    book, en, es = pairs[0]
    assert book == "Ruth" and en.startswith("Now it came to pass in the days when the judges ruled")
    assert "jueces" in es

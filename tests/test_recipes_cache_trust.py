"""What the recipe cache protects against (issue 28): an unlisted file in an artefact is an error,
symlinked artefact or checkpoint folders are refused, `verify` catches a file replaced together with
its manifest digest, which plain reuse (honestly) does not."""
import json

import pytest

from recipes.common import cache
from recipes.common.cache import MANIFEST, CacheError, build_once, file_digest
from recipes.common.fairseq_runs import checkpoint_dir


def _writer(calls):
    def build(out):
        calls.append(out)
        (out / "train.bin").write_bytes(b"genuine")
        (out / "train.idx").write_bytes(b"index")
    return build


def test_an_unlisted_file_in_a_cached_artefact_is_an_error(tmp_path):
    calls = []
    folder = build_once(tmp_path, "data-bin", {"a": 1}, _writer(calls), log=lambda _: None)
    (folder / "train1.bin").write_bytes(b"planted")
    (folder / "train1.idx").write_bytes(b"planted")
    with pytest.raises(CacheError, match=r"train1\.bin, train1\.idx"):
        build_once(tmp_path, "data-bin", {"a": 1}, _writer(calls), log=lambda _: None)
    assert len(calls) == 1


def _rewrite_with_digest(folder):
    (folder / "train.bin").write_bytes(b"poisoned")
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["files"]["train.bin"] = file_digest(folder / "train.bin", full=True)
    (folder / MANIFEST).write_text(json.dumps(manifest))


def test_a_file_replaced_with_its_digest_is_reused_the_documented_limit(tmp_path):
    calls = []
    folder = build_once(tmp_path, "data-bin", {"a": 1}, _writer(calls), log=lambda _: None)
    _rewrite_with_digest(folder)
    assert build_once(tmp_path, "data-bin", {"a": 1}, _writer(calls), log=lambda _: None) == folder
    assert (folder / "train.bin").read_bytes() == b"poisoned" and len(calls) == 1


def test_verify_rebuilds_from_the_source_and_names_the_replaced_file(tmp_path, monkeypatch):
    calls = []
    folder = build_once(tmp_path, "data-bin", {"a": 1}, _writer(calls), log=lambda _: None)
    assert build_once(tmp_path, "data-bin", {"a": 1}, _writer(calls), verify=True) == folder
    _rewrite_with_digest(folder)
    monkeypatch.setattr(cache, "VERIFY", True)
    with pytest.raises(CacheError, match=r"rebuild from its source in train\.bin;"):
        build_once(tmp_path, "data-bin", {"a": 1}, _writer(calls), log=lambda _: None)
    assert len(calls) == 3 and not list(tmp_path.glob(".data-bin-*.tmp-*"))


def test_a_symlinked_artefact_folder_is_refused(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    root = tmp_path / "cache"
    root.mkdir()
    folder = cache.keyed_dir(root, "data-bin", {"a": 1})
    folder.symlink_to(outside, target_is_directory=True)
    with pytest.raises(CacheError, match="symbolic link"):
        build_once(root, "data-bin", {"a": 1}, _writer([]), log=lambda _: None)
    assert list(outside.iterdir()) == []


def test_a_checkpoint_folder_or_its_parent_linked_out_of_the_cache_is_refused(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    (out / "checkpoints").symlink_to(outside, target_is_directory=True)
    with pytest.raises(CacheError, match="symbolic link"):
        checkpoint_dir(out / "checkpoints", "lm", tmp_path / "data-bin-x", ["--lr", "1"])
    (out / "checkpoints").unlink()
    (out / "checkpoints").mkdir()
    folder = checkpoint_dir(out / "checkpoints", "lm", tmp_path / "data-bin-x", ["--lr", "1"])
    folder.symlink_to(outside, target_is_directory=True)
    with pytest.raises(CacheError, match="symbolic link"):
        checkpoint_dir(out / "checkpoints", "lm", tmp_path / "data-bin-x", ["--lr", "1"])
    folder.unlink()
    assert checkpoint_dir(out / "checkpoints", "lm", tmp_path / "data-bin-x", ["--lr", "1"]) == folder

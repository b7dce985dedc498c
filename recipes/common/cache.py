"""Cached artefacts (text, sentencepiece models, data-bins, checkpoints) keyed by what produced them.

Each artefact lives in a folder named `<stem>-<key>`, where the key is a hash of the arguments
that produced it and of the content of its input files, and holds a `manifest.json` written
only after the artefact is complete. A folder is reused only when its manifest records exactly
the same arguments and inputs; anything else (other arguments, changed inputs, an interrupted
build) is rebuilt from scratch. Changing the corpus, a token budget or the BPE size therefore
gives a new folder instead of silently reusing the old one.
"""
import hashlib
import json
import shutil
from pathlib import Path
from typing import Callable, Dict, Iterable, Mapping

MANIFEST = "manifest.json"


def file_digest(path: Path) -> str:
    """sha256 of a file's bytes (first 16 hex digits)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


def inputs_digest(paths: Iterable[Path]) -> Dict[str, str]:
    """{file name: digest} for the input files of an artefact, so their content is part of its key."""
    return {Path(p).name: file_digest(Path(p)) for p in paths}


def key(params: Mapping) -> str:
    """Short stable hash of JSON-serialisable arguments."""
    text = json.dumps(params, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def keyed_dir(parent: Path, stem: str, params: Mapping) -> Path:
    return Path(parent) / f"{stem}-{key(params)}"


def read_manifest(folder: Path):
    try:
        return json.loads((Path(folder) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def is_complete(folder: Path, params: Mapping) -> bool:
    manifest = read_manifest(folder)
    return manifest is not None and manifest.get("params") == json.loads(json.dumps(params, default=str))


def build_once(parent: Path, stem: str, params: Mapping, build: Callable[[Path], None], log=None) -> Path:
    """The folder `<parent>/<stem>-<key(params)>`, built by `build(folder)` unless a complete
    build with the same params is already there (then it is reused and `log` says so)."""
    folder = keyed_dir(parent, stem, params)
    if is_complete(folder, params):
        if log is not None:
            log(f"reusing {folder} (same arguments and inputs)")
        return folder
    fresh_dir(folder)
    build(folder)
    (folder / MANIFEST).write_text(json.dumps({"params": params}, indent=2, sort_keys=True, default=str))
    return folder


def fresh_dir(folder: Path) -> Path:
    """An empty folder (whatever was there is removed)."""
    folder = Path(folder)
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    return folder

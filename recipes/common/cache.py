"""Cached artefacts (text, sentencepiece models, data-bins, checkpoints) keyed by what produced them.

Each artefact lives in a folder named `<stem>-<key>`, where the key is a hash of the arguments
that produced it and of the content of its input files, and holds a `manifest.json` with those
arguments and the sha256 of every file the build wrote. A folder is reused only when its
manifest records exactly the same arguments and every file still has its recorded digest;
anything else (other arguments, changed inputs, an output edited or truncated since) is rebuilt
from scratch, and a changed output is named in the log. Changing the corpus, a token budget or
the BPE size therefore gives a new folder instead of silently reusing the old one.

Builds are atomic and run once: `build_once` takes a file lock per artefact (`filelock`, an
flock the kernel releases when its holder dies, even by SIGKILL), builds into a fresh temporary
folder beside the target, writes the manifest there and renames the folder into place (a rename
within one filesystem is atomic). A second process asking for the same artefact waits on the lock
and then reuses the result; a reader never sees a half-written folder; and a build killed at any
point leaves only a temporary folder, which the next build of that artefact deletes under the
lock (no process can still own it). Child processes of a build die with it
(recipes/common/children.py).

What this protects against: accidents and concurrency (an edited, truncated or added file, a
changed input, two processes building at once, a build killed midway). Every file of an artefact
is listed with its digest, and a file the manifest does not list (a `train1.bin` that fairseq-train
would silently combine with `train.bin`) stops the run. An artefact folder that is a symlink, or
whose path leaves its cache root through a symlink, is refused. It is no defence against someone
who can write the cache folder: such a writer can replace a file and rewrite its digest in
`manifest.json`, and the run will reuse it. `verify=True` (the recipes' `--verify`) rebuilds a
reused artefact from its source (the corpus and the inputs) and compares every digest, which
catches that too, at the cost of the build.
"""
import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Callable, Dict, Iterable, Mapping, Optional

from filelock import FileLock, Timeout

MANIFEST = "manifest.json"
VERIFY = False      # the default of build_once's `verify`; the recipes' --verify sets it


class CacheError(RuntimeError):
    """A cached artefact that cannot be trusted to be what its manifest says."""


def check_inside(folder: Path, root: Path) -> None:
    """Refuse `folder` if it is a symlink or if its path below `root` passes through one (new files
    would be written wherever the link points)."""
    folder, root = Path(folder), Path(root)
    expected = root.resolve() / folder.relative_to(root)
    if folder.is_symlink() or (folder.exists() and folder.resolve() != expected) or (
            folder.parent.exists() and folder.parent.resolve() != expected.parent):
        raise CacheError(f"refusing cache folder {folder}: it or a folder above it below {root} is a "
                         f"symbolic link (it resolves to {folder.resolve()}); remove the link and run again")


def file_digest(path: Path, full: bool = False) -> str:
    """sha256 of a file's bytes (its first 16 hex digits, or all 64 with `full`)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest() if full else h.hexdigest()[:16]


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


def _output_digests(folder: Path) -> Dict[str, str]:
    """{path relative to the folder: full sha256} of every file of a built artefact (a symlink is
    recorded as one, so it never matches a digest)."""
    return {p.relative_to(folder).as_posix(): "symlink" if p.is_symlink() else file_digest(p, full=True)
            for p in sorted(folder.rglob("*")) if (p.is_file() or p.is_symlink()) and p.name != MANIFEST}


def unlisted_outputs(folder: Path, manifest: Mapping) -> list:
    """Files of the folder that the manifest does not list."""
    recorded = manifest.get("files") if isinstance(manifest, Mapping) else None
    if not isinstance(recorded, dict) or not Path(folder).is_dir():
        return []
    return sorted(set(_output_digests(Path(folder))) - set(recorded))


def changed_outputs(folder: Path, manifest: Mapping) -> Dict[str, str]:
    """{file: what is wrong} for the listed outputs that differ from the manifest's digests."""
    recorded = manifest.get("files")
    if not isinstance(recorded, dict):
        return {MANIFEST: "records no output digests (written by an older version)"}
    found = _output_digests(folder) if folder.is_dir() else {}
    problems = {name: "is missing" for name in recorded if name not in found}
    problems.update({name: f"has sha256 {found[name][:16]}…, the manifest recorded {digest[:16]}…"
                     for name, digest in recorded.items() if name in found and found[name] != digest})
    return problems


def _same_params(manifest, params: Mapping) -> bool:
    return manifest is not None and manifest.get("params") == json.loads(json.dumps(params, default=str))


def is_complete(folder: Path, params: Mapping) -> bool:
    """The folder holds a finished build with these params whose outputs are unchanged."""
    manifest = read_manifest(folder)
    return _same_params(manifest, params) and not changed_outputs(Path(folder), manifest)


def _reusable(folder: Path, params: Mapping, log: Callable[[str], None]) -> bool:
    manifest = read_manifest(folder)
    if not _same_params(manifest, params):
        return False
    extra = unlisted_outputs(folder, manifest)
    if extra:
        raise CacheError(f"{folder} holds files its manifest does not list: {', '.join(extra)}. A tool may "
                         "read them as part of the artefact (fairseq-train combines train1.bin with "
                         "train.bin); remove them, or delete the folder to rebuild it")
    problems = changed_outputs(folder, manifest)
    for name, problem in problems.items():
        log(f"rebuilding {folder}: {folder / name} {problem}")
    return not problems


def _temporaries(folder: Path):
    """Temporary folders of builds of this artefact (ours or of a killed process)."""
    return [p for kind in ("tmp", "old") for p in folder.parent.glob(f".{folder.name}.{kind}-*")]


def _new_temporary(folder: Path, kind: str) -> Path:
    """An empty `.<name>.<kind>-<pid>-<random>` beside `folder`, made with the usual permissions
    (tempfile.mkdtemp's 0700 would stay on the renamed artefact)."""
    path = folder.parent / f".{folder.name}.{kind}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    return path


def _put_in_place(built: Path, folder: Path) -> None:
    """Rename `built` to `folder`. A directory cannot be renamed over a non-empty one, so an
    outdated folder is first renamed aside: a reader sees the old folder, none, or the new one."""
    if folder.exists():
        aside = _new_temporary(folder, "old")
        os.replace(folder, aside / folder.name)
        os.replace(built, folder)
        shutil.rmtree(aside, ignore_errors=True)
    else:
        os.replace(built, folder)


def _lock(folder: Path, log: Callable[[str], None]) -> FileLock:
    lock = FileLock(str(folder.parent / f".{folder.name}.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        log(f"waiting for another process building {folder}")
        lock.acquire()
    return lock


def _verify(folder: Path, build: Callable[[Path], None]) -> None:
    """Rebuild into a temporary folder and compare every digest with the reused folder's."""
    work = _new_temporary(folder, "tmp")
    try:
        build(work)
        fresh, cached = _output_digests(work), _output_digests(folder)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    differ = sorted(name for name in set(fresh) | set(cached) if fresh.get(name) != cached.get(name))
    if differ:
        raise CacheError(f"--verify: {folder} differs from a rebuild from its source in {', '.join(differ)}; "
                         "the cache was changed (or the build is not deterministic): delete the folder")


def build_once(parent: Path, stem: str, params: Mapping, build: Callable[[Path], None],
               log: Optional[Callable[[str], None]] = None, verify: Optional[bool] = None) -> Path:
    """The folder `<parent>/<stem>-<key(params)>`, built by `build(folder)` unless a complete,
    unchanged build with the same params is already there (then it is reused and `log` says so;
    with `verify`, default VERIFY, only after a rebuild gave the same files).
    `build` receives a temporary folder beside the target; it must write its outputs there."""
    say = log if log is not None else print       # a rebuild or a wait is always said
    folder = keyed_dir(parent, stem, params)
    folder.parent.mkdir(parents=True, exist_ok=True)
    check_inside(folder, parent)
    lock = _lock(folder, say)
    try:
        if _reusable(folder, params, say):
            if VERIFY if verify is None else verify:
                _verify(folder, build)
                say(f"verified {folder} against a rebuild from its source")
            if log is not None:
                log(f"reusing {folder} (same arguments and inputs)")
            return folder
        for stale in _temporaries(folder):
            shutil.rmtree(stale, ignore_errors=True)
        work = _new_temporary(folder, "tmp")
        try:
            build(work)
            manifest = {"params": params, "files": _output_digests(work)}
            (work / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True, default=str))
            _put_in_place(work, folder)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    finally:
        lock.release()
    return folder


def fresh_dir(folder: Path) -> Path:
    """An empty folder (whatever was there is removed)."""
    folder = Path(folder)
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    return folder

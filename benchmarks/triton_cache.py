"""Carry Triton's compiled kernels from one device call to the next (issue 27 item 7).

A lent GPU machine starts bare, so every call compiles each kernel variant again, inside its
10 minutes (2026-11-28: 13 gpu tests not started, the tests part bound by compiling and tuning).
`pack` writes what a later call needs to load a kernel instead of compiling it, from the device's
own cache: each kernel's metadata and binary with its group file, the compiled launchers (.so)
and the autotuner's timings. The IRs (ttir, ttgir, llir, ptx, source) stay behind: Triton reads a
kernel from its group, which `unpack` rewrites to the files it holds at the new place. The archive
(xz) is cut into parts that fit the device's $OUT (16 MiB a file). Hits are Triton's own: the
key of a kernel (its source, the Triton build, the target, the options) names its folder, so a
stale or foreign entry is never read, only not used. `compiled` counts the kernels and launchers
a call compiled after a stamp: with a carried cache that covers the call, none.

    python3 benchmarks/triton_cache.py pack CACHE_DIR OUT_PREFIX [--part-mib 15] [--max-parts 3]
    python3 benchmarks/triton_cache.py unpack PARTS_DIR_OR_PREFIX CACHE_DIR
    python3 benchmarks/triton_cache.py compiled CACHE_DIR --since STAMP_FILE
    python3 benchmarks/triton_cache.py key [--expect CARRIED_DIR/KEY] [--write OUT/KEY --cache-dir CACHE_DIR]

`key` prints the sha256 of this Triton's own key (triton_key(): its build) and the environment
variables that would change every kernel's key, beside the key a carried cache was built for
(a KEY file, which benchmarks/triton_cache_prebuild.py and the device call write beside the
parts): where they differ, no carried kernel loads.

Standard library only (`key` imports Triton, which the image has): it runs on the device before
anything is installed.
"""
import argparse
import io
import json
import lzma
import re
import sys
import tarfile
from pathlib import Path

IR_SUFFIXES = {".ttir", ".ttgir", ".llir", ".ptx", ".source", ".amdgcn"}
BINARY_SUFFIXES = (".cubin", ".hsaco")
GROUP_PREFIX = "__grp__"


def carried_files(cache_dir: Path) -> dict:
    """{archive name: bytes} of what `pack` keeps: every file but a group's IRs, with each group
    file's child paths made relative to its folder (the folder is the kernel's key)."""
    kept = {}
    for path in sorted(cache_dir.glob("*/*")):
        if not path.is_file() or path.suffix in IR_SUFFIXES:
            continue
        name = f"{path.parent.name}/{path.name}"
        if path.name.startswith(GROUP_PREFIX):
            try:
                children = json.loads(path.read_text())["child_paths"]
            except (ValueError, KeyError):
                continue                 # a group Triton itself would not read
            children = {child: Path(p).name for child, p in children.items()
                        if Path(p).suffix not in IR_SUFFIXES}
            kept[name] = json.dumps({"child_paths": children}).encode()
        else:
            kept[name] = path.read_bytes()
    return kept


def pack(cache_dir, prefix, part_mib: float = 15, max_parts: int = 3) -> list:
    """Write the carried files of `cache_dir` as PREFIX.0 … (an xz tar at a fast preset: a few
    seconds for a thousand kernels); returns the parts' paths. Refuses an archive of more than
    `max_parts` parts, writing none."""
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        for name, data in carried_files(Path(cache_dir)).items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    packed = lzma.compress(archive.getvalue(), preset=1)
    size = int(part_mib * 2**20)
    count = -(-len(packed) // size) or 1
    if count > max_parts:
        raise ValueError(f"the packed cache needs {count} parts of {part_mib} MiB, more than "
                         f"max_parts={max_parts}; nothing written")
    Path(prefix).parent.mkdir(parents=True, exist_ok=True)
    paths = [Path(f"{prefix}.{n}") for n in range(count)]
    for n, path in enumerate(paths):
        path.write_bytes(packed[n * size:(n + 1) * size])
    return paths


def part_paths(source) -> list:
    """The parts PREFIX.0, PREFIX.1, … of `source`: a prefix, or a folder holding one archive's."""
    source = Path(source)
    if source.is_dir():
        found = sorted((p for p in source.iterdir() if re.fullmatch(r".+\.\d+", p.name)),
                       key=lambda p: (p.name.rsplit(".", 1)[0], int(p.name.rsplit(".", 1)[1])))
        prefixes = {p.name.rsplit(".", 1)[0] for p in found}
        if len(prefixes) > 1:
            raise ValueError(f"{source} holds the parts of {len(prefixes)} archives: {sorted(prefixes)}")
        return found
    paths, n = [], 0
    while Path(f"{source}.{n}").exists():
        paths.append(Path(f"{source}.{n}"))
        n += 1
    return paths


def unpack(source, cache_dir) -> int:
    """Extract the parts of `source` into `cache_dir`, each group file pointing at its children
    there; returns the number of kernels (binaries) it holds."""
    paths = part_paths(source)
    if not paths:
        raise FileNotFoundError(f"no parts of a packed Triton cache at {source} (PREFIX.0, PREFIX.1, …)")
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    data = lzma.decompress(b"".join(path.read_bytes() for path in paths))
    kernels = 0
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
        for member in tar.getmembers():
            folder, _, name = member.name.partition("/")
            if not member.isfile() or not folder or "/" in name or folder in (".", ".."):
                raise ValueError(f"unexpected entry in a packed Triton cache: {member.name!r}")
            target = cache_dir / folder / name
            target.parent.mkdir(exist_ok=True)
            content = tar.extractfile(member).read()
            if name.startswith(GROUP_PREFIX):
                children = json.loads(content)["child_paths"]
                content = json.dumps({"child_paths": {child: str(target.parent / file)
                                                      for child, file in children.items()}}).encode()
            target.write_bytes(content)
            kernels += name.endswith(BINARY_SUFFIXES)
    return kernels


def compiled(cache_dir, since) -> dict:
    """Kernels (binaries) and launchers (.so) in `cache_dir` written after the file `since`, and
    the kernels older than it (carried or compiled before)."""
    stamp = Path(since).stat().st_mtime
    counts = {"kernels": 0, "launchers": 0, "older kernels": 0}
    for path in Path(cache_dir).glob("*/*"):
        new = path.stat().st_mtime > stamp
        if path.name.endswith(BINARY_SUFFIXES):
            counts["kernels" if new else "older kernels"] += 1
        elif path.suffix == ".so" and new:
            counts["launchers"] += 1
    return counts


def kernel_count(cache_dir) -> int:
    """The kernels (binaries) in a Triton cache."""
    return sum(1 for path in Path(cache_dir).glob("*/*") if path.name.endswith(BINARY_SUFFIXES))


def own_key() -> dict:
    """This Triton's version, the sha256 of its key (triton_key(): its build) and of its sm_90
    backend's (the ptxas it compiles with, and the target): both are in every kernel's key."""
    import hashlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend
    from triton.runtime.cache import triton_key

    backend = make_backend(GPUTarget("cuda", 90, 32)).hash()
    return {"triton": triton.__version__,
            "triton_key_sha256": hashlib.sha256(triton_key().encode()).hexdigest(),
            "backend_sm90_sha256": hashlib.sha256(backend.encode()).hexdigest()}


def mismatched(built: dict, key: dict) -> list:
    """The fields of a KEY file's `built` that differ from `key` (own_key's form): the Triton build
    and the sm_90 backend, both in every kernel's key; none where its kernels can load under `key`."""
    return [field for field in ("triton_key_sha256", "backend_sm90_sha256") if built.get(field) != key[field]]


def write_key(path, built_by: str, kernels: int, key=None) -> None:
    """The KEY file beside a packed cache: the Triton key its kernels were compiled under (`key`,
    else this Triton's own), by whom, and how many."""
    Path(path).write_text(json.dumps(dict(key or own_key(), built_by=built_by, kernels=kernels)) + "\n")


def key_line(expect=None) -> str:
    """This Triton's version, its key's sha256 and the cache-invalidating environment variables
    set, and whether the key is the one in `expect` (a KEY file)."""
    from triton._C.libtriton import get_cache_invalidating_env_vars

    own = own_key()
    digest = own["triton_key_sha256"]
    line = (f"Triton {own['triton']} key sha256 {digest[:16]}, cache-invalidating variables "
            f"{get_cache_invalidating_env_vars() or 'none'}")
    if expect is not None and Path(expect).is_file():
        built = json.loads(Path(expect).read_text())
        verdict = ("another build or ptxas: none will load" if mismatched(built, own)
                   else "the same build and ptxas: they can load")
        line += f"; the carried kernels were built for {built['triton_key_sha256'][:16]} ({verdict})"
    return line


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("pack")
    p.add_argument("cache_dir")
    p.add_argument("prefix")
    p.add_argument("--part-mib", type=float, default=15)
    p.add_argument("--max-parts", type=int, default=3)
    p = commands.add_parser("unpack")
    p.add_argument("source")
    p.add_argument("cache_dir")
    p = commands.add_parser("compiled")
    p.add_argument("cache_dir")
    p.add_argument("--since", required=True)
    p = commands.add_parser("key")
    p.add_argument("--expect", help="the KEY file of a carried cache built elsewhere")
    p.add_argument("--write", help="write this Triton's KEY file for CACHE_DIR's kernels")
    p.add_argument("--cache-dir", help="the cache whose kernels --write counts")
    args = parser.parse_args(argv)
    if args.command == "pack":
        paths = pack(args.cache_dir, args.prefix, args.part_mib, args.max_parts)
        size = sum(p.stat().st_size for p in paths)
        print(f"packed {args.cache_dir}: {len(paths)} part(s), {size / 2**20:.1f} MiB")
    elif args.command == "unpack":
        print(f"carried Triton cache: {unpack(args.source, args.cache_dir)} kernels into {args.cache_dir}")
    elif args.command == "key":
        print(key_line(args.expect))
        if args.write:
            write_key(args.write, "benchmarks/gpu_call.sh on the device", kernel_count(args.cache_dir or "."))
    else:
        counts = compiled(args.cache_dir, args.since)
        print("{kernels} kernels and {launchers} launchers compiled since {since}; {older kernels} "
              "kernels there before (carried)".format(since=Path(args.since).name, **counts))


if __name__ == "__main__":
    sys.exit(main())

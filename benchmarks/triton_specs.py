"""Which Triton kernel specialisations a process compiles or loads, and which of a device call's
the prebuilt cache lacks (issue 27 item 7: on 2026-12-04 the device compiled 516 kernels that
`make triton-carry` had built none of, and the cache's files do not say which inputs keyed them).

    python benchmarks/triton_specs.py diff DEVICE_LOG PREBUILD_LOG    # what the device used, the build not

`install(path)` sets Triton's JIT hooks (knobs.runtime.jit_cache_hook / jit_post_compile_hook,
called around each kernel a process first needs, whether it then compiles or loads it from the
disk cache) to append one JSON line per specialisation to `path`: the kernel, the hash of its
source (Triton's JITFunction.cache_key: its text, first line number and the globals it reads),
the signature, constants, attributes (divisibility), options, the cache-invalidating environment,
the backend's hash (target and ptxas) and the seconds from hook to hook (a load takes milliseconds
to tenths of a second, a compilation half a second or more). Every field but the seconds is an
input of Triton's cache key (with Triton's own build, which benchmarks/triton_cache.py's KEY
compares), so a specialisation the device used and the build's log lacks is one the build did not
compile, and the field that differs from the build's nearest one says why.

Where: benchmarks/triton_cache_prebuild.py writes its build's log beside the parts (specs.jsonl.gz);
benchmarks/gpu_call.sh sets MOMENTUM_TRITON_SPECS_LOG and puts triton_specs_site/ (a
sitecustomize that calls `install`) on PYTHONPATH, so that every Python process of the call
records, then prints the diff. Standard library only, but `install` (which imports triton)."""
import argparse
import gzip
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

# The fields that key a compiled kernel, in the order the diff names them: a kernel whose source
# hash differs misses whatever else matches.
FIELDS = ("source", "backend", "env", "options", "signature", "attrs", "constants")
# Above this from hook to hook, a kernel compiled rather than loaded: loads took up to 0.26 s on the
# CPU machine under load (1353 of them, 2026-12-04), a compilation 0.5 s for a 3-line kernel.
COMPILED_S = 0.4


def _by_name(jit, entries) -> dict:
    """{argument name (a path into tuples as name.i): value} of Triton's [[path, ...], ...] keys."""
    names = jit.arg_names
    return {".".join([names[path[0]], *map(str, path[1:])]): value for path, value in entries}


def record(fn, compile, seconds: float) -> dict:
    """One specialisation as the log holds it, from the hooks' `fn` and `compile` arguments."""
    from triton._C.libtriton import get_cache_invalidating_env_vars
    spec = json.loads(compile["specialization_data"])
    jit = fn.jit_function
    options = {k: v for k, v in spec["options"].items() if k != "extern_libs"}   # paths, hashed by Triton
    try:
        backend = jit.device_caches[compile["device"]][3].hash()
    except (AttributeError, IndexError, KeyError, TypeError):
        backend = None
    return dict(kernel=spec["name"], source=jit.cache_key, backend=backend,
                env=sorted(get_cache_invalidating_env_vars().items()), options=options,
                signature=spec["signature"],
                attrs=_by_name(jit, zip(spec["attrs_keys"], spec["attrs_vals"])),
                constants=_by_name(jit, zip(spec["constant_keys"], spec["constant_vals"])),
                seconds=round(seconds, 4))


def install(path) -> None:
    """Record every specialisation this process needs into `path` (appended, one write per line, so
    that processes sharing the file do not interleave), keeping any hooks already set."""
    from triton import knobs
    path = os.fspath(path)
    started, failed = {}, []
    before, after = knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook

    def on_miss(**kwargs):
        started[(kwargs["fn"].name, str(kwargs["key"]))] = time.perf_counter()
        return before(**kwargs) if before else None       # a true return skips the compilation

    def on_compiled(**kwargs):
        start = started.pop((kwargs["fn"].name, str(kwargs["key"])), None)
        seconds = time.perf_counter() - start if start is not None else -1.0
        try:
            line = json.dumps(record(kwargs["fn"], kwargs["compile"], seconds), sort_keys=True, default=str)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, (line + "\n").encode())
            finally:
                os.close(fd)
        except Exception as error:  # noqa: BLE001  (a recorder must not fail the launch it watches)
            if not failed:
                failed.append(error)
                print(f"triton_specs: a record failed ({type(error).__name__}: {error})", file=sys.stderr)
        return after(**kwargs) if after else None

    knobs.runtime.jit_cache_hook = on_miss
    knobs.runtime.jit_post_compile_hook = on_compiled


def read(path) -> list:
    """The records of a log, plain or gzipped (a line cut short by a killed process is skipped)."""
    opener = gzip.open if str(path).endswith(".gz") else open
    records = []
    with opener(path, "rt") as lines:
        for line in lines:
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
    return records


def identity(entry: dict) -> str:
    return json.dumps([entry.get(field) for field in ("kernel", *FIELDS)], sort_keys=True)


def unique(records: list) -> list:
    """One record per specialisation (processes record theirs each), the longest-compiling kept."""
    kept = {}
    for entry in records:
        key = identity(entry)
        if key not in kept or entry.get("seconds", 0) > kept[key].get("seconds", 0):
            kept[key] = entry
    return list(kept.values())


def differences(entry: dict, other: dict) -> list:
    """(field, what differs) between two specialisations of one kernel, in FIELDS' order."""
    found = []
    for field in FIELDS:
        mine, theirs = entry.get(field), other.get(field)
        if mine == theirs:
            continue
        if isinstance(mine, dict) and isinstance(theirs, dict):
            names = sorted(set(mine) | set(theirs))
            detail = ", ".join(f"{n} {mine.get(n, '—')} (built: {theirs.get(n, '—')})"
                               for n in names if mine.get(n) != theirs.get(n))
        else:
            detail = f"{str(mine)[:60]} (built: {str(theirs)[:60]})"
        found.append((field, detail))
    return found


def nearest(entry: dict, built: list) -> dict:
    """The built specialisation of the same kernel that differs in the fewest fields, the earliest
    field differing last (a different source outweighs any number of constants)."""
    def distance(other):
        differ = [i for i, field in enumerate(FIELDS) if entry.get(field) != other.get(field)]
        return -min(differ, default=len(FIELDS)), len(differ)
    return min(built, key=distance)


def diff(device: list, built: list) -> dict:
    """What the device's records hold that the build's do not: {"used", "found", "missing":
    [(record, [(field, detail)] or None where the build has no such kernel)], "compiled_found"
    (found, yet compiled on the device: their key differs outside these fields, Triton's own
    build)}."""
    device, built = unique(device), unique(built)
    have = {identity(entry) for entry in built}
    by_kernel = {}
    for entry in built:
        by_kernel.setdefault(entry["kernel"], []).append(entry)
    found, missing = [], []
    for entry in device:
        if identity(entry) in have:
            found.append(entry)
            continue
        same = by_kernel.get(entry["kernel"])
        missing.append((entry, differences(entry, nearest(entry, same)) if same else None))
    return dict(used=len(device), found=len(found), missing=missing,
                compiled_found=sum(1 for entry in found if entry.get("seconds", 0) >= COMPILED_S))


def report(result: dict, limit: int = 25) -> str:
    """The diff in lines: the counts, then each kernel's missing specialisations grouped by what
    differs from the nearest built one."""
    missing = result["missing"]
    lines = [f"specialisations used: {result['used']}; in the build's log: {result['found']} "
             f"({result['compiled_found']} of them compiled here all the same); not in it: {len(missing)}"]
    groups = Counter()
    for entry, fields in missing:
        short = entry["kernel"].rsplit(".", 1)[-1]
        what = "no such kernel built" if fields is None else "; ".join(f"{f}: {d}" for f, d in fields)
        groups[(short, what)] += 1
    for (kernel, what), count in groups.most_common(limit):
        lines.append(f"  {count} × {kernel}: {what[:400]}")
    if len(groups) > limit:
        lines.append(f"  … {len(groups) - limit} more groups")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    compare = sub.add_parser("diff", help="the device's specialisations that the build's log lacks")
    compare.add_argument("device", help="the device call's log (MOMENTUM_TRITON_SPECS_LOG)")
    compare.add_argument("built", help="the build's log (specs.jsonl.gz beside the carried parts)")
    compare.add_argument("--limit", type=int, default=25, help="groups printed")
    args = parser.parse_args(argv)
    for path in (args.device, args.built):
        if not Path(path).is_file():
            print(f"triton_specs diff: no log at {path}", file=sys.stderr)
            return 1
    print(report(diff(read(args.device), read(args.built)), args.limit))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Compile one small kernel (a chunk loop of tensor-core dots, no torch) for sm_90 into a Triton
cache and print, as JSON, the folder its key names, its cubin's sha256 and the Triton key's: run
by the GPU machine's Python and by this machine's with that key (`--key-file`), the two must name
the same folder and write the same cubin (benchmarks/triton_cache_prebuild.py checks it). It also
prints the sha256 of the sm_90 backend's hash (its ptxas and target), which every key holds.

    python benchmarks/triton_key_probe.py CACHE_DIR [--key-file FILE]
    python benchmarks/triton_key_probe.py --print-key      # the Triton key of this Python's Triton

The key is Triton's triton_key(): its version and the sha256 of its Python sources and of
libtriton's bytes, which differ between the cp311 and cp312 builds of one release. `--key-file`
puts the given key in its place (use_key)."""
import argparse
import hashlib
import json
import os
import sys

import triton_cache  # beside this script


def use_key(key: str) -> None:
    """Make Triton's compile and autotuner caches key entries by `key` instead of this Triton's own."""
    import triton.runtime.autotuner as autotuner
    import triton.runtime.cache as cache

    cache.triton_key = autotuner.triton_key = lambda: key


def probe(cache_dir: str) -> dict:
    os.environ["TRITON_CACHE_DIR"] = cache_dir
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    @triton.jit
    def chunk_dots(a, b, c, n, BM: tl.constexpr, BK: tl.constexpr):
        i = tl.program_id(0)
        rows, cols = tl.arange(0, BM), tl.arange(0, BK)
        acc = tl.zeros((BM, BM), dtype=tl.float32)
        for j in range(0, n, BK):
            x = tl.load(a + (i * BM + rows)[:, None] * n + (j + cols)[None, :])
            y = tl.load(b + (j + cols)[:, None] * BM + rows[None, :])
            acc += tl.dot(x, y)
        tl.store(c + (i * BM + rows)[:, None] * BM + rows[None, :], acc)

    aligned = [["tt.divisibility", 16]]
    src = ASTSource(chunk_dots, {"a": "*bf16", "b": "*bf16", "c": "*fp32", "n": "i32", "BM": "constexpr",
                                 "BK": "constexpr"},
                    constexprs={"BM": 64, "BK": 32}, attrs={(0,): aligned, (1,): aligned, (2,): aligned})
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 2})
    folders = sorted(name for name in os.listdir(cache_dir) if not name.startswith("."))
    return dict(triton_cache.own_key(), folders=folders, python=sys.version.split()[0],
                cubin_sha256=hashlib.sha256(kernel.asm["cubin"]).hexdigest())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cache_dir", nargs="?")
    parser.add_argument("--key-file", help="a Triton key to use in place of this Triton's own")
    parser.add_argument("--print-key", action="store_true", help="print this Triton's key and exit")
    args = parser.parse_args(argv)
    if args.print_key:
        from triton.runtime.cache import triton_key
        sys.stdout.write(triton_key())
        return 0
    if args.cache_dir is None:
        parser.error("CACHE_DIR is required unless --print-key")
    if args.key_file:
        with open(args.key_file) as f:
            use_key(f.read())
    print(json.dumps(probe(args.cache_dir)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

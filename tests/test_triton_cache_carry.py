"""benchmarks/triton_cache.py: a kernel compiled for sm_90 into one Triton cache is loaded, not
compiled, from another folder that holds only the packed parts of the first (metadata, binary,
the group rewritten to its new place); the parts come back whole however they are cut."""
import importlib.util
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import triton_cache

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")


COMPILE = r'''
import sys
from triton.backends import backends
if "nvidia" not in backends:
    sys.exit(77)
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


@triton.jit
def scale(x, y, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y + offs, 2.0 * tl.load(x + offs, mask=offs < n), mask=offs < n)


kernel = triton.compile(ASTSource(scale, {"x": "*fp32", "y": "*fp32", "n": "i32", "BLOCK": "constexpr"},
                                  constexprs={"BLOCK": int(sys.argv[1])}), target=GPUTarget("cuda", 90, 32))
assert kernel.asm["cubin"]
'''


def written(cache_dir):
    return {p: p.stat().st_mtime_ns for p in cache_dir.rglob("*") if p.is_file()}


def compile_for_sm90(cache_dir, block=64, where=None):
    """A small kernel's cubin for an H100 (no GPU needed; outside the interpreter, in a process of
    its own) through `cache_dir`; returns the files Triton wrote there (new or rewritten)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(cache_dir)
    before = written(cache_dir)
    script = (where or cache_dir.parent) / "compile_scale.py"   # Triton reads a kernel's source from its file
    script.parent.mkdir(exist_ok=True)
    script.write_text(COMPILE)
    done = subprocess.run([sys.executable, str(script), str(block)], env=env, capture_output=True, text=True,
                          timeout=300)
    if done.returncode == 77:
        pytest.skip("this triton has no NVIDIA backend")
    assert done.returncode == 0, done.stderr[-3000:]
    return {p for p, t in written(cache_dir).items() if before.get(p) != t}


def test_a_packed_cache_is_hit_where_it_is_unpacked(tmp_path):
    first = tmp_path / "cache"
    written = compile_for_sm90(first)
    assert any(p.suffix == ".cubin" for p in written) and any(p.suffix == ".ptx" for p in written)
    parts = triton_cache.pack(first, tmp_path / "out" / "triton-cache.tar.xz")
    second = tmp_path / "elsewhere"
    shutil.rmtree(first)                                      # another machine: only the parts travel
    assert triton_cache.unpack(tmp_path / "out", second) == 1
    carried = {p.suffix for p in second.rglob("*") if p.is_file()}
    assert ".cubin" in carried and not carried & triton_cache.IR_SUFFIXES
    # the call's working tree is elsewhere too: a kernel's key holds its module, not its file's path
    assert compile_for_sm90(second, where=tmp_path / "tree") == set(), "the carried kernel was compiled again"
    assert compile_for_sm90(second, block=128), "a kernel not carried must compile"
    assert len(parts) == 1


def test_triton_misses_a_group_whose_children_are_not_where_it_says(tmp_path):
    """Why `unpack` rewrites each group: copied elsewhere as they are, the files are not read."""
    first = tmp_path / "a"
    compile_for_sm90(first)
    second = tmp_path / "b"
    for path in first.rglob("*"):
        if path.is_file():
            target = second / path.relative_to(first)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(path.read_bytes())
    (first / "gone").mkdir()
    for path in list(first.iterdir()):
        if path.name != "gone":
            path.rename(first / "gone" / path.name)
    assert any(p.suffix == ".cubin" for p in compile_for_sm90(second))


def test_parts_are_cut_at_the_size_and_joined_in_order(tmp_path):
    cache = tmp_path / "cache"
    rng = random.Random(0)
    for k in range(12):
        folder = cache / f"key{k}"
        folder.mkdir(parents=True)
        (folder / "k.cubin").write_bytes(rng.randbytes(40_000))
        (folder / "k.json").write_text(json.dumps({"name": f"k{k}"}))
        (folder / "k.ptx").write_text("ptx" * 1000)
        (folder / "__grp__k.json").write_text(json.dumps({"child_paths": {
            name: str(folder / name) for name in ("k.cubin", "k.json", "k.ptx")}}))
    (cache / "key0" / "__triton_launcher.so").write_bytes(b"\x7fELF" + rng.randbytes(1000))
    parts = triton_cache.pack(cache, tmp_path / "p" / "c.tar.xz", part_mib=0.1, max_parts=10)
    assert len(parts) >= 4 and all(p.stat().st_size <= 0.1 * 2**20 for p in parts)
    out = tmp_path / "out"
    assert triton_cache.unpack(tmp_path / "p" / "c.tar.xz", out) == 12
    for k in range(12):
        assert (out / f"key{k}" / "k.cubin").read_bytes() == (cache / f"key{k}" / "k.cubin").read_bytes()
        group = json.loads((out / f"key{k}" / "__grp__k.json").read_text())["child_paths"]
        assert group == {name: str(out / f"key{k}" / name) for name in ("k.cubin", "k.json")}
        assert not (out / f"key{k}" / "k.ptx").exists()
    launcher = Path("key0", "__triton_launcher.so")
    assert (out / launcher).read_bytes() == (cache / launcher).read_bytes()
    with pytest.raises(ValueError, match="max_parts=2"):
        triton_cache.pack(cache, tmp_path / "q" / "c.tar.xz", part_mib=0.1, max_parts=2)
    assert not list(tmp_path.glob("q/*"))


def test_compiled_counts_what_came_after_the_stamp(tmp_path):
    cache = tmp_path / "cache"
    (cache / "old").mkdir(parents=True)
    (cache / "new").mkdir()
    (cache / "old" / "a.cubin").write_bytes(b"a")
    stamp = tmp_path / "stamp"
    stamp.write_text("")
    os.utime(cache / "old" / "a.cubin", (1, 1))
    (cache / "new" / "b.cubin").write_bytes(b"b")
    (cache / "new" / "__triton_launcher.so").write_bytes(b"c")
    os.utime(stamp, (2, 2))
    assert triton_cache.compiled(cache, stamp) == {"kernels": 1, "launchers": 1, "older kernels": 1}

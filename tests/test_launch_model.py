"""benchmarks/launch_model.py runs as users run it, without TRITON_INTERPRET and without a GPU (the
launch plans of plugins/triton_launch.py ask Triton's driver for a device unless the interpreter is
on), and reports every launch of a forward+backward: programs and bytes, or flops per kept tile."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not any((Path(p) / "triton").is_dir() for p in sys.path if p),
                                reason="triton not installed")


def launch_model(*args):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "launch_model.py"), *args], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_programs_and_bytes_of_each_launch():
    out = launch_model("--shapes", "2-4-4096")
    chunked, fused = (line for line in out.splitlines() if line.startswith("| 2-4-64-4096"))
    for name in ("fwd_h", "merge_splits", "fwd_o", "bwd_dh", "bwd_dv", "bwd_dqk"):
        assert name in chunked
    for name in ("fused_fwd", "fused_bwd_dkv", "fused_bwd_dq"):
        assert name in fused


def test_flops_of_each_launch_at_each_kept_tile():
    """fp32 with exact dots keeps two tiles per chunk kernel (utils.prune_chunk) and, at D 64, one
    that spans the head on the side the kernel's programs own (V for fwd_o and bwd_dv, K for
    bwd_dqk; utils.CHUNK_PRUNERS): all are listed; the smallest repeats the intra-chunk products
    most and models the most flops, the whole-head tile the fewest."""
    out = launch_model("--flops", "--dtype", "fp32", "--shapes", "16-16-1024", "--scans", "chunked")
    rows = {line.split("|")[3].strip(): line.split("|")[4] for line in out.splitlines()
            if line.startswith("| 16-16-64-1024")}
    assert set(rows) == {"fwd_h", "fwd_o", "bwd_dh", "bwd_dv", "bwd_dqk", "fwd+bwd"}
    for kernel, whole in (("fwd_o", "16, 64, 8"), ("bwd_dv", "16, 64, 8"), ("bwd_dqk", "64, 16, 8")):
        tiles = {tile: float(gflop) for gflop, tile in re.findall(r"([\d.]+) at \(([\d, ]+)\)", rows[kernel])}
        assert set(tiles) == {"16, 16, 4", "32, 32, 8", whole}, kernel
        assert tiles["16, 16, 4"] > tiles["32, 32, 8"] > tiles[whole], kernel

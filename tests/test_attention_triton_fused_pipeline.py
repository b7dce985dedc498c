"""The fused kernels walk their chunks in order, one program per SM. For 16-bit inputs the configs the
pruner keeps (fused_chunk_kernels.prune_fused) have Triton's software pipeline copy the next chunk's
tiles into shared memory while the current chunk computes. They are compiled here for sm_90a as
launched, every pointer 16-byte aligned (benchmarks/fused_registers.py, in a process without
TRITON_INTERPRET), with no GPU: the loop must issue its loads ahead, and ptxas must report no spills.
Exact fp32 keeps one stage, because pipelined it spills kilobytes."""
import importlib.util
import json
import subprocess
import sys

import pytest
import torch
from test_triton_launch import ROOT, _compiled_env, _has_nvidia_backend

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")


@pytest.mark.timeout(600)
def test_16_bit_fused_kernels_load_the_next_chunk_ahead_without_spilling(tmp_path):
    if not _has_nvidia_backend():
        pytest.skip("this triton build has no nvidia backend to compile for sm_90")
    script = ROOT / "benchmarks" / "fused_registers.py"
    done = subprocess.run([sys.executable, str(script), "--dtypes", "bf16", "fp16", "--json"],
                          env=_compiled_env(tmp_path), capture_output=True, text=True, timeout=560)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    for dtype in ("bf16", "fp16"):
        for momentum in (0, 1):
            kernels = {row["kernel"] for row in rows
                       if row["dtype"] == dtype and row["constants"]["MOMENTUM"] == momentum}
            assert kernels == {"fused_fwd", "fused_bwd_dkv", "fused_bwd_dq"}, (dtype, momentum)
    for row in rows:
        assert row["prefetched"] > 0, row
        assert (row["spill_stores"], row["spill_loads"]) == (0, 0), row


def test_only_16_bit_inputs_take_the_pipelined_configs(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)       # the GPU's config list
    from plugins.attention.triton import fused_chunk_kernels as FK
    constants = dict(DK=64, DV=64, BV=64)
    for tile_v in (True, False):
        configs = FK.fused_configs(tile_v)
        for dtype, stages in ((torch.bfloat16, FK.PIPELINE_STAGES), (torch.float16, FK.PIPELINE_STAGES),
                              (torch.float32, 1)):
            kept = FK.prune_fused(configs, {"q": torch.empty(0, dtype=dtype)}, **constants)
            assert kept and {c.num_stages for c in kept} == {stages}, (tile_v, dtype)
            assert len(kept) == len(configs) // 2         # the same tiles and warps at either dtype
    assert FK.PIPELINE_STAGES > 1

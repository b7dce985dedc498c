"""The fused kernels walk their chunks in order, one program per SM. For 16-bit inputs the configs the
pruner keeps (fused_chunk_kernels.prune_fused) have Triton's software pipeline copy the next chunk's
tiles into shared memory while the current chunk computes. They are compiled here for sm_90a as
launched, every pointer 16-byte aligned (benchmarks/fused_registers.py), with no GPU: the loop must
issue its loads ahead, and ptxas must report no spills. Exact fp32 keeps one stage, because
pipelined it spills kilobytes."""
import importlib.util

import pytest
import torch

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")


@pytest.fixture
def compiled_for_gpu(monkeypatch):
    """The GPU's config lists: TRITON_INTERPRET off while the configs are built and pruned."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_16_bit_fused_kernels_load_the_next_chunk_ahead_without_spilling(compiled_for_gpu, dtype):
    from triton_standin import registers_and_spills

    from benchmarks.fused_registers import kept_kernels, prefetched_loads
    kernels = list(kept_kernels(dtype, momentum=True))
    assert {name for name, *_ in kernels} == {"fused_fwd", "fused_bwd_dkv", "fused_bwd_dq"}
    for name, config, stages, compiled in kernels:
        assert prefetched_loads(compiled) > 0, (name, config)
        assert registers_and_spills(compiled)[1:] == (0, 0), (name, config)


def test_only_16_bit_inputs_take_the_pipelined_configs(compiled_for_gpu):
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

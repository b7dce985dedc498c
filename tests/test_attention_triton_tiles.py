"""The chunked kernels on grids of several state tiles per head, against the float64 references.

Under the interpreter the autotuner keeps the one config whose tiles cover the head dimensions
(utils._prune), so the other exactness tests run one (BK, BV) tile per state. On a GPU the kept
configs cut a head of 64 into tiles of 32, and a head of 128 always (utils.block caps tiles at 64):
there the programs of later tiles (i_k, i_v > 0) mask their columns, leave Z and dden to the first
tile's programs, and the per-chunk kernels sum over the other dimension's tiles. Here every chunk
kernel (fwd_h, fwd_o, bwd_dh, bwd_dv, bwd_dqk) is held to tiles smaller than the head, with the
last tile of each dimension partial (Dk 40, Dv 36), and the results must still be the float64
references': a padded batch from an initial state, the scans in splits (whose merge then also
runs on several tiles), and packed segments. Likewise the fused forward's SPLIT_V config, which
the GPU's autotuner may keep where Dv > 32 (two programs per head, each half the values)."""
import importlib.util

import pytest
import torch
import triton
from helpers.triton_attention import SCANS, check_padded_batch, force_splits, triton_ops, use_scan
from helpers.triton_varlen import check_packed_segments

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")

CHUNK_KERNELS = ["fwd_h", "fwd_o", "bwd_dh", "bwd_dv", "bwd_dqk"]
DK, DV = 40, 36


@pytest.fixture
def hold_tiles(monkeypatch):
    """hold_tiles(BK, BV): every chunk kernel's autotuner keeps only that tile (a fresh tuning
    cache, restored afterwards); returns a check that each kernel launched ran with it."""
    from plugins.attention.triton import chunk_kernels

    def hold(bk, bv):
        tuners = {name: getattr(chunk_kernels, name) for name in CHUNK_KERNELS}
        for tuner in tuners.values():
            monkeypatch.setattr(tuner, "early_config_prune", lambda configs, named_args, **kw: [
                c for c in configs if (c.kwargs["BK"], c.kwargs["BV"]) == (bk, bv)][:1])
            monkeypatch.setattr(tuner, "cache", {})
            monkeypatch.setattr(tuner, "best_config", None, raising=False)

        def ran(*names):
            for name in names:
                best = tuners[name].best_config
                assert best is not None, f"{name} did not run"
                assert (best.kwargs["BK"], best.kwargs["BV"]) == (bk, bv), name
        return ran
    return hold


@pytest.mark.parametrize("bk,bv,beta", [(16, 16, 0.9), (32, 16, 0.0), (16, 32, 0.99)])
def test_padded_batch_on_several_tiles(make_generator, monkeypatch, hold_tiles, bk, bv, beta):
    use_scan(monkeypatch, "chunked")
    ran = hold_tiles(bk, bv)
    check_padded_batch(triton_ops(), make_generator(), B=2, H=1, N=45, Dk=DK, Dv=DV,
                       lengths=torch.tensor([45, 19]), chunk=16, beta=beta, gamma=0.7)
    ran(*CHUNK_KERNELS)


@pytest.mark.parametrize("scan", SCANS)
def test_split_scans_on_several_tiles(make_generator, monkeypatch, hold_tiles, scan):
    """Splits of two chunks: the scans start each split from zero on every tile and the per-chunk
    kernels (or the fused ones, which hold whole states) add the merged edge states."""
    use_scan(monkeypatch, scan)
    force_splits(monkeypatch, 2)
    ran = hold_tiles(16, 16)
    check_padded_batch(triton_ops(), make_generator(), B=2, H=1, N=80, Dk=DK, Dv=DV,
                       lengths=torch.tensor([80, 37]), chunk=16, beta=0.8, gamma=1.0)
    ran(*(CHUNK_KERNELS if scan == "chunked" else ["fwd_h", "bwd_dh"]))


def test_packed_segments_on_several_tiles(make_generator, monkeypatch, hold_tiles):
    use_scan(monkeypatch, "chunked")
    ran = hold_tiles(16, 16)
    check_packed_segments(triton_ops(), make_generator(), lengths=[9, 0, 23, 1, 18], H=1, Dk=DK, Dv=DV,
                          chunk=16, beta=0.6, gamma=0.8, init=True)
    ran(*CHUNK_KERNELS)


@pytest.mark.parametrize("cps", [None, 2])
def test_fused_forward_on_half_the_values_per_program(make_generator, monkeypatch, cps):
    """fused_fwd held to SPLIT_V (the interpreter's autotuner has no such config): the second
    program's half of the Dv block is partial (36 of 64 values); with splits too."""
    from plugins.attention.triton import fused_chunk_kernels
    use_scan(monkeypatch, "fused")
    if cps:
        force_splits(monkeypatch, cps)
    tuner = fused_chunk_kernels.fused_fwd
    monkeypatch.setattr(tuner, "configs", [triton.Config({"SPLIT_V": True}, num_warps=4)])
    monkeypatch.setattr(tuner, "cache", {})
    monkeypatch.setattr(tuner, "best_config", None, raising=False)
    check_padded_batch(triton_ops(), make_generator(), B=2, H=1, N=70, Dk=DK, Dv=DV,
                       lengths=torch.tensor([70, 29]), chunk=16, beta=0.9, gamma=0.8)
    assert tuner.best_config is not None and tuner.best_config.kwargs["SPLIT_V"]

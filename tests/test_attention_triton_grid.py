"""Occupancy of the Triton attention kernels on an H100 (132 SMs), without a GPU: the launchers
of plugins/attention/triton/chunk.py run on meta tensors with every kernel replaced by a recorder
of its grid, and each autotuned grid is evaluated at every tile config the GPU's pruner keeps
(the autotuner may pick any of them). Where the state scans are split (rows fewer than the SMs,
of at least split.LONG_ROW chunks: split.scan_splits), every launch whose work grows with the
sequence must give each SM two programs; a pass that only combines the splits' states (`merge` in
its name) is exempt (issue 27, acceptance). The split scans once: the per-chunk kernels add the
splits' edge states. At B16-H16-T1k (256 rows, 1.9 per SM) the scans run in one pass, over tiles
that give each SM two programs (utils.prune_scan): a split would add three launches per forward
and backward for scans that took a fifth of the device time there (split.py). The fused kernels
(chunk.SCAN = "fused", opt-in) follow the same split rule; their programs are whole rows (no tiles),
so at B16-H16-T1k they launch 256, one per SM at a time (split.py: splitting would not shorten
their critical path): one launch per pass, after a scan from zero per split where split."""
import importlib.util
import math

import pytest
import torch
from helpers.triton_grid import Recorder, programs, record_launches

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")

H100_PROGRAMS = 2 * 132
SPLIT_SHAPES = [(1, 8, 32768), (1, 16, 16384), (4, 16, 4096), (1, 4, 65536), (2, 2, 131072)]
ONE_PASS_SHAPES = [(16, 16, 1024), (32, 16, 256), (8, 16, 1024), (1, 16, 1984)]
FILLED_ONE_PASS_SHAPES = [(16, 16, 1024), (32, 16, 256), (8, 16, 1024)]
ONE_PASS = ["fwd_h", "fwd_o", "fwd_h", "bwd_dh", "bwd_dv", "bwd_dqk"]
SPLIT = ["fwd_h", "merge_splits", "fwd_o", "fwd_h", "merge_splits", "bwd_dh", "merge_splits", "bwd_dv",
         "bwd_dqk"]
FUSED_ONE_PASS = ["fused_fwd", "fused_bwd_dkv", "fused_bwd_dq"]
FUSED_SPLIT = ["fwd_h", "fused_fwd", "bwd_dh", "fused_bwd_dkv", "fused_bwd_dq"]


@pytest.mark.parametrize("B,H,T", SPLIT_SHAPES)
def test_every_sequence_sized_launch_gives_each_h100_sm_two_programs(monkeypatch, B, H, T):
    launches, forward, first = record_launches(monkeypatch, B, H, T)
    assert [name for name, _, _ in launches] == SPLIT, "one scan per split, no second scan"
    assert forward == 3
    per_chunk = ("fwd_o", "bwd_dv", "bwd_dqk")
    assert [constants["SPLIT"] for name, _, constants in launches if name in per_chunk] == [True] * 3
    for name, grid, constants in launches:
        if "merge" in name or "combine" in name:
            continue
        fewest = programs(name, grid, constants, first, monkeypatch)
        assert fewest >= H100_PROGRAMS, f"{name} at B{B}-H{H}-T{T}: {fewest} programs"


@pytest.mark.parametrize("B,H,T", ONE_PASS_SHAPES)
def test_many_or_short_rows_scan_in_one_pass(monkeypatch, B, H, T):
    launches, forward, _ = record_launches(monkeypatch, B, H, T)
    assert [name for name, _, _ in launches] == ONE_PASS
    assert forward == 2


@pytest.mark.parametrize("B,H,T", FILLED_ONE_PASS_SHAPES)
def test_one_pass_launches_give_each_h100_sm_two_programs(monkeypatch, B, H, T):
    """From 66 rows on (D 64: 4 tiles of 32 × 32 per row), the one-pass scans' kept tiles give
    each SM two programs, as the per-chunk kernels' do; under that, the rows are split or short."""
    launches, _, first = record_launches(monkeypatch, B, H, T)
    for name, grid, constants in launches:
        fewest = programs(name, grid, constants, first, monkeypatch)
        assert fewest >= H100_PROGRAMS, f"{name} at B{B}-H{H}-T{T}: {fewest} programs"


@pytest.mark.parametrize("B,H,T", SPLIT_SHAPES + [(8, 16, 1024), (1, 16, 1984)])
def test_fused_split_launches_give_each_h100_sm_two_programs(monkeypatch, B, H, T):
    """Fused: a scan from zero per split (no per-chunk state stored), then one launch per pass,
    each chaining the splits in-kernel (no merge launch): every launch ≥ 2 programs per SM. The
    fused kernels' chunks are 32 tokens (fused_chunk_kernels.MAX_CHUNK), so rows of 1k tokens hold
    split.LONG_ROW chunks and split where the chunked kernels' rows do not."""
    launches, forward, first = record_launches(monkeypatch, B, H, T, scan="fused")
    assert [name for name, _, _ in launches] == FUSED_SPLIT
    assert forward == 2
    assert [c["STORE_H"] for name, _, c in launches if name in ("fwd_h", "bwd_dh")] == [False, False]
    assert [c["DDEN_READY"] for name, _, c in launches if name == "fused_bwd_dkv"] == [True]
    for name, grid, constants in launches:
        fewest = programs(name, grid, constants, first, monkeypatch)
        assert fewest >= H100_PROGRAMS, f"{name} at B{B}-H{H}-T{T}: {fewest} programs"


@pytest.mark.parametrize("B,H,T", [(16, 16, 1024), (32, 16, 256), (8, 16, 992)])
def test_fused_one_pass_is_three_launches(monkeypatch, B, H, T):
    launches, forward, _ = record_launches(monkeypatch, B, H, T, scan="fused")
    assert [name for name, _, _ in launches] == FUSED_ONE_PASS
    assert forward == 1
    assert [c["DDEN_READY"] for name, _, c in launches if name == "fused_bwd_dkv"] == [False]


def test_fused_kernels_take_head_dimensions_up_to_64(monkeypatch):
    """Past 64 the fused kernels' whole states would not fit the registers: the chunked ones run."""
    launches, _, _ = record_launches(monkeypatch, 2, 2, 256, D=80, scan="fused")
    assert [name for name, _, _ in launches] == ONE_PASS


@pytest.mark.parametrize("B,H,T", SPLIT_SHAPES + FILLED_ONE_PASS_SHAPES)
def test_a_layers_feature_and_marks_launches_give_each_h100_sm_two_programs(monkeypatch, B, H, T):
    """A decoder layer's feature map and NaN marks (feature_marks: q, k and v in one launch each
    way, then the causal marks) on heads transposed out of (B, N, H, D): every launch a program per
    tile of its rows, so at least two per SM where the attention's own launches have them. The
    causal marks once scanned each row in one program: 8 programs at B1-H8-T32768, which took as
    long as the attention's kernels on an H200 (docs/benchmarks.md, 2026-11-28)."""
    from plugins.attention.triton import feature_marks
    launches = []

    def recorder(kernel):
        fn = kernel
        while hasattr(fn, "fn"):
            fn = fn.fn
        return Recorder(fn.__name__, kernel, launches, [])
    monkeypatch.setattr(feature_marks, "direct", recorder)
    meta = dict(dtype=torch.bfloat16, device=torch.device("meta"))
    q, k, v = (torch.empty(B, T, H, 64, **meta).transpose(1, 2) for _ in range(3))
    *_, first = feature_marks.forward(q, k, v, 1)
    feature_marks.backward(q, k, v, [torch.empty(B, H, T, 64, **meta)] * 3, 1)
    feature_marks.marked_output(torch.empty(B, H, T, 64, **meta), torch.empty(B, H, T, 1, **meta), first)
    assert [name for name, _, _ in launches] == ["finite_features_fwd", "finite_features_bwd",
                                                 "mark_causal_kernel"]
    for name, grid, _ in launches:
        assert math.prod(grid) >= H100_PROGRAMS, f"{name} at B{B}-H{H}-T{T}: {grid}"


SCANS_AND_CHUNKS = {"fwd_h": "scan", "bwd_dh": "scan", "fwd_o": "chunk", "bwd_dv": "chunk",
                    "bwd_dqk": "chunk"}


@pytest.mark.parametrize("dots,runs,dtype,matmuls,scan_ieee,chunk_ieee", [
    ("auto", True, torch.float32, "highest", True, 2),
    ("auto", False, torch.float32, "highest", True, True),
    ("ieee", True, torch.float32, "highest", True, True),
    ("bf16x6", True, torch.float32, "highest", 2, 2),
    ("auto", True, torch.float32, "high", False, False),
    ("auto", True, torch.float64, "highest", True, True),
    ("auto", True, torch.bfloat16, "highest", False, False)])
def test_exact_fp32_dots_of_each_kernel(monkeypatch, dots, runs, dtype, matmuls, scan_ieee, chunk_ieee):
    """MOMENTUM_TRITON_FP32_DOTS: "auto" (the default) gives the per-chunk kernels of exact fp32 six
    bf16 products (IEEE = 2, utils.BF16X6) where the device's Triton has them, and the state scans
    FMA dots (IEEE = True); "ieee" and "bf16x6" one kind in every kernel; tf32 matmuls, fp64 and
    bf16 keep their own rules. The fused kernels keep the scans' dots under "auto"."""
    from plugins.attention.triton import utils
    monkeypatch.setenv(utils.FP32_DOTS_VARIABLE, dots)
    monkeypatch.setattr(utils, "bf16x6_dots_run", lambda device: runs)
    precision = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision(matmuls)
        with monkeypatch.context() as patched:
            launches, _, _ = record_launches(patched, 2, 2, 256, dtype=dtype)
        fused, _, _ = record_launches(monkeypatch, 2, 2, 256, dtype=dtype, scan="fused")
    finally:
        torch.set_float32_matmul_precision(precision)
    expected = {"scan": scan_ieee, "chunk": chunk_ieee}
    got = [(name, constants["IEEE"]) for name, _, constants in launches]
    assert got == [(name, expected[SCANS_AND_CHUNKS[name]]) for name, _, _ in launches]
    assert all(type(ieee) is type(expected[SCANS_AND_CHUNKS[name]]) for name, ieee in got)
    assert {constants["IEEE"] for _, _, constants in fused} == {scan_ieee}


@pytest.mark.parametrize("backend,arch,offered,runs", [
    ("cuda", 90, True, True), ("cuda", 80, True, True), ("cuda", 75, True, False),
    ("hip", "gfx942", True, False), ("cuda", 90, False, False)])
def test_bf16x6_dots_run_on_nvidia_gpus_from_sm80(monkeypatch, backend, arch, offered, runs):
    """bf16x6 splits fp32 into bf16 parts for the tensor cores, which NVIDIA GPUs have for bf16 from
    sm_80, where the installed Triton offers it (`offered`); AMD's bf16x6 is untimed, so "auto"
    keeps FMA dots there."""
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import CUDAOptions

    from plugins.attention.triton import utils
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(utils, "INTERPRETED", False)
    monkeypatch.setattr(utils, "current_target", lambda: GPUTarget(backend, arch, 32))
    if not offered:
        monkeypatch.setattr(CUDAOptions, "allowed_dot_input_precisions",
                            tuple(p for p in CUDAOptions.allowed_dot_input_precisions if p != "bf16x6"))
    utils._target_has_bf16x6.cache_clear()
    try:
        assert utils.bf16x6_dots_run(torch.device("cuda", 0)) is runs
    finally:
        utils._target_has_bf16x6.cache_clear()

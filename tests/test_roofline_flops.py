"""benchmarks/roofline.py's flops model of the Triton attention kernels (launch_flops) against the
matrix products the kernels really compute: each launch runs through Triton's interpreter, whose
every tl.dot is counted here (2·m·k·n flops), and the count must equal the model for that launch's
arguments, constants and config. Tiles smaller than the head dimension (forced) make the per-chunk
kernels repeat their intra-chunk products; padded rows, packed segments, splits, β = 0 and the
fused kernels change which chunks are walked."""
import collections
import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from helpers.triton_attention import features, triton_ops

from benchmarks.roofline import launch_flops

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")

CHUNKED = ("fwd_h", "fwd_o", "bwd_dh", "bwd_dv", "bwd_dqk")
FUSED = ("fused_fwd", "fused_bwd_dkv", "fused_bwd_dq")


@pytest.fixture
def counted(monkeypatch):
    """The attention kernels' launches as benchmarks/gpu_kernels.py records them (name, arguments
    by name, constants, the config it ran), and the flops of the tl.dot calls each computed, by
    its place in that list: a dot belongs to the launch running, logged once it returns."""
    import gpu_kernels
    from triton.runtime import interpreter
    log, flops = [], collections.Counter()
    dot = interpreter.InterpreterBuilder.create_dot

    def counting_dot(self, a, b, d, *rest):
        (m, k), n = a.data.shape, b.data.shape[1]
        flops[len(log)] += 2 * m * k * n
        return dot(self, a, b, d, *rest)
    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_dot", counting_dot)
    with gpu_kernels.recorded_launches(log):
        yield log, flops


def run(make_generator, B, H, N, DK, DV, beta=0.6, lengths=None, cu_seqlens=None):
    """A forward and backward of the Triton entry in fp32 (chunk 32) on fresh inputs."""
    tri = triton_ops()
    gen = make_generator()
    fq, fk = (features(gen, B, H, N, DK).float().requires_grad_() for _ in range(2))
    v = torch.randn(B, H, N, DV, generator=gen).requires_grad_()
    out, _ = tri.chunk_momentum_attention(fq, fk, v, momentum=beta, step_size=1.0, eps=1e-6, chunk_size=32,
                                          lengths=lengths, cu_seqlens=cu_seqlens)
    out.backward(torch.randn(out.shape, generator=gen))


def check(counted, expected_kernels):
    log, flops = counted
    assert {name for name, *_ in log} == set(expected_kernels)
    assert set(flops) <= set(range(len(log))), "dots after the last recorded launch"
    for i, (name, args, constants, config) in enumerate(log):
        modelled = launch_flops(name, args, constants, config)
        assert modelled == flops[i], f"{name} {config}: modelled {modelled}, counted {flops[i]}"
    assert sum(flops.values()) > 0


# (BK, BV, warps) forced per chunked kernel: tiles smaller than the blocks of DK 24 (32) and DV 40
# (64) make fwd_o and bwd_dv repeat QKᵀ per V tile and bwd_dqk repeat dNum·Vᵀ per K tile; K and V
# tiles differ in number (2 and 1, 1 and 3, 2 and 3), so that no count stands in for the other.
SMALL_TILES = {"fwd_h": (16, 64, 4), "bwd_dh": (32, 16, 4), "fwd_o": (32, 16, 4), "bwd_dv": (16, 16, 4),
               "bwd_dqk": (16, 64, 4)}


@pytest.mark.parametrize("tiles", ["pruned", "small"])
@pytest.mark.parametrize("beta", [0.6, 0.0])
def test_the_chunked_kernels_compute_the_modelled_flops(counted, make_generator, tiles, beta):
    """A partial last chunk (70 = 2·32 + 6), head sizes that are not tile multiples, with and
    without momentum (M' and its products exist only with it)."""
    import gpu_kernels
    with gpu_kernels.forced_tiles(SMALL_TILES if tiles == "small" else {}):
        run(make_generator, 1, 2, 70, 24, 40, beta=beta)
    check(counted, CHUNKED)
    if tiles == "small":
        assert {(name, config["BK"], config["BV"]) for name, _, _, config in counted[0]} == {
            (name, bk, bv) for name, (bk, bv, _) in SMALL_TILES.items()}


def test_padded_rows_walk_only_their_real_chunks(counted, make_generator):
    """Rows of 70, 33 and 0 real tokens in a batch of 96: the chunks past each row's length are
    stored as zeros, with no product."""
    run(make_generator, 3, 2, 96, 16, 16, lengths=torch.tensor([70, 33, 0]))
    check(counted, CHUNKED)


def test_packed_segments_walk_their_own_chunks(counted, make_generator):
    """Segments of 5, 65, 0 and 30 tokens in one row: each walks cdiv(length, 32) chunks."""
    run(make_generator, 1, 2, 100, 16, 32, cu_seqlens=torch.tensor([0, 5, 70, 70, 100]))
    check(counted, CHUNKED)


@pytest.mark.parametrize("scan", ["chunked", "fused"])
def test_split_scans_and_the_fused_kernels(counted, make_generator, monkeypatch, scan):
    """Scans in splits of 2 chunks (a merge, or the fused kernels' scans from zero that skip the
    last split), and the fused kernels' one program per row or split."""
    import triton

    from plugins.attention.triton import chunk
    monkeypatch.setattr(chunk, "SCAN", scan)
    monkeypatch.setattr(chunk, "scan_splits", lambda rows, chunks, device: (triton.cdiv(chunks, 2), 2))
    run(make_generator, 2, 1, 200, 32, 16, lengths=torch.tensor([200, 90]))
    check(counted, CHUNKED + ("merge_splits",) if scan == "chunked" else FUSED + ("fwd_h", "bwd_dh"))


def test_the_repeats_are_what_small_tiles_cost():
    """The model's own arithmetic at D 64, chunk 64, one chunk: bwd_dqk at 16 × 16 tiles does, beyond
    its work at one K tile, exactly three more dNum·Vᵀ (2·64·64·64 flops each); fwd_o at 16-wide V
    tiles three more QKᵀ than at one V tile."""
    args = dict(H=1, N=64, k=torch.empty(1, 64, 64, device="meta"))
    constants = dict(BT=64, DK=64, DV=64, MOMENTUM=True)
    small = launch_flops("bwd_dqk", args, constants, dict(BK=16, BV=16))
    whole_k = launch_flops("bwd_dqk", args, constants, dict(BK=64, BV=16))
    assert small - whole_k == 3 * 2 * 64 ** 3
    fwd_o = [launch_flops("fwd_o", args, constants, dict(BK=16, BV=bv)) for bv in (16, 64)]
    assert fwd_o[0] - fwd_o[1] == 3 * 2 * 64 ** 3

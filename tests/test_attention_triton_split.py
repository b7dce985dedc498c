"""Sequence-split state scans (plugins/attention/triton/split.py): the split counts fill an H100,
and scanning a row in splits, chained by eq. 12's affine composition (merge_splits), gives the
float64 references' outputs, final states and gradients, with padding, packed segments and an
initial state, for the split counts the launcher picks and for forced ones (one pass, a partial
last split, splits past a padded row's end)."""
import importlib.util

import pytest
import torch
import triton
from helpers.triton_attention import SCANS, check_padded_batch, force_splits, triton_ops, use_scan
from helpers.triton_varlen import check_packed_segments

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")

H100_PROGRAMS = 2 * 132


@pytest.mark.parametrize("B,H,T", [(1, 8, 32768), (1, 4, 65536), (1, 1, 32768), (1, 16, 16384), (4, 16, 4096),
                                   (1, 8, 4096)])
def test_splits_give_every_h100_sm_two_programs(B, H, T):
    from plugins.attention.triton.split import scan_splits
    chunks = triton.cdiv(T, 64)
    G, cps = scan_splits(B * H, chunks, torch.device("cpu"))
    assert B * H * G >= H100_PROGRAMS
    assert (G - 1) * cps < chunks <= G * cps, "every split holds a chunk and every chunk is in one"


def test_a_row_per_sm_or_short_rows_keep_one_pass():
    """From one row per SM on (132 on the CPU's stand-in H100), or under LONG_ROW = 32 chunks."""
    from plugins.attention.triton.split import scan_splits
    cpu = torch.device("cpu")
    assert scan_splits(H100_PROGRAMS, 512, cpu) == (1, 512)
    assert scan_splits(8, 1, cpu) == (1, 1)
    for rows, chunks in ((256, 16), (132, 4096), (131, 31), (1, 31)):
        assert scan_splits(rows, chunks, cpu) == (1, chunks), (rows, chunks)
    assert scan_splits(131, 32, cpu)[0] > 1


# (scan, chunks per split, β). One pass is the exactness tests' of test_attention_triton.py. Splits
# of one chunk each (every edge state carried over ℓ = 0 tokens) run the chunked kernels only: the
# fused ones chain G splits in each of G programs, G² loads that cost the interpreter 25 s a test,
# and their chaining is the same at 3 or 4 chunks per split.
SPLIT_CASES = [(scan, cps, beta) for scan in SCANS
               for cps, beta in ((1, 0.9), (3, 0.9), (4, 0.0), ("auto", 0.99)) if (scan, cps) != ("fused", 1)]


@pytest.mark.parametrize("scan,cps,beta", SPLIT_CASES)
def test_split_scans_match_float64_with_padding_and_an_initial_state(make_generator, monkeypatch, scan, cps,
                                                                     beta):
    tri = triton_ops()
    use_scan(monkeypatch, scan)
    if cps != "auto":
        force_splits(monkeypatch, cps)
    # 10 chunks; row 2 ends in chunk 3
    check_padded_batch(tri, make_generator(), B=2, H=2, N=150, Dk=16, Dv=12, lengths=torch.tensor([150, 41]),
                       chunk=16, beta=beta, gamma=0.7)


@pytest.mark.parametrize("scan,cps,init", [("chunked", 2, True), ("chunked", 1, False), ("fused", 2, True),
                                           ("fused", 2, False)])
def test_split_scans_keep_packed_segments_separate(make_generator, monkeypatch, scan, cps, init):
    tri = triton_ops()
    use_scan(monkeypatch, scan)
    force_splits(monkeypatch, cps)
    check_packed_segments(tri, make_generator(), lengths=[5, 0, 37, 1, 50], H=2, Dk=16, Dv=8, chunk=16,
                          beta=0.6, gamma=0.8, init=init)

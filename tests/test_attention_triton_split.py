"""Sequence-split state scans (plugins/attention/triton/split.py): the split counts fill an H100,
and scanning a row in splits, chained by eq. 12's affine composition (merge_splits), gives the
float64 references' outputs, final states and gradients, with padding, packed segments and an
initial state, for the split counts the launcher picks and for forced ones (one pass, a partial
last split, splits past a padded row's end)."""
import importlib.util

import pytest
import torch
import triton
from helpers.triton_attention import (
    SCANS,
    TOL,
    loss_of,
    make_inputs,
    random_state,
    rel_rms,
    triton_ops,
    upstreams,
    use_scan,
)
from helpers.triton_varlen import (
    each_segment_alone,
    offsets,
    packed_inputs,
    run_with_grads,
)
from helpers.triton_varlen import random_state as segment_states

from plugins.attention.naive import naive_recurrent_momentum_attention
from plugins.attention.state import MomentumAttentionState

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


def force_splits(monkeypatch, cps):
    """The launcher's split choice replaced: `cps` chunks per split, None = one pass."""
    from plugins.attention.triton import chunk

    def splits(rows, chunks, device):
        return (1, chunks) if cps is None else (triton.cdiv(chunks, cps), cps)
    monkeypatch.setattr(chunk, "scan_splits", splits)


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
    gen = make_generator()
    B, H, N, Dk, Dv, chunk, gamma = 2, 2, 150, 16, 12, 16, 0.7   # 10 chunks; row 2 ends in chunk 3
    lengths = torch.tensor([N, 41])
    fq, fk, v, real = make_inputs(gen, B, H, N, Dk, Dv, lengths)
    state0 = random_state(gen, B, H, Dk, Dv)
    ups = upstreams(gen, B, H, N, Dk, Dv)

    def run(fn, dtype):
        leaves = [t.to(dtype).requires_grad_() for t in (fq, fk, v, state0.s, state0.z, state0.m)]
        out, state = fn(*leaves[:3], MomentumAttentionState(*leaves[3:]))
        return out, state, torch.autograd.grad(loss_of(out, state, [u.to(dtype) for u in ups]), leaves)

    ref = run(lambda q, k, x, st: naive_recurrent_momentum_attention(
        q, k, x, st, momentum=beta, step_size=gamma, feature_map="identity", padding_mask=real),
        torch.float64)
    got = run(lambda q, k, x, st: tri.chunk_momentum_attention(
        q, k, x, momentum=beta, step_size=gamma, eps=1e-6, chunk_size=chunk, initial_state=st,
        lengths=lengths, return_state=True), torch.float32)
    assert rel_rms(got[0], ref[0]) <= TOL
    for name in ("s", "z", "m"):
        assert rel_rms(getattr(got[1], name), getattr(ref[1], name)) <= TOL, f"state.{name}"
    for name, g, r in zip(["fq", "fk", "v", "s0", "z0", "m0"], got[2], ref[2]):
        assert rel_rms(g, r) <= TOL, f"d{name}: {rel_rms(g, r):.2e}"


@pytest.mark.parametrize("scan,cps,init", [("chunked", 2, True), ("chunked", 1, False), ("fused", 2, True),
                                           ("fused", 2, False)])
def test_split_scans_keep_packed_segments_separate(make_generator, monkeypatch, scan, cps, init):
    tri = triton_ops()
    use_scan(monkeypatch, scan)
    force_splits(monkeypatch, cps)
    gen = make_generator()
    lengths, H, Dk, Dv, beta, gamma = [5, 0, 37, 1, 50], 2, 16, 8, 0.6, 0.8
    cu = offsets(lengths)
    inputs = packed_inputs(gen, H, sum(lengths), Dk, Dv)
    state0 = segment_states(gen, len(lengths), H, Dk, Dv) if init else None
    ups = [torch.randn(1, H, sum(lengths), Dv, generator=gen, dtype=torch.float64),
           torch.randn(len(lengths), H, Dk, Dv, generator=gen, dtype=torch.float64),
           torch.randn(len(lengths), H, Dk, generator=gen, dtype=torch.float64),
           torch.randn(len(lengths), H, Dk, Dv, generator=gen, dtype=torch.float64)]
    ref = run_with_grads(lambda q, k, x, st: each_segment_alone(q, k, x, cu, st, beta, gamma),
                         inputs, state0, ups, torch.float64)
    got = run_with_grads(lambda q, k, x, st: tri.chunk_momentum_attention(
        q, k, x, momentum=beta, step_size=gamma, eps=1e-6, chunk_size=16, initial_state=st,
        cu_seqlens=cu.to(torch.int32), return_state=True), inputs, state0, ups, torch.float32)
    assert rel_rms(got[0], ref[0]) <= TOL
    for name in ("s", "z", "m"):
        assert rel_rms(getattr(got[1], name), getattr(ref[1], name)) <= TOL, f"state.{name}"
    for g, r in zip(got[2], ref[2]):
        assert rel_rms(g, r) <= TOL

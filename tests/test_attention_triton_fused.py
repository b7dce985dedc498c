"""The fused kernels (plugins/attention/triton/fused_chunk_kernels) beside the chunked ones: the
exactness tests of test_attention_triton*.py run both (helpers.triton_attention.SCANS); here, a
backward whose forward ran the other kernels (a forward without split states for the fused
backward, which scans for them again), against the float64 token loop of eq. 12."""
import importlib.util

import pytest
import torch
import triton
from helpers.triton_attention import (
    TOL,
    loss_of,
    make_inputs,
    random_state,
    rel_rms,
    triton_ops,
    upstreams,
    use_scan,
)

from plugins.attention.naive import naive_recurrent_momentum_attention
from plugins.attention.state import MomentumAttentionState

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")


@pytest.mark.parametrize("forward,backward", [("chunked", "fused"), ("fused", "chunked")])
def test_a_backward_after_the_other_kernels_forward_matches_float64(make_generator, monkeypatch, forward,
                                                                     backward):
    tri = triton_ops()
    from plugins.attention.triton import chunk
    monkeypatch.setattr(chunk, "scan_splits", lambda rows, chunks, device: (triton.cdiv(chunks, 2), 2))
    gen = make_generator()
    B, H, N, Dk, Dv, beta, gamma = 2, 2, 90, 16, 12, 0.8, 0.7      # 6 chunks of 16 in 3 splits
    lengths = torch.tensor([N, 37])
    fq, fk, v, real = make_inputs(gen, B, H, N, Dk, Dv, lengths)
    state0 = random_state(gen, B, H, Dk, Dv)
    ups = upstreams(gen, B, H, N, Dk, Dv)

    def run(fn, dtype, before_backward=lambda: None):
        leaves = [t.to(dtype).requires_grad_() for t in (fq, fk, v, state0.s, state0.z, state0.m)]
        out, state = fn(*leaves[:3], MomentumAttentionState(*leaves[3:]))
        before_backward()
        return out, state, torch.autograd.grad(loss_of(out, state, [u.to(dtype) for u in ups]), leaves)

    ref = run(lambda q, k, x, st: naive_recurrent_momentum_attention(
        q, k, x, st, momentum=beta, step_size=gamma, feature_map="identity", padding_mask=real),
        torch.float64)
    use_scan(monkeypatch, forward)
    got = run(lambda q, k, x, st: tri.chunk_momentum_attention(
        q, k, x, momentum=beta, step_size=gamma, eps=1e-6, chunk_size=16, initial_state=st, lengths=lengths,
        return_state=True), torch.float32, lambda: use_scan(monkeypatch, backward))
    assert rel_rms(got[0], ref[0]) <= TOL
    for name, g, r in zip(["fq", "fk", "v", "s0", "z0", "m0"], got[2], ref[2]):
        assert rel_rms(g, r) <= TOL, f"d{name}: {rel_rms(g, r):.2e}"


def test_an_unknown_scan_is_refused(monkeypatch):
    from plugins.attention.triton import chunk
    monkeypatch.setattr(chunk, "SCAN", "fast")
    with pytest.raises(ValueError, match="MOMENTUM_TRITON_SCAN must be one of"):
        chunk.fused_scans(64, 64)


@pytest.mark.parametrize("B,H,N,packed", [(1, 2, 1024, False), (2, 1, 100, False), (1, 2, 1100, True)])
def test_the_ops_fake_split_states_have_the_real_size(monkeypatch, B, H, N, packed):
    """torch.compile allocates the op's outputs from its fake implementation (op.py), which sizes
    the split states with chunk.kept_splits_numel: the launchers' real ones must match, fused or
    chunked, split or not."""
    from helpers.triton_grid import record_launches

    from plugins.attention.triton import chunk
    record_launches(monkeypatch, 1, 1, 64)                  # every kernel replaced by a recorder
    meta = torch.device("meta")
    q, k, v = (torch.empty(B, H, N, 16, device=meta) for _ in range(3))
    cu = torch.tensor([0, 5, 300, N], dtype=torch.int32, device=meta) if packed else None
    for scan in ("chunked", "fused"):
        use_scan(monkeypatch, scan)
        outputs = chunk.chunk_forward(q, k, v, None, None, None, None, cu, 0.9, 1.0, 1e-6, 64)
        assert outputs[5].numel() == chunk.kept_splits_numel(q, v, cu, 64), scan
        if scan == "fused" and N >= 1024:
            assert outputs[5].numel() > 0, "split: the forward keeps its split states"


def test_the_forward_keeps_each_split_state_from_zero_but_the_last(make_generator, monkeypatch):
    """The fused forward's `splits`: fwd_h without STORE_H scans splits 0 … G−2 of each row from
    zero (what the fused programs chain, eq. 12 composed) and skips the last, which no split chains
    (its state stays zero, and its tokens are not read)."""
    tri = triton_ops()
    from plugins.attention.triton import chunk
    from plugins.attention.triton.fused_chunk import split_views
    use_scan(monkeypatch, "fused")
    monkeypatch.setattr(chunk, "scan_splits", lambda rows, chunks, device: (triton.cdiv(chunks, 2), 2))
    gen = make_generator()
    B, H, N, Dk, Dv, beta, gamma = 1, 2, 80, 16, 8, 0.8, 0.7      # 5 chunks of 16: splits of 32, 32, 16
    fq, fk, v, _ = make_inputs(gen, B, H, N, Dk, Dv, torch.tensor([N]))
    assert tri.is_available()
    splits = chunk.chunk_forward(fq.float(), fk.float(), v.float(), None, None, None, None, None, beta, gamma,
                                 1e-6, 16)[5]
    s, m, z = split_views(splits, B * H, 3, Dk, Dv)
    for g in range(2):
        span = slice(32 * g, 32 * g + 32)
        _, ref = naive_recurrent_momentum_attention(fq[:, :, span], fk[:, :, span], v[:, :, span], None,
                                                    momentum=beta, step_size=gamma, feature_map="identity")
        rows = slice(g, None, 3)
        for name, got, want in (("s", s[rows], ref.s[0]), ("m", m[rows], ref.m[0]), ("z", z[rows], ref.z[0])):
            assert rel_rms(got, want) <= TOL, f"split {g}, {name}: {rel_rms(got, want):.2e}"
    assert not s[2::3].any() and not m[2::3].any() and not z[2::3].any(), "the last split is not scanned"

"""Inputs, float64 helpers and error measures shared by the Triton attention tests."""
import pytest
import torch

from plugins.attention.state import MomentumAttentionState

TOL = 1e-4                                   # relative RMS, fp32 kernels vs float64 references
SCANS = ["chunked", "fused"]                 # plugins.attention.triton.chunk.SCANS


def use_scan(monkeypatch, scan):
    """Run the chunked or the fused kernels (chunk.SCAN, which MOMENTUM_TRITON_SCAN sets)."""
    from plugins.attention.triton import chunk
    monkeypatch.setattr(chunk, "SCAN", scan)


def triton_ops():
    from plugins.attention import triton as tri
    if not tri.is_available():
        pytest.skip("Triton kernels need CUDA or TRITON_INTERPRET=1")
    return tri


def rel_rms(got, expected):
    got, expected = got.detach().double(), expected.detach().double()
    return ((got - expected).pow(2).mean().sqrt() / expected.pow(2).mean().sqrt().clamp(min=1e-30)).item()


def features(gen, B, H, N, D, dtype=torch.float64):
    """Positive features as an elu+1 map would give (the kernels take feature-mapped inputs)."""
    return torch.nn.functional.elu(torch.randn(B, H, N, D, generator=gen, dtype=dtype)) + 1


def make_inputs(gen, B, H, N, Dk, Dv, lengths):
    fq, fk = features(gen, B, H, N, Dk), features(gen, B, H, N, Dk)
    v = torch.randn(B, H, N, Dv, generator=gen, dtype=torch.float64)
    real = torch.arange(N)[None, :] < lengths[:, None]
    keep = real[:, None, :, None]
    fq, fk, v = (torch.where(keep, t, torch.zeros(())) for t in (fq, fk, v))   # padded tokens are 0
    return fq, fk, v, real


def random_state(gen, B, H, Dk, Dv):
    return MomentumAttentionState(s=torch.randn(B, H, Dk, Dv, generator=gen, dtype=torch.float64),
                                  z=torch.rand(B, H, Dk, generator=gen, dtype=torch.float64) * 3,
                                  m=torch.randn(B, H, Dk, Dv, generator=gen, dtype=torch.float64))


def upstreams(gen, B, H, N, Dk, Dv):
    """Random float64 gradients of a loss (loss_of) w.r.t. the output and the final s, z, m."""
    return [torch.randn(B, H, N, Dv, generator=gen, dtype=torch.float64),
            torch.randn(B, H, Dk, Dv, generator=gen, dtype=torch.float64),
            torch.randn(B, H, Dk, generator=gen, dtype=torch.float64),
            torch.randn(B, H, Dk, Dv, generator=gen, dtype=torch.float64)]


def loss_of(out, state, ups):
    loss = (out * ups[0]).sum()
    if state is not None:
        loss = loss + (state.s * ups[1]).sum() + (state.z * ups[2]).sum() + (state.m * ups[3]).sum()
    return loss
